"""A budget's desired status, built from what its evaluation decided: conditions
(``budget_status``), usage, the violations (open first, then pending) and the
warnings, each list bounded (docs/engine.md, "Budget status")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from vramguard_api import conditions as C
from vramguard_api.budget import (
    LEAK_MEMORY,
    Action,
    BudgetUsage,
    GPUMemoryBudget,
    GPUMemoryBudgetStatus,
    LimitWarning,
    Mode,
    Violation,
)
from vramguard_api.units import format_bytes
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.engine import messages
from vramguard_operator.engine.inputs import QuietPods
from vramguard_operator.engine.keys import ViolationKey
from vramguard_operator.engine.measure import Measure, PodData
from vramguard_operator.engine.records import ViolationRecord, step_rank

NO_QUIET = QuietPods()
NextStep = Callable[[ViolationRecord, Measure | None], tuple[Action | None, datetime | None]]


@dataclass(frozen=True, slots=True)
class StatusFacts:
    """What a budget's status is built from: the pods it selects and measured
    (``data``), whether it enforces, its records after this evaluation, the
    measurements, the warnings kept and how many there were in all, and the
    sum of the selected pods left out of the evaluation (``EngineInput.quiet``;
    counted in ``matched``)."""

    matched: int
    data: Sequence[PodData]
    enforce: bool
    records: Sequence[ViolationRecord]
    measured: Mapping[ViolationKey, Measure]
    warnings: Sequence[LimitWarning]
    warning_count: int
    quiet: QuietPods = field(default_factory=QuietPods)


def budget_status(
    budget: GPUMemoryBudget,
    facts: StatusFacts,
    now: datetime,
    bound: int,
    violation: Callable[[ViolationRecord], Violation],
) -> GPUMemoryBudgetStatus:
    """The desired status; ``violation`` builds one ``status.violations`` entry."""
    prev = budget.status or GPUMemoryBudgetStatus()
    records = sorted(facts.records, key=status_order)
    opened = [r for r in records if r.opened_at is not None]
    leaks = sum(1 for r in opened if r.key.kind in LEAK_MEMORY)
    vio_msg = "; ".join(
        f"{r.key.label()} {r.key.pod or 'total'} ({'would ' if r.dry_run else ''}{r.step or 'open'})"
        for r in opened[:20]
    )
    more = facts.warning_count - len(facts.warnings)
    warn_msg = "; ".join(
        f"{w.kind} {w.pod or 'total'} {format_bytes(w.observed_bytes)}/{format_bytes(w.limit_bytes)}"
        for w in facts.warnings[:20]
    ) + (f"; and {more} more" if more > 0 else "")
    q = facts.quiet
    stale = sorted({d.pod.node_name or "" for d in facts.data if d.state == "Stale"} | q.stale_nodes)
    missing = sorted({d.pod.node_name or "" for d in facts.data if d.state == "Missing"} | q.missing_nodes)
    invalid = {d.pod.node_name or "": d.reason or "" for d in facts.data if d.state == "Invalid"}
    mode: Mode = "Enforce" if facts.enforce else "DryRun"
    wanted = [
        bs.ready(f"selects {facts.matched} pods; mode {mode}"),
        bs.violating(len(opened) - leaks, leaks, f"{len(opened)} open: {vio_msg}"),
        bs.warning(facts.warning_count, warn_msg),
        bs.data_stale(stale, missing, invalid),
    ]
    gen = budget.metadata.generation
    violations = [violation(r) for r in records[:bound]]
    return GPUMemoryBudgetStatus(
        observedGeneration=gen,
        conditions=bs.settle_conditions(wanted, prev.conditions, gen, now),
        effectiveMode=mode,
        matchedPods=facts.matched,
        usage=usage(facts.data, budget, q),
        openViolations=len(opened),
        violations=violations or None,
        warnings=list(facts.warnings) or None,
    )


def usage(data: Sequence[PodData], budget: GPUMemoryBudget, quiet: QuietPods | None = None) -> BudgetUsage:
    """VRAM and RAM summed over the measured pods (and the ``quiet`` ones left
    out), and as text against the total limit."""
    quiet = quiet or NO_QUIET
    vram = [d.vram for d in data if d.vram is not None]
    ram = [d.ram for d in data if d.ram is not None]
    tot = budget.spec.limits.total
    vram_sum = sum(vram) + quiet.vram_bytes if vram or quiet.vram_known else None
    ram_sum = sum(ram) + quiet.ram_bytes if ram or quiet.ram_known else None
    return BudgetUsage(
        vramBytes=vram_sum,
        ramBytes=ram_sum,
        vram=bs.display(vram_sum, tot.vram_bytes() if tot else None),
        ram=bs.display(ram_sum, tot.ram_bytes() if tot else None),
    )


def violation_entry(
    rec: ViolationRecord,
    m: Measure | None,
    next_step: NextStep,
    throttle_impossible: str | None,
    cap: str | None = None,
) -> Violation:
    """One ``status.violations`` entry: the record, the latest measurement ``m``
    (None when not measured), the next step, why a Throttle could not resize
    and how a Cap stands (``messages.cap_status_text``)."""
    observed = m.observed if m is not None and m.observed is not None else rec.observed_bytes
    limit = m.limit if m is not None else rec.limit_bytes
    nxt, nxt_time = next_step(rec, m)
    return Violation(
        kind=rec.key.kind,
        pod=rec.key.pod,
        device=rec.key.device,
        observedBytes=max(0, observed or 0),
        limitBytes=max(0, limit or 0),
        since=rec.since,
        openedAt=rec.opened_at,
        step=rec.step,
        stepTime=rec.step_time,
        dryRun=True if rec.dry_run and rec.step is not None else None,
        nextStep=nxt,
        nextStepTime=nxt_time,
        evictTargetUID=rec.evict_target_uid,
        message=messages.violation_message(rec, m, observed, limit, throttle_impossible, cap),
    )


def invalid_status(
    budget: GPUMemoryBudget, message: str, now: datetime, reason: str = C.REASON_INVALID_SPEC
) -> GPUMemoryBudgetStatus:
    """The status of a budget that is not evaluated: Ready=False with ``reason``
    and ``message`` (its spec cannot be evaluated, naming the field; or its
    evaluation failed or ran out of time); the escalation state and the other
    conditions are kept (nothing is decided on it)."""
    gen = budget.metadata.generation
    prev = budget.status or GPUMemoryBudgetStatus()
    ready = bs.settle_conditions([bs.invalid(message, reason)], prev.conditions, gen, now)
    kept = [c for c in prev.conditions or () if c.type != ready[0].type]
    return prev.model_copy(update={"observed_generation": gen, "conditions": [*ready, *kept]})


def status_order(r: ViolationRecord) -> tuple[int, int, str, str, str]:
    """Open before pending, highest step first, then oldest, by pod and kind."""
    return (
        0 if r.opened_at is not None else 1,
        -step_rank(r.step),
        r.since.isoformat(),
        r.key.pod or "",
        r.key.kind + (r.key.device or ""),
    )
