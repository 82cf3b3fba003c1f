"""One budget's evaluation: ``evaluate_budget(...) -> BudgetResult``.

Reads the budget's records back (status and pod annotations), measures every
limit, moves each violation along its ladder (``ladder.transition``), closes
or keeps the violations it did not measure, settles the warnings and builds
the status. What earlier budgets of the same evaluation decided comes in as
``PassState``; nothing outside the result is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudget, GPUMemoryBudgetStatus, LimitWarning, Violation
from vramguard_api.steps import Action
from vramguard_operator.engine import cap_steps, caps, steps
from vramguard_operator.engine import ladder as lad
from vramguard_operator.engine import warnings as warn
from vramguard_operator.engine.inputs import PodFacts, QuietPods
from vramguard_operator.engine.keys import BudgetRef
from vramguard_operator.engine.measure import BudgetLimits, Node, budget_measures
from vramguard_operator.engine.records import (
    ViolationRecord,
    merge_records,
    records_from_status,
    step_rank,
    throttled,
)
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.engine.spec_check import spec_problem
from vramguard_operator.engine.status import StatusFacts, budget_status, violation_entry
from vramguard_operator.engine.work import BudgetResult, BudgetWork, PassState, Selection

_DONE_PHASES = ("Succeeded", "Failed")


class InvalidSpec(ValueError):
    """A budget's spec cannot be evaluated; the message names the field and the value."""


def evaluate_budget(
    budget: GPUMemoryBudget,
    ns_pods: list[PodFacts],
    nodes: Mapping[str, Node],
    acting: bool,
    enforce: bool,
    state: PassState,
    device_limits: Mapping[str, int] | None = None,
    soft_limits: bool = False,
    quiet: QuietPods | None = None,
) -> BudgetResult:
    """Evaluate ``budget`` against the pods of its namespace (``ns_pods``, sorted
    by name) and the nodes' reports. ``acting``: steps fire for real (the
    budget enforces and its namespace is not exempt); ``enforce``: the
    effective mode is Enforce. ``device_limits``: bytes by device UUID that
    replace ``perDevice`` on those devices (``EngineInput.device_limits``).
    ``soft_limits``: the policy asks for soft limits at the shares (for a
    budget that leaves ``enforcement.softLimits`` unset). ``quiet``: what the
    selected pods left out of ``ns_pods`` add to the status
    (``EngineInput.quiet``). Raises ``InvalidSpec`` (naming the field and the
    value) for a spec that cannot be evaluated; the driver holds such a budget
    (``HeldBudget``) and keeps the memory limits of the pods it holds."""
    meta = budget.metadata
    ref = BudgetRef(meta.namespace or "", meta.name or "", meta.uid or "")
    spec = budget.spec
    default_cpu = state.config.default_throttle_cpu
    problem = spec_problem(spec)
    if problem is not None:
        raise InvalidSpec(problem)
    try:
        matcher = compile_selector(spec.selector)
        ladder = lad.ladder_of(spec, default_cpu)
        leak_ladder = lad.ladder_of(spec, default_cpu, leak=True)
        limits = BudgetLimits.of(spec, state.config.recovery_margin, device_limits or {})
    except (ValueError, ArithmeticError) as err:  # OverflowError is an ArithmeticError
        raise InvalidSpec(str(err)) from err
    w = BudgetWork(state, ref, acting, ladder, leak_ladder)
    matched = [p for p in ns_pods if p.phase not in _DONE_PHASES and matcher(p.labels)]
    running = [p for p in matched if p.phase == "Running" and not p.terminating and p.node_name]
    w.data = w.measure_pods(running, nodes)
    _load_records(w, budget, ns_pods)
    prev = budget.status
    prev_warnings = warn.stored_warnings(prev.warnings if prev is not None else None)
    # pods with state in this budget; the others take the fast path while quiet
    touched = {k.pod for k in w.records} | {pw.pod for pw in prev_warnings.values()}
    candidates = _move_all(w, limits, ns_pods, prev_warnings, touched)
    _unmeasured(w, ns_pods, {p.uid for p in matched})
    if w.acting:
        steps.repost_pending(w)
    cap_steps.want_caps(w)
    cap_steps.want_soft_limits(w, limits, caps.soft_limits_asked(spec, soft_limits))
    kept, new = warn.settle(candidates, state.config.max_status_entries, w.now)
    for m in new:
        steps.warn(w, m, limits.threshold)
    q = quiet or QuietPods()
    status, unwritten = _status(w, budget, (len(matched), q), enforce, kept, len(candidates))
    return w.result(status, unwritten, len(matched) + q.matched, Selection(ref, budget, limits, matched))


def _load_records(w: BudgetWork, budget: GPUMemoryBudget, ns_pods: list[PodFacts]) -> None:
    """The budget's records from its status and from its pods' annotations,
    merged per violation; notes the throttle targets of those that throttled a pod."""
    status_records = records_from_status(budget)
    by_name = {p.name: p for p in ns_pods} if status_records else {}
    for rec in status_records:
        if rec.key.kind == "DevicePressure":
            continue  # the device-pressure rule's, read by engine.pressure_facts
        if rec.dry_run and w.acting:
            # a step that only would have fired: enforcing, the ladder fires it for real
            rec = replace(rec, step=None, step_time=None, dry_run=False)
        w.records[rec.key] = rec
        pod = by_name.get(rec.key.pod or "")
        if pod is not None and throttled(rec):
            w.add_throttle_target(pod.uid, rec.key)
    pods_by_uid = w.state.pods_by_uid
    for uid, recs in w.state.pod_records.items():
        if pods_by_uid[uid].namespace != w.ref.namespace:
            continue
        for key, rec in recs.items():
            if key.budget != w.ref.name:
                continue
            old = w.records.get(key)
            w.records[key] = rec if old is None else merge_records(old, rec)
            if throttled(rec):
                w.add_throttle_target(uid, key)
    if w.acting:
        _catch_up_pods(w, ns_pods)


def _catch_up_pods(w: BudgetWork, ns_pods: list[PodFacts]) -> None:
    """Write back on a running pod an Annotate or Throttle step that the budget's
    record holds for real and the pod's own record lacks (its annotation was
    removed, or not believed: ``engine.seal``), so that the pod and the budget
    agree: a pod held at Throttle without a record of it on the pod would be
    restored, then throttled again, over and over. (A step is recorded in
    status only once it is on the pod, so the budget's record is the
    operator's own.)"""
    by_name = {p.name: p for p in ns_pods}
    for key, rec in w.records.items():
        if key.pod is None or rec.dry_run or rec.opened_at is None or rec.step not in (Action.ANNOTATE, Action.THROTTLE, Action.CAP):
            continue
        pod = by_name.get(key.pod)
        if pod is None or pod.terminating or pod.phase != "Running":
            continue
        own = w.records_on(pod.uid).get(key)
        if own is None or step_rank(own.step) < step_rank(rec.step):
            w.merge_on_pod(pod.uid, replace(rec, events_posted=True))


def _move_all(
    w: BudgetWork,
    limits: BudgetLimits,
    ns_pods: list[PodFacts],
    prev_warnings: Mapping[warn.WarningKey, LimitWarning],
    touched: set[str | None],
) -> list[warn.WarnCandidate]:
    """Measure every limit and apply each measurement's transition (one loop with
    its names bound once: it runs for every measured limit of every budget);
    returns the warning candidates."""
    candidates: list[warn.WarnCandidate] = []
    records, next_records, measured = w.records, w.next_records, w.measured
    now, uid, tolerance, threshold, margin = w.now, w.ref.uid, limits.tolerance_seconds, limits.threshold, limits.margin
    ladder, leak_ladder = w.ladder, w.leak_ladder
    transition, above_threshold = lad.transition, warn.above_threshold
    for m in budget_measures(limits, w.ref.namespace, w.ref.name, w.data, touched, now):
        key = m.key
        measured[key] = m
        kind, rec, due = transition(
            records.get(key), m, now, uid, tolerance, leak_ladder if key.kind in LEAK_MEMORY else ladder
        )
        if kind == "Quiet" or kind == "Pending" or kind == "Hold":
            if rec is not None:
                next_records[key] = rec
            cand = (
                warn.carried(m, prev_warnings)
                if kind == "Hold"
                else above_threshold(m, prev_warnings, threshold, margin)
            )
            if cand is not None:
                candidates.append(cand)
            continue
        assert rec is not None  # Close and Open always carry the record
        if kind == "Close":
            steps.close(w, rec, m, "UsageBelowLimit", ns_pods)
            continue
        next_records[key] = rec
        if due is not None and not steps.pending_events(w, key):
            steps.fire(w, rec, m, due)
        steps.reapply_throttle(w, rec, m)
    return candidates


def _unmeasured(w: BudgetWork, ns_pods: list[PodFacts], selected: set[str]) -> None:
    """Move the records whose violation was not measured (``ladder.unmeasured``)."""
    by_name = {p.name: p for p in ns_pods}
    for key, rec in w.records.items():
        if key in w.measured:
            continue
        pod = by_name.get(key.pod) if key.pod is not None else None
        kind = lad.unmeasured(rec, pod, pod is not None and pod.uid in selected)
        if kind == "Keep":
            w.next_records[key] = rec
        elif kind == "Drop":
            w.drop_on_pods(key)
        elif kind == "Close":
            steps.close(w, rec, None, "NoLongerSelected", ns_pods)
        else:
            w.next_records[key] = lad.evicted(rec, w.ladder_for(key), w.now, w.acting)


def _status(
    w: BudgetWork,
    budget: GPUMemoryBudget,
    matched: tuple[int, QuietPods],
    enforce: bool,
    kept: list[LimitWarning],
    count: int,
) -> tuple[GPUMemoryBudgetStatus, GPUMemoryBudgetStatus | None]:
    """The budget's status, and the status should the pods' writes of the steps
    fired now fail (None when none fired): the status follows the pods.
    ``matched``: the pods given it selects and the sum of those left out;
    ``kept``: the warnings kept, of ``count`` in all."""

    def entry(rec: ViolationRecord) -> Violation:
        m = w.measured.get(rec.key)
        known = rec.opened_at is not None and m is not None and m.over is not None
        impossible = steps.throttle_impossible(w, rec, m) if known and m is not None else None
        cap = cap_steps.cap_status(w, rec, m) if known and m is not None else None
        return violation_entry(rec, m, lambda r, mm: steps.next_of(w, r, mm), impossible, cap)

    given, quiet = matched

    def build(records: list[ViolationRecord]) -> GPUMemoryBudgetStatus:
        facts = StatusFacts(given + quiet.matched, w.data, enforce, records, w.measured, kept, count, quiet)
        return budget_status(budget, facts, w.now, w.config.max_status_entries, entry)

    status = build(list(w.next_records.values()))
    if not w.unfired:
        return status, None
    return status, build([w.unfired.get(k, r) for k, r in w.next_records.items()])
