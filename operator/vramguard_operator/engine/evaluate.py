"""The pure policy engine: ``evaluate(EngineInput) -> EngineOutput``.

Budgets, the effective policy, node reports, pod facts (with the escalation
state in their annotations) and ``now`` go in; typed decisions, pod annotation
patches and desired budget statuses come out. No clock, no I/O. The semantics
(tolerance, ladder, recovery, staleness, unknown data, warnings, leaks, DryRun)
are described in docs/engine.md; the types in ``engine_types``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from vramguard_api.budget import (
    Action,
    BudgetUsage,
    GPUMemoryBudget,
    GPUMemoryBudgetStatus,
    LimitWarning,
    Mode,
    Violation,
    ViolationKind,
)
from vramguard_api.trend import TrendFeatures
from vramguard_api.units import format_bytes
from vramguard_api.usage import NodeGPUUsage, PodUsage
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.engine.escalation import (
    TOTAL_KINDS,
    Ladder,
    LadderStep,
    format_time,
    ladder_of,
    merge_records,
    records_from_annotation,
    records_from_status,
    records_to_annotation,
    step_rank,
    whole_seconds,
)
from vramguard_operator.engine.leak_rule import LeakThresholds, leak_cleared, leak_holds, seconds_to_limit
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.engine.throttle import original_to_annotation, parse_original, plan_restore, plan_throttle
from vramguard_operator.engine.types import (
    ANNOTATION_MESSAGE,
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_VIOLATIONS,
    EVENT_ABOVE_WARNING,
    EVENT_DRY_RUN,
    EVENT_EVICTING,
    EVENT_LEAK_DETECTED,
    EVENT_LIMIT_EXCEEDED,
    EVENT_RECOVERED,
    EVENT_THROTTLE_IMPOSSIBLE,
    EVENT_THROTTLED,
    Annotate,
    BudgetRef,
    BudgetStatusUpdate,
    ContainerCPU,
    Decision,
    DecisionBase,
    DryRunStep,
    EngineConfig,
    EngineInput,
    EngineOutput,
    EventSpec,
    Evict,
    PodFacts,
    PodPatch,
    PodRef,
    Recover,
    Throttle,
    ViolationKey,
    ViolationRecord,
    Warn,
)

DataState = Literal["Fresh", "Stale", "Missing"]
_VERB = {"Annotate": "annotate", "Throttle": "throttle", "Evict": "evict"}
_DONE = {"Annotate": "annotated", "Throttle": "throttled", "Evict": "evicting"}


# --- usage views ------------------------------------------------------------------


@dataclass(slots=True)
class _Node:
    """A node's report as the engine reads it."""

    state: DataState
    report: NodeGPUUsage | None = None
    by_uid: dict[str, PodUsage] = field(default_factory=dict)
    usable: dict[str, int | None] = field(default_factory=dict)
    complete: bool = True


@dataclass(slots=True)
class _PodData:
    """One selected, running pod's measured usage (None: unknown)."""

    pod: PodFacts
    state: DataState
    vram: int | None
    ram: int | None
    devices: tuple[tuple[str, int | None, int | None], ...]  # (uuid, used, usable)
    trend: TrendFeatures | None


def _nodes(reports: Mapping[str, NodeGPUUsage], now: datetime, freshness: float) -> dict[str, _Node]:
    out: dict[str, _Node] = {}
    for name, rep in reports.items():
        st = rep.status
        if st is None:
            out[name] = _Node("Missing")
            continue
        age = (now - st.sample_time).total_seconds()
        # a sample time further ahead than the bound is clock skew: it cannot be trusted
        if abs(age) > freshness:
            out[name] = _Node("Stale", rep)
            continue
        # Complete: every GPU process on the node is in the report. Not so when lists
        # were cut, or a device's processes are not all known or it cannot be read.
        complete = not st.truncated and all(d.processes_complete and d.health == "Healthy" for d in st.devices)
        node = _Node("Fresh", rep, complete=complete)
        node.by_uid = {p.uid: p for p in st.pods}
        node.usable = {d.uuid: (d.memory.usable_bytes if d.memory else None) for d in st.devices}
        out[name] = node
    return out


def _pod_data(pod: PodFacts, nodes: Mapping[str, _Node]) -> _PodData:
    node = nodes.get(pod.node_name or "")
    if node is None:
        return _PodData(pod, "Missing", None, None, (), None)
    if node.state != "Fresh":
        return _PodData(pod, node.state, None, None, (), None)
    usage = node.by_uid.get(pod.uid)
    if usage is None:
        # Every GPU process on the node is in a complete report, attributed or not:
        # a pod absent from it holds no VRAM there. Its RAM is unknown.
        return _PodData(pod, "Fresh", 0 if node.complete else None, None, (), None)
    measured = usage.attribution == "Measured"
    devices = tuple((d.uuid, d.used_bytes if measured else None, node.usable.get(d.uuid)) for d in usage.devices)
    return _PodData(
        pod,
        "Fresh",
        usage.vram_bytes if measured else None,
        usage.ram_working_set_bytes,
        devices,
        usage.trend if measured else None,
    )


# --- measurements ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _WarnCand:
    """A limit above the warning threshold: its share of the limit, the
    measurement (None when carried over on unknown data) and the stored warning."""

    ratio: float
    key: ViolationKey
    m: _Measure | None
    prev: LimitWarning | None


@dataclass(frozen=True, slots=True)
class _Fire:
    """A step being fired: the violation's record, its measurement and the next step."""

    rec: ViolationRecord
    m: _Measure
    next_step: Action | None
    next_time: datetime | None


@dataclass(slots=True)
class _Measure:
    """One limit checked against one measured value.

    ``over``/``hard``/``clear``/``pause`` are None when the data cannot tell
    (stale, unknown attribution, a total with an unknown member)."""

    key: ViolationKey
    observed: int | None
    limit: int
    over: bool | None
    hard: bool | None
    clear: bool | None
    pause: bool | None
    pod: _PodData | None = None
    detail: str = ""
    evict_now: bool = False  # Leak with evictBefore: projected exhaustion is close
    projected_evict: datetime | None = None


def _limit_measure(
    key: ViolationKey,
    observed: int | None,
    limit: int,
    overshoot: float,
    margin: float,
    pod: _PodData | None,
) -> _Measure:
    if observed is None:
        return _Measure(key, None, limit, None, None, None, None, pod)
    return _Measure(
        key,
        observed,
        limit,
        over=observed > limit,
        hard=observed > limit * (1 + overshoot),
        clear=observed <= limit * (1 - margin),
        pause=observed <= limit,
        pod=pod,
    )


# --- the evaluation ----------------------------------------------------------------


@dataclass(slots=True)
class _Ctx:
    now: datetime
    config: EngineConfig
    decisions: list[Decision] = field(default_factory=list)
    # pod uid -> key -> record, the desired pod annotation state
    pod_records: dict[str, dict[ViolationKey, ViolationRecord]] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)
    new_original: dict[str, dict[str, dict[str, str | None]]] = field(default_factory=dict)
    pods_by_uid: dict[str, PodFacts] = field(default_factory=dict)
    ladders: dict[tuple[str, str], Ladder] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    pairs: int = 0
    resized: dict[str, PodFacts] = field(default_factory=dict)
    evicting: set[str] = field(default_factory=set)
    pod_data: dict[str, _PodData] = field(default_factory=dict)
    # pod uid -> CPU limits that the violations which throttled the pod set (from the
    # state read back, before any closes): a restore undoes only those
    throttle_targets: dict[str, set[str]] = field(default_factory=dict)


def evaluate(inp: EngineInput) -> EngineOutput:
    """Evaluate every budget against the measured usage of its pods.

    Returns the decisions, the pod annotation patches and the desired budget
    statuses (see ``engine_types``). Raises ``ValueError`` when ``inp.now`` is
    naive. Invalid budget specs do not raise: their status says Ready=False.
    """
    now = whole_seconds(inp.now)
    ctx = _Ctx(now, inp.config)
    nodes = _nodes(inp.reports, now, inp.config.freshness_seconds)
    pods_by_ns: dict[str, list[PodFacts]] = defaultdict(list)
    for pod in sorted(inp.pods, key=lambda p: (p.namespace, p.name)):
        pods_by_ns[pod.namespace].append(pod)
        ctx.pods_by_uid[pod.uid] = pod
        _load_pod_records(ctx, pod)
    budgets = sorted(inp.budgets, key=lambda b: (b.metadata.namespace or "", b.metadata.name or ""))
    live = {(b.metadata.namespace or "", b.metadata.name or ""): b.metadata.uid or "" for b in budgets}
    _recover_orphans(ctx, live)
    statuses = []
    for budget in budgets:
        ns = budget.metadata.namespace or ""
        acting = inp.policy.mode == "Enforce" and budget.spec.enforcement.mode == "Enforce"
        exempt = ns in inp.policy.exempt_namespaces
        ev = _BudgetEval(ctx, budget, pods_by_ns.get(ns, []), nodes, acting and not exempt, acting)
        ev.device_limits = inp.device_limits.get(budget.metadata.uid or "", {})
        statuses.append(BudgetStatusUpdate(ev.ref, ev.run()))
    _restore_untrottled(ctx)
    return EngineOutput(
        decisions=tuple(ctx.decisions),
        pod_patches=tuple(_pod_patches(ctx)),
        statuses=tuple(statuses),
        evaluated_pairs=ctx.pairs,
        problems=tuple(ctx.problems),
    )


def _load_pod_records(ctx: _Ctx, pod: PodFacts) -> None:
    text = pod.annotations.get(ANNOTATION_VIOLATIONS)
    if not text:
        return
    records, problems = records_from_annotation(text, pod.namespace, pod.name)
    ctx.pod_records[pod.uid] = {r.key: r for r in records}
    if problems:
        ctx.problems.extend(problems)
        ctx.dirty.add(pod.uid)  # rewrite the annotation without the malformed entries


def _recover_orphans(ctx: _Ctx, live: Mapping[tuple[str, str], str]) -> None:
    """Close pod records whose budget is gone (deleted, or recreated with another uid)."""
    for uid, recs in ctx.pod_records.items():
        pod = ctx.pods_by_uid[uid]
        for key, rec in list(recs.items()):
            current = live.get((key.namespace, key.budget))
            if current is not None and (not rec.budget_uid or not current or rec.budget_uid == current):
                continue
            del recs[key]
            ctx.dirty.add(uid)
            if _throttled(rec):
                # the budget's ladder is gone with it: assume the default target
                ctx.throttle_targets.setdefault(uid, set()).add(ctx.config.default_throttle_cpu)
            budget = BudgetRef(key.namespace, key.budget, rec.budget_uid)
            msg = f"budget {key.namespace}/{key.budget} is gone: {key.label()} violation on pod {pod.name} closed"
            ctx.decisions.append(
                Recover(
                    budget=budget,
                    violation=key,
                    pod=pod.ref,
                    time=ctx.now,
                    observed_bytes=rec.observed_bytes or 0,
                    limit_bytes=rec.limit_bytes or 0,
                    event=EventSpec("Normal", EVENT_RECOVERED, msg),
                    cause="BudgetDeleted",
                )
            )


class _BudgetEval:
    """Evaluation of one budget: measurements, state transitions, status."""

    def __init__(
        self,
        ctx: _Ctx,
        budget: GPUMemoryBudget,
        ns_pods: list[PodFacts],
        nodes: Mapping[str, _Node],
        acting: bool,
        enforce: bool,
    ) -> None:
        meta = budget.metadata
        self.ctx = ctx
        self.budget = budget
        self.spec = budget.spec
        self.ref = BudgetRef(meta.namespace or "", meta.name or "", meta.uid or "")
        self.ns_pods = ns_pods
        self.nodes = nodes
        self.acting = acting
        self.enforce = enforce
        self.now = ctx.now
        self.records: dict[ViolationKey, ViolationRecord] = {}
        self.next_records: dict[ViolationKey, ViolationRecord] = {}
        self.measured: dict[ViolationKey, _Measure] = {}
        self.prev_status = budget.status or GPUMemoryBudgetStatus()
        self.warnings: list[_WarnCand] = []
        self.device_limits: Mapping[str, int] = {}  # device UUID -> bytes (EngineInput.device_limits)

    # -- driver

    def run(self) -> GPUMemoryBudgetStatus:
        try:
            matcher = compile_selector(self.spec.selector)
            self.ladder = ladder_of(self.spec, self.ctx.config.default_throttle_cpu)
            self.leak_ladder = ladder_of(self.spec, self.ctx.config.default_throttle_cpu, leak=True)
            ld = self.spec.leak_detection
            self.leak = LeakThresholds.of(ld) if ld is not None and ld.enabled else None
        except ValueError as err:
            return self._invalid_status(str(err))
        self.ctx.ladders[(self.ref.namespace, self.ref.name)] = self.ladder
        matched = [p for p in self.ns_pods if p.phase not in ("Succeeded", "Failed") and matcher(p.labels)]
        running = [p for p in matched if p.phase == "Running" and not p.terminating and p.node_name]
        self.ctx.pairs += len(matched)
        self._matched_uids = {p.uid for p in matched}
        cache = self.ctx.pod_data
        self.data = [
            cache[p.uid] if p.uid in cache else cache.setdefault(p.uid, _pod_data(p, self.nodes)) for p in running
        ]
        self._load_records()
        for m in self._measures():
            self.measured[m.key] = m
            self._transition(m)
        self._unmeasured(matched)
        return self._status(matched)

    def _load_records(self) -> None:
        status_records = records_from_status(self.budget)
        by_name = {p.name: p for p in self.ns_pods} if status_records else {}
        for rec in status_records:
            if rec.dry_run and self.acting:
                # a step that only would have fired: enforcing, the ladder fires it for real
                rec = replace(rec, step=None, step_time=None, dry_run=False)
            self.records[rec.key] = rec
            pod = by_name.get(rec.key.pod or "")
            if pod is not None and _throttled(rec):
                self._add_throttle_target(pod.uid, rec.key)
        for uid, recs in self.ctx.pod_records.items():
            if self.ctx.pods_by_uid[uid].namespace != self.ref.namespace:
                continue
            for key, rec in recs.items():
                if key.budget != self.ref.name:
                    continue
                old = self.records.get(key)
                self.records[key] = rec if old is None else merge_records(old, rec)
                if _throttled(rec):
                    self._add_throttle_target(uid, key)
        prev = {(w.kind, w.pod, w.device): w for w in self.prev_status.warnings or ()}
        self.prev_warnings = prev
        # pods with state in this budget; the others take a fast path while quiet
        self.touched = {k.pod for k in self.records} | {w.pod for w in prev.values()}

    def _add_throttle_target(self, uid: str, key: ViolationKey) -> None:
        rung = self._ladder(key).rung("Throttle")
        if rung is not None and rung.cpu_limit is not None:
            self.ctx.throttle_targets.setdefault(uid, set()).add(rung.cpu_limit)

    # -- measurements

    def _measures(self) -> Iterable[_Measure]:
        lim = self.spec.limits
        over = self.spec.tolerance.overshoot_percent / 100
        margin = self.ctx.config.recovery_margin
        ns, name = self.ref.namespace, self.ref.name
        pod_vram = lim.per_pod.vram_bytes() if lim.per_pod else None
        pod_ram = lim.per_pod.ram_bytes() if lim.per_pod else None
        thr = self.spec.warning_threshold
        # Fast path: a pod without state in this budget whose value is unknown or
        # below the warning threshold changes nothing, so no measurement is built.
        vram_quiet = -1 if pod_vram is None else thr * pod_vram
        ram_quiet = -1 if pod_ram is None else thr * pod_ram
        per_device = lim.per_device
        for d in self.data:
            pn = d.pod.name
            quiet = pn not in self.touched
            if pod_vram is not None and not (quiet and (d.vram is None or d.vram < vram_quiet)):
                yield _limit_measure(ViolationKey(ns, name, "PodVRAM", pn), d.vram, pod_vram, over, margin, d)
            if pod_ram is not None and not (quiet and (d.ram is None or d.ram < ram_quiet)):
                yield _limit_measure(ViolationKey(ns, name, "PodRAM", pn), d.ram, pod_ram, over, margin, d)
            if per_device is not None or self.device_limits:
                for uuid, used, usable in d.devices:
                    limit = self._device_limit(uuid, usable)
                    if limit is None and (per_device is None or uuid in self.device_limits):
                        continue  # no limit on this device
                    if quiet and (used is None or limit is None or used < thr * limit):
                        continue
                    key = ViolationKey(ns, name, "DeviceVRAM", pn, uuid)
                    if limit is None:
                        yield _Measure(key, used, 0, None, None, None, None, d)
                    else:
                        yield _limit_measure(key, used, limit, over, margin, d)
            if self.leak is not None and not (quiet and (d.trend is None or d.vram is None)):
                yield self._leak_measure(d)
        if lim.total is not None:
            totals: tuple[tuple[ViolationKind, int | None, str], ...] = (
                ("TotalVRAM", lim.total.vram_bytes(), "vram"),
                ("TotalRAM", lim.total.ram_bytes(), "ram"),
            )
            for kind, limit, attr in totals:
                if limit is None:
                    continue
                values = [getattr(d, attr) for d in self.data]
                known = all(v is not None for v in values)
                total = sum(v for v in values if v is not None)
                m = _limit_measure(
                    ViolationKey(ns, name, kind),
                    total if known else None,
                    limit,
                    over,
                    margin,
                    None,
                )
                if not known:
                    m.observed = total  # partial sum, for display only
                yield m

    def _leak_measure(self, d: _PodData) -> _Measure:
        assert self.leak is not None
        th = self.leak
        key = ViolationKey(self.ref.namespace, self.ref.name, "Leak", d.pod.name)
        limit = int(th.min_growth_bytes_per_hour)
        trend = d.trend
        if trend is None or d.vram is None:
            return _Measure(key, None, limit, None, None, None, None, d)
        holds = leak_holds(trend, th)
        cleared = leak_cleared(trend, th)
        growth = trend.growth_bytes_per_hour
        observed = None if growth is None else max(0, int(growth))
        m = _Measure(key, observed, limit, holds, holds, cleared, None if holds is None else not holds, d)
        cap = self._vram_cap(d)
        left = seconds_to_limit(d.vram, cap, growth)
        low = trend.growth_low_bytes_per_hour
        m.detail = (
            f"VRAM grows {format_bytes(growth)}/h (lower bound {format_bytes(low)}/h) over "
            f"{_duration(trend.window_seconds)}, threshold {format_bytes(limit)}/h"
        )
        if left is not None and cap is not None:
            m.detail += f"; projected to reach {format_bytes(cap)} in {_duration(left)}"
            if th.evict_before_seconds is not None:
                m.evict_now = left <= th.evict_before_seconds
                m.projected_evict = self.now + timedelta(seconds=max(0.0, left - th.evict_before_seconds))
        return m

    def _device_limit(self, uuid: str, usable: int | None) -> int | None:
        """The limit on one device: a named device limit, else the budget's perDevice."""
        if uuid in self.device_limits:
            return self.device_limits[uuid]
        per_device = self.spec.limits.per_device
        return None if per_device is None else per_device.bytes_for(usable)

    def _vram_cap(self, d: _PodData) -> int | None:
        """The VRAM a leaking pod runs into: perPod.vram, else the per-device
        limit (or usable memory) of the device it uses most."""
        lim = self.spec.limits
        if lim.per_pod is not None and lim.per_pod.vram is not None:
            return lim.per_pod.vram_bytes()
        if not d.devices:
            return None
        uuid, used, usable = max(d.devices, key=lambda x: x[1] or 0)
        if lim.per_device is not None or uuid in self.device_limits:
            cap = self._device_limit(uuid, usable)
            # the projection runs on the pod's total VRAM: shift the device cap by its other devices
            return None if cap is None or d.vram is None else cap + (d.vram - (used or 0))
        if usable is None or d.vram is None:
            return None
        return usable + (d.vram - (used or 0))

    # -- state machine

    def _transition(self, m: _Measure) -> None:
        rec = self.records.get(m.key)
        if m.over is None:  # unknown data: hold everything
            if rec is not None:
                self.next_records[m.key] = rec
            self._carry_warning(m)
            return
        if rec is None or rec.opened_at is None:
            if not m.over:
                self._warning(m)
                return
            since = rec.since if rec is not None else self.now
            tolerance = 0.0 if m.key.kind == "Leak" else self.spec.tolerance.seconds()
            if not (m.hard or (self.now - since).total_seconds() >= tolerance):
                self.next_records[m.key] = ViolationRecord(m.key, self.ref.uid, since)
                self._warning(m)
                return
            rec = ViolationRecord(m.key, self.ref.uid, since, opened_at=self.now)
        if m.clear:
            self._close(rec, m, "UsageBelowLimit")
            return
        self.next_records[m.key] = rec
        if not m.pause:
            self._escalate(rec, m)
        self._reapply_throttle(rec, m)

    def _ladder(self, key: ViolationKey) -> Ladder:
        return self.leak_ladder if key.kind == "Leak" else self.ladder

    def _due(self, rec: ViolationRecord, rung: LadderStep, m: _Measure | None) -> datetime | None:
        """When ``rung`` is due for ``rec`` (None: never, so far)."""
        assert rec.opened_at is not None
        due = None
        if rung.after_seconds != float("inf"):
            due = rec.opened_at + timedelta(seconds=rung.after_seconds)
        if rung.action == "Evict" and m is not None and m.projected_evict is not None:
            due = m.projected_evict if due is None else min(due, m.projected_evict)
        return due

    def _escalate(self, rec: ViolationRecord, m: _Measure) -> None:
        """Fire the next rung if it is due: at most one step per violation per evaluation."""
        rung = self._ladder(rec.key).next_after(rec.step)
        if rung is None:
            return
        due = self._due(rec, rung, m)
        if due is None or self.now < due:
            return
        targets = self._targets(rung.action, m)
        if rung.action == "Evict" and self.acting:
            if rec.key.kind in TOTAL_KINDS:
                self._evict_total(rec, m, targets)
                return
            for d in targets:
                self._emit_evict(_Fire(rec, m, None, None), d)
            return  # level-triggered: recorded once the pod is terminating
        fired = replace(
            rec,
            step=rung.action,
            step_time=self.now,
            observed_bytes=m.observed,
            limit_bytes=m.limit,
            dry_run=not self.acting,
        )
        self.next_records[rec.key] = fired
        f = _Fire(fired, m, *self._next(fired, m))
        if not self.acting:
            dry_targets: list[_PodData | None] = [*targets] or [None]
            for target in dry_targets:
                self._emit_dry(f, rung.action, target)
            return
        for d in targets:
            if rung.action == "Annotate":
                text = self._text(f, "Annotate")
                self._emit(Annotate, f, d, EventSpec("Warning", self._reason(m), text))
            else:
                self._emit_throttle(f, d, rung)
            self._record_on_pod(d.pod, fired)

    def _evict_total(self, rec: ViolationRecord, m: _Measure, targets: list[_PodData]) -> None:
        """A total's due Evict: recorded once a pod chosen for it is terminating or
        gone; until then the largest consumer is evicted (level-triggered) and
        recorded as the target, in status and on that pod, before the eviction."""
        chosen = {rec.evict_target_uid} | {
            r.evict_target_uid for recs in self.ctx.pod_records.values() if (r := recs.get(rec.key)) is not None
        }
        if any(uid is not None and self._evicted_pod(uid) for uid in chosen):
            self.next_records[rec.key] = replace(rec, step="Evict", step_time=self.now, evict_target_uid=None)
            return
        if not targets:
            return
        d = targets[0]
        aimed = replace(rec, evict_target_uid=d.pod.uid)
        self.next_records[rec.key] = aimed
        # on the pod, its own record of the total (the steps fired on it) gains the target
        recs = self.ctx.pod_records.setdefault(d.pod.uid, {})
        own = recs.get(rec.key) or replace(rec, step=None, step_time=None)
        recs[rec.key] = replace(own, evict_target_uid=d.pod.uid)
        self.ctx.dirty.add(d.pod.uid)
        self._emit_evict(_Fire(aimed, m, None, None), d)

    def _evicted_pod(self, uid: str) -> bool:
        """Whether the pod with ``uid`` is terminating, finished or gone."""
        pod = self.ctx.pods_by_uid.get(uid)
        return pod is None or pod.terminating or pod.phase in ("Succeeded", "Failed")

    def _reapply_throttle(self, rec: ViolationRecord, m: _Measure) -> None:
        """Throttle is level-triggered: a pod that a fired Throttle step holds but
        whose CPU is not at the step's target (the resize was refused or never
        made, or a container was raised since) is resized again, without a new
        step. Only while the budget enforces, on fresh data (``m`` known)."""
        if not self.acting or rec.dry_run or step_rank(rec.step) < step_rank("Throttle"):
            return
        rung = self._ladder(rec.key).rung("Throttle")
        if rung is None or rung.cpu_limit is None:
            return
        holders = [m.pod] if m.pod is not None else self._total_throttle_holders(rec.key)
        for d in holders:
            if d.pod.uid in self.ctx.evicting:
                continue  # being evicted: no point in resizing it
            self._emit_throttle(_Fire(rec, m, *self._next(rec, m)), d, rung, reapply=True)

    def _total_throttle_holders(self, key: ViolationKey) -> list[_PodData]:
        """The measured pods that a total's Throttle step was fired on (their annotation says so)."""
        out = []
        for uid, recs in self.ctx.pod_records.items():
            r = recs.get(key)
            d = self.ctx.pod_data.get(uid)
            if r is not None and d is not None and d.state == "Fresh" and _throttled(r):
                out.append(d)
        return sorted(out, key=lambda d: d.pod.name)

    def _targets(self, action: Action, m: _Measure) -> list[_PodData]:
        if m.pod is not None:
            return [m.pod]
        known = [d for d in self.data if (d.vram if m.key.kind == "TotalVRAM" else d.ram) is not None]
        if action == "Annotate":
            return known
        attr = "vram" if m.key.kind == "TotalVRAM" else "ram"
        largest = max(known, key=lambda d: (getattr(d, attr) or 0, d.pod.name), default=None)
        return [] if largest is None else [largest]

    def _next(self, rec: ViolationRecord, m: _Measure | None) -> tuple[Action | None, datetime | None]:
        rung = self._ladder(rec.key).next_after(rec.step)
        if rung is None or rec.opened_at is None:
            return None, None
        return rung.action, self._due(rec, rung, m)

    def _close(self, rec: ViolationRecord, m: _Measure | None, cause: str) -> None:
        """Close an open violation: Recover decisions and annotation removal."""
        self.next_records.pop(rec.key, None)
        observed = (m.observed if m is not None else rec.observed_bytes) or 0
        limit = m.limit if m is not None else (rec.limit_bytes or 0)
        text = (
            f"budget {self.ref.namespace}/{self.ref.name}: {self._subject(rec.key)} back to "
            f"{self._value(rec.key, observed)} (limit {self._value(rec.key, limit)}): violation closed ({cause})"
        )
        holders = [uid for uid, recs in self.ctx.pod_records.items() if rec.key in recs]
        pods = [self.ctx.pods_by_uid[uid] for uid in holders]
        for uid in holders:
            del self.ctx.pod_records[uid][rec.key]
            self.ctx.dirty.add(uid)
        refs: list[PodRef | None]
        if rec.key.pod is not None:
            pod = next((p for p in self.ns_pods if p.name == rec.key.pod), None)
            refs = [pod.ref] if pod is not None else [None]
        else:
            # the budget-level closure, plus the pods it throttled (their CPU comes back)
            throttled = [p for p in pods if ANNOTATION_ORIGINAL_CPU in p.annotations]
            refs = [None, *(p.ref for p in throttled)]
        for ref in refs:
            self.ctx.decisions.append(
                Recover(
                    budget=self.ref,
                    violation=rec.key,
                    pod=ref,
                    time=self.now,
                    observed_bytes=observed,
                    limit_bytes=limit,
                    event=EventSpec("Normal", EVENT_RECOVERED, text),
                    cause=cause,
                )
            )

    def _unmeasured(self, matched: list[PodFacts]) -> None:
        """Records whose key was not measured: their pod is terminating, gone,
        no longer selected, or not running."""
        by_name = {p.name: p for p in self.ns_pods}
        for key, rec in self.records.items():
            if key in self.measured:
                continue
            pod = by_name.get(key.pod) if key.pod is not None else None
            if key.pod is None:
                self.next_records[key] = rec  # a total with no data this time
            elif pod is None or pod.phase in ("Succeeded", "Failed"):
                self._drop_on_pods(key)  # gone or done: nothing to undo
            elif pod.uid not in self._matched_uids:
                if rec.opened_at is not None:
                    self._close(rec, None, "NoLongerSelected")
                else:
                    self._drop_on_pods(key)
            elif pod.terminating and rec.opened_at is not None:
                self.next_records[key] = self._evicted(rec)
            else:
                self.next_records[key] = rec

    def _evicted(self, rec: ViolationRecord) -> ViolationRecord:
        rung = self._ladder(rec.key).next_after(rec.step)
        if rung is not None and rung.action == "Evict":
            due = self._due(rec, rung, None)
            if due is not None and self.now >= due:
                return replace(rec, step="Evict", step_time=self.now, dry_run=not self.acting)
        return rec

    def _drop_on_pods(self, key: ViolationKey) -> None:
        for uid, recs in self.ctx.pod_records.items():
            if key in recs:
                del recs[key]
                self.ctx.dirty.add(uid)

    def _record_on_pod(self, pod: PodFacts, rec: ViolationRecord) -> None:
        recs = self.ctx.pod_records.setdefault(pod.uid, {})
        old = recs.get(rec.key)
        recs[rec.key] = rec if old is None else merge_records(old, rec)
        self.ctx.dirty.add(pod.uid)

    # -- decisions

    def _emit(self, cls: type[DecisionBase], f: _Fire, d: _PodData | None, event: EventSpec, **extra: Any) -> None:
        self.ctx.decisions.append(
            cls(
                budget=self.ref,
                violation=f.rec.key,
                pod=None if d is None else d.pod.ref,
                time=self.now,
                observed_bytes=f.m.observed or 0,
                limit_bytes=f.m.limit,
                event=event,
                next_step=f.next_step,
                next_step_time=f.next_time,
                **extra,
            )  # type: ignore[arg-type]
        )

    def _emit_dry(self, f: _Fire, action: Action, d: _PodData | None) -> None:
        text = f"dry run: would {_VERB[action]}. {self._text(f, None)}"
        self._emit(DryRunStep, f, d, EventSpec("Warning", EVENT_DRY_RUN, text), would=action)

    def _emit_throttle(self, f: _Fire, d: _PodData, rung: LadderStep, reapply: bool = False) -> None:
        """A Throttle decision for ``d`` (``reapply``: only when something is to resize)."""
        # a pod throttled earlier in this evaluation is planned from its new resources
        pod = self.ctx.resized.get(d.pod.uid, d.pod)
        recorded = self.ctx.new_original.get(pod.uid) or parse_original(pod.annotations.get(ANNOTATION_ORIGINAL_CPU))
        cpu = rung.cpu_limit or self.ctx.config.default_throttle_cpu
        plan = plan_throttle(pod, cpu, recorded)
        if reapply:
            if not plan.resize:
                return
            self.ctx.new_original[pod.uid] = plan.original
            self.ctx.resized[pod.uid] = _resized(pod, plan.resize)
            self.ctx.dirty.add(pod.uid)
            text = f"{self._text(f, None)} Throttle re-applied: CPU limit set to {cpu} again."
            event = EventSpec("Warning", EVENT_THROTTLED, text)
            self._emit(Throttle, f, d, event, resize=plan.resize, original=plan.original, reapply=True)
            return
        if plan.impossible_reason is None:
            self.ctx.new_original[pod.uid] = plan.original
            self.ctx.resized[pod.uid] = _resized(pod, plan.resize)
            event = EventSpec("Warning", EVENT_THROTTLED, self._text(f, "Throttle", cpu))
        else:
            text = f"{self._text(f, None)} Throttle impossible: {plan.impossible_reason}"
            event = EventSpec("Warning", EVENT_THROTTLE_IMPOSSIBLE, text)
        self._emit(
            Throttle,
            f,
            d,
            event,
            resize=plan.resize,
            original=plan.original,
            impossible_reason=plan.impossible_reason,
        )

    def _emit_evict(self, f: _Fire, d: _PodData) -> None:
        if d.pod.uid in self.ctx.evicting:
            return  # one Evict per pod per evaluation, whichever violation asks first
        self.ctx.evicting.add(d.pod.uid)
        text = self._text(f, "Evict")
        self._emit(Evict, f, d, EventSpec("Warning", EVENT_EVICTING, text), reason=text)

    # -- messages

    def _reason(self, m: _Measure) -> str:
        return EVENT_LEAK_DETECTED if m.key.kind == "Leak" else EVENT_LIMIT_EXCEEDED

    def _subject(self, key: ViolationKey) -> str:
        where = "" if key.device is None else f" on device {key.device}"
        if key.kind == "Leak":
            return f"pod {key.pod}"
        what = {
            "PodVRAM": "VRAM",
            "PodRAM": "RAM",
            "DeviceVRAM": "VRAM",
            "TotalVRAM": "total VRAM",
            "TotalRAM": "total RAM",
        }[key.kind]
        return f"{what} of the selected pods" if key.pod is None else f"{what}{where} of pod {key.pod}"

    def _value(self, key: ViolationKey, v: int) -> str:
        return f"{format_bytes(v)}/h" if key.kind == "Leak" else format_bytes(v)

    def _text(self, f: _Fire, done: Action | None, cpu: str | None = None) -> str:
        """Event text: budget, subject, measured value, limit, what was done, next step and when."""
        key, m = f.rec.key, f.m
        head = f"budget {self.ref.namespace}/{self.ref.name}: "
        if key.kind == "Leak":
            head += f"{self._subject(key)} leaks: {m.detail}."
        else:
            head += (
                f"{self._subject(key)} is {format_bytes(m.observed)}, above its {key.kind} limit "
                f"{format_bytes(m.limit)} since {format_time(f.rec.since)}."
            )
        if done == "Throttle":
            head += f" Throttled: CPU limit set to {cpu}."
        elif done is not None:
            head += f" {_DONE[done].capitalize()}."
        if f.next_step is None:
            return head + " No further step."
        if f.next_time is None:
            return head + f" Next: {f.next_step} when the projected exhaustion is near."
        return head + f" Next: {f.next_step} at {format_time(f.next_time)}."

    # -- warnings

    def _warning(self, m: _Measure) -> None:
        """Track usage above the warning threshold (no open violation)."""
        if m.key.kind == "Leak" or m.observed is None or m.limit <= 0:
            return
        prev = self.prev_warnings.get((m.key.kind, m.key.pod, m.key.device))
        thr = self.spec.warning_threshold
        floor = thr if prev is None else thr - self.ctx.config.recovery_margin
        if m.observed >= floor * m.limit:
            self.warnings.append(_WarnCand(m.observed / m.limit, m.key, m, prev))

    def _carry_warning(self, m: _Measure) -> None:
        prev = self.prev_warnings.get((m.key.kind, m.key.pod, m.key.device))
        if prev is not None:
            ratio = prev.observed_bytes / max(1, prev.limit_bytes)
            self.warnings.append(_WarnCand(ratio, m.key, None, prev))

    def _settle_warnings(self) -> list[LimitWarning]:
        """The warnings kept in status (highest share of the limit first, bounded);
        a Warn decision for each that is new. Warnings beyond the bound get no
        Event: they could not be remembered, and would warn at every evaluation."""
        ordered = sorted(self.warnings, key=lambda c: (-c.ratio, c.key.kind, c.key.pod or "", c.key.device or ""))
        kept = []
        for c in ordered[: self.ctx.config.max_status_entries]:
            if c.prev is not None and (c.m is None or c.m.observed is None):
                kept.append(c.prev)
                continue
            assert c.m is not None and c.m.observed is not None
            since = c.prev.since if c.prev is not None else self.now
            kept.append(
                LimitWarning(
                    kind=c.key.kind,
                    pod=c.key.pod,
                    device=c.key.device,
                    observedBytes=c.m.observed,
                    limitBytes=c.m.limit,
                    since=since,
                )
            )
            if c.prev is None:
                self._emit_warn(c.m)
        return kept

    def _emit_warn(self, m: _Measure) -> None:
        thr = self.spec.warning_threshold
        observed = m.observed or 0
        text = (
            f"budget {self.ref.namespace}/{self.ref.name}: {self._subject(m.key)} is "
            f"{format_bytes(observed)}, {observed / m.limit:.0%} of its {m.key.kind} limit "
            f"{format_bytes(m.limit)} (warning threshold {thr:.0%})."
        )
        nxt = self._ladder(m.key).next_after(None)
        text += f" Next: a violation, then {nxt.action}." if nxt else ""
        f = _Fire(ViolationRecord(m.key, self.ref.uid, self.now), m, None, None)
        self._emit(Warn, f, m.pod, EventSpec("Warning", EVENT_ABOVE_WARNING, text), threshold=thr)

    # -- status

    def _status(self, matched: list[PodFacts]) -> GPUMemoryBudgetStatus:
        cfg = self.ctx.config
        records = sorted(self.next_records.values(), key=_status_order)
        opened = [r for r in records if r.opened_at is not None]
        violations = [self._violation(r) for r in records[: cfg.max_status_entries]]
        leaks = sum(1 for r in opened if r.key.kind == "Leak")
        vio_msg = "; ".join(
            f"{r.key.label()} {r.key.pod or 'total'} ({'would ' if r.dry_run else ''}{r.step or 'open'})"
            for r in opened[:20]
        )
        warnings = self._settle_warnings()
        more = len(self.warnings) - len(warnings)
        warn_msg = "; ".join(
            f"{w.kind} {w.pod or 'total'} {format_bytes(w.observed_bytes)}/{format_bytes(w.limit_bytes)}"
            for w in warnings[:20]
        ) + (f"; and {more} more" if more > 0 else "")
        stale = sorted({d.pod.node_name or "" for d in self.data if d.state == "Stale"})
        missing = sorted({d.pod.node_name or "" for d in self.data if d.state == "Missing"})
        mode: Mode = "Enforce" if self.enforce else "DryRun"
        wanted = [
            bs.ready(f"selects {len(matched)} pods; mode {mode}"),
            bs.violating(len(opened) - leaks, leaks, f"{len(opened)} open: {vio_msg}"),
            bs.warning(len(self.warnings), warn_msg),
            bs.data_stale(stale, missing),
        ]
        gen = self.budget.metadata.generation
        return GPUMemoryBudgetStatus(
            observedGeneration=gen,
            conditions=bs.settle_conditions(wanted, self.prev_status.conditions, gen, self.now),
            effectiveMode=mode,
            matchedPods=len(matched),
            usage=self._usage(),
            openViolations=len(opened),
            violations=violations or None,
            warnings=warnings or None,
        )

    def _usage(self) -> BudgetUsage:
        vram = [d.vram for d in self.data if d.vram is not None]
        ram = [d.ram for d in self.data if d.ram is not None]
        tot = self.spec.limits.total
        vram_sum = sum(vram) if vram else None
        ram_sum = sum(ram) if ram else None
        return BudgetUsage(
            vramBytes=vram_sum,
            ramBytes=ram_sum,
            vram=bs.display(vram_sum, tot.vram_bytes() if tot else None),
            ram=bs.display(ram_sum, tot.ram_bytes() if tot else None),
        )

    def _violation(self, rec: ViolationRecord) -> Violation:
        m = self.measured.get(rec.key)
        observed = m.observed if m is not None and m.observed is not None else rec.observed_bytes
        limit = m.limit if m is not None else rec.limit_bytes
        nxt, nxt_time = self._next(rec, m)
        if rec.opened_at is None:
            msg = f"above the limit since {format_time(rec.since)}, within the tolerance"
        elif m is None or m.over is None:
            msg = "no fresh measured data: escalation paused"
        else:
            msg = m.detail or f"{self._subject(rec.key)} {format_bytes(observed)} > {format_bytes(limit)}"
            msg += self._throttle_note(rec, m)
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
            message=msg[:1024],
        )

    def _throttle_note(self, rec: ViolationRecord, m: _Measure) -> str:
        """Why a fired Throttle step could not resize the pod, for the status message."""
        if rec.step != "Throttle" or m.pod is None or not self.acting:
            return ""
        pod = m.pod.pod
        if ANNOTATION_ORIGINAL_CPU in pod.annotations or pod.uid in self.ctx.new_original:
            return ""
        rung = self.ladder.rung("Throttle") or self.leak_ladder.rung("Throttle")
        plan = plan_throttle(pod, rung.cpu_limit if rung and rung.cpu_limit else "100m", None)
        return "" if plan.impossible_reason is None else f"; throttle impossible: {plan.impossible_reason}"

    def _invalid_status(self, message: str) -> GPUMemoryBudgetStatus:
        gen = self.budget.metadata.generation
        prev = self.prev_status
        # keep the escalation state: nothing is decided on an invalid spec
        return prev.model_copy(
            update={
                "observed_generation": gen,
                "conditions": bs.settle_conditions([bs.invalid(message)], prev.conditions, gen, self.now),
            }
        )


def _resized(pod: PodFacts, resize: Iterable[ContainerCPU]) -> PodFacts:
    new = {c.name: c for c in resize}
    containers = tuple(
        replace(c, cpu_limit=new[c.name].limit, cpu_request=new[c.name].request or c.cpu_request)
        if c.name in new
        else c
        for c in pod.containers
    )
    return replace(pod, containers=containers)


def _status_order(r: ViolationRecord) -> tuple[int, int, str, str, str]:
    return (
        0 if r.opened_at is not None else 1,
        -step_rank(r.step),
        r.since.isoformat(),
        r.key.pod or "",
        r.key.kind + (r.key.device or ""),
    )


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


# --- after all budgets: restores and pod patches --------------------------------------


def _throttled(rec: ViolationRecord) -> bool:
    """Whether a Throttle step really fired for ``rec`` (not only in a dry run)."""
    return step_rank(rec.step) >= step_rank("Throttle") and not rec.dry_run


def _restore_untrottled(ctx: _Ctx) -> None:
    """Put back the CPU of pods that vramguard throttled and that no open
    violation holds at Throttle or beyond any more.

    Only containers whose CPU limit is the target of a violation that throttled
    the pod are restored (``ctx.throttle_targets``): ``vramguard.io/original-cpu``
    is an annotation anyone who can update the pod can write, and must not buy
    more CPU than vramguard took. Otherwise the annotation is only removed."""
    for uid, pod in ctx.pods_by_uid.items():
        if pod.terminating or pod.phase != "Running" or ANNOTATION_ORIGINAL_CPU not in pod.annotations:
            continue
        if uid in ctx.new_original:
            continue
        if any(_throttled(r) for r in ctx.pod_records.get(uid, {}).values()):
            continue
        original = parse_original(pod.annotations[ANNOTATION_ORIGINAL_CPU]) or {}
        restore = plan_restore(original, pod, ctx.throttle_targets.get(uid, ()))
        ctx.dirty.add(uid)
        ctx.new_original[uid] = {}
        left = sorted(set(original) - {c.name for c in restore})
        if left or not original:
            ctx.problems.append(
                f"pod {pod.namespace}/{pod.name} annotation {ANNOTATION_ORIGINAL_CPU}: "
                f"{', '.join(left) or 'no valid entry'}: not restored (no violation throttled "
                "the container to its current CPU limit); annotation removed"
            )
        if not restore:
            continue
        for i, dec in enumerate(ctx.decisions):
            if isinstance(dec, Recover) and dec.pod == pod.ref and not dec.restore:
                ctx.decisions[i] = replace(dec, restore=restore)
                break
        else:
            key = ViolationKey(pod.namespace, "", "PodVRAM", pod.name)
            msg = f"pod {pod.name} is throttled by vramguard without an open violation: CPU restored"
            ctx.decisions.append(
                Recover(
                    budget=BudgetRef(pod.namespace, ""),
                    violation=key,
                    pod=pod.ref,
                    time=ctx.now,
                    observed_bytes=0,
                    limit_bytes=0,
                    event=EventSpec("Normal", EVENT_RECOVERED, msg),
                    restore=restore,
                    cause="OrphanedThrottle",
                )
            )


def _pod_patches(ctx: _Ctx) -> Iterable[PodPatch]:
    for uid in sorted(ctx.dirty, key=lambda u: (ctx.pods_by_uid[u].namespace, ctx.pods_by_uid[u].name)):
        pod = ctx.pods_by_uid[uid]
        recs = ctx.pod_records.get(uid, {})
        want: dict[str, str | None] = {
            ANNOTATION_VIOLATIONS: records_to_annotation(recs.values()) if recs else None,
            ANNOTATION_MESSAGE: _pod_message(ctx, recs.values()) if recs else None,
        }
        if uid in ctx.new_original:
            orig = ctx.new_original[uid]
            want[ANNOTATION_ORIGINAL_CPU] = original_to_annotation(orig) if orig else None
        patch = {k: v for k, v in want.items() if pod.annotations.get(k) != v}
        if patch:
            yield PodPatch(pod.ref, patch)


def _pod_message(ctx: _Ctx, records: Iterable[ViolationRecord]) -> str:
    lines = []
    for r in sorted(records, key=lambda r: (r.key.budget, r.key.kind, r.key.device or "")):
        unit = "/h" if r.key.kind == "Leak" else ""
        text = f"budget {r.key.budget}: {r.key.label()}"
        if r.observed_bytes is not None and r.limit_bytes is not None:
            text += f" {format_bytes(r.observed_bytes)}{unit} > {format_bytes(r.limit_bytes)}{unit}"
        text += f" since {format_time(r.since)}"
        if r.step is not None and r.step_time is not None:
            text += f"; {r.step} at {format_time(r.step_time)}"
        ladder = ctx.ladders.get((r.key.namespace, r.key.budget))
        rung = ladder.next_after(r.step) if ladder is not None else None
        if rung is not None and r.opened_at is not None and rung.after_seconds != float("inf"):
            text += f"; next {rung.action} at {format_time(r.opened_at + timedelta(seconds=rung.after_seconds))}"
        lines.append(text)
    return "; ".join(lines)


__all__ = ["evaluate"]
