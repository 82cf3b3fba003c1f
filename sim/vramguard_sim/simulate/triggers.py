"""Which pods the simulated operator evaluates at a tick, and why that is
enough (docs/simulation.md, "Evaluating only what changed").

The engine is pure: what it decides for a pod depends on the pod's budgets,
its usage, its escalation *state* (the status entries and annotation that
name it) and ``now``. Its rules compare usage with levels (a warning
threshold, a limit, a recovery level below it) and time with due times. So,
for one state, the usages at which an evaluation does nothing form an
interval, and the *quiet* state (no violation, pending or open, no warning,
no escalation annotation) starts at zero: a usage at or below one the engine
found quiet is quiet too. A pod is therefore evaluated at a tick only when:

- its lifecycle changed (scheduled, container died or restarted, terminating),
  or a pod sharing its budget (or, with ``couple_devices``, its device) is gone;
- its VRAM left the interval of usages evaluated without effect in its
  current state, widened by the band (``max(band_bytes, band_fraction ×
  value)``, the agent's publishing dead-band). An evaluation that decided
  something or changed the state starts a new, empty interval;
- for a budget with a total limit, the sum over its pods left its interval;
- time: a step of one of its violations comes due (``nextStepTime``); every
  tick while a violation is pending (its tolerance runs) or can only come due
  by a leak projection; the tick after something was decided on it; and at
  least every ``refresh_s`` anyway;
- its trend features were recomputed, when a leak-detecting budget selects it.

The set is closed over budgets (every pod a budget selects, with the budget:
a budget's status is computed from all its pods) and, with
``couple_devices``, over the devices that may be under a rule's threshold
(every pod sharing such a device with one evaluated, for a rule that compares
the pods of a device: the device-pressure rule, which turns it on
(``Vramguard``); the budgets' rules do not). A device is *clear* while its
last evaluation with all its pods found it ``Clear`` (free memory at least
the threshold) with a slack of ``free - threshold`` bytes, its pods are the
same (none came, went, began terminating or finished), and what moved since
cannot have used that slack up: the threshold is the largest of the rules'
minimums (fixed per device) and of the rooms of pods within their shares
(``share - used``, each moving by what its pod's use moves), so the slack
shrinks by at most the change in the device's used memory plus the sum of
its pods' changes. On a clear device the rule decides ``Clear`` for any of
its pods, as for all (fewer pods give a threshold no higher), so a pod there
is evaluated alone; every other device brings all its pods, also when none
of them is due (its slack may be gone). The operator's incremental loop
rests on the same argument (``plan.coupling``), with another trigger:
there a device's free memory moves only in a new report, which marks its
node's pods. ``exhaustive`` evaluates every pod at every tick; the tests
check it decides the same.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.history import HistoryStore
from vramguard_api.trend import TrendFeatures
from vramguard_operator.engine.outputs import DevicePressureReport
from vramguard_operator.engine.selectors import Matcher, compile_selector
from vramguard_operator.engine.types import ANNOTATION_VIOLATIONS
from vramguard_operator.plan.coupling import device_slacks
from vramguard_sim.simulate.fleet import Fleet, SimPod
from vramguard_sim.simulate.nodes import GPU

if TYPE_CHECKING:
    from vramguard_sim.simulate.control import ControlConfig

BudgetKey = tuple[str, str]
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Simulated time 0 (the engine needs wall-clock times; it works in whole seconds)."""
INF = math.inf
Signature = tuple[Any, ...]


def sim_seconds(when: datetime) -> float:
    """A time the engine wrote, as simulated seconds."""
    return (when - EPOCH).total_seconds()


class _Interval:
    """Values (bytes) evaluated without effect in one state (``sig``), and the
    band around them within which no evaluation is needed. ``quiet_high``:
    the highest value evaluated quiet (the quiet state is the same whenever it
    holds, so it is kept across episodes)."""

    __slots__ = ("sig", "quiet", "quiet_high", "low", "high", "lo", "hi")

    def __init__(self) -> None:
        self.sig: Signature | None = None
        self.quiet = False
        self.quiet_high = -INF
        self.low, self.high = INF, -INF  # empty: any value triggers
        self.lo, self.hi = INF, -INF

    def update(self, value: float, sig: Signature, quiet: bool, changed: bool, band: tuple[int, float]) -> None:
        """After an evaluation at ``value`` that left the state ``sig`` (``quiet``
        when empty); ``changed``: it decided something (for this pod). Only an
        evaluation that began and ended in the same state, deciding nothing,
        proves ``value`` to be without effect in that state."""
        same = sig == self.sig and quiet == self.quiet and not changed
        if quiet:
            if same:
                self.quiet_high = max(self.quiet_high, value)
            self.low, self.high = -INF, self.quiet_high
        elif same:
            self.low, self.high = min(self.low, value), max(self.high, value)
        else:
            self.low, self.high = INF, -INF
        self.sig, self.quiet = sig, quiet
        if self.high == -INF:  # nothing proven: evaluate at the next tick
            self.lo, self.hi = INF, -INF
            return
        self.hi = self.high + max(band[0], band[1] * max(self.high, 0.0))
        self.lo = -INF if self.low == -INF else self.low - max(band[0], band[1] * max(self.low, 0.0))

    def outside(self, value: float) -> bool:
        return value > self.hi or value < self.lo


class _Track:
    """A pod's trigger state: its usage interval, when it is due anyway, and
    the state its implicit budget's status gives it."""

    __slots__ = ("usage", "refresh_at", "wake", "due", "implicit_sig")

    def __init__(self, refresh_at: float) -> None:
        self.usage = _Interval()
        self.refresh_at = refresh_at
        self.wake = INF
        self.due = refresh_at
        self.implicit_sig: Signature = ()


class Triggers:
    """The trigger state of one run (see the module doc)."""

    def __init__(self, budgets: Mapping[BudgetKey, GPUMemoryBudget], config: ControlConfig, tick_s: float) -> None:
        self.config = config
        self.tick_s = tick_s
        self.band = (config.band_bytes, config.band_fraction)
        self.matchers: dict[BudgetKey, Matcher] = {}
        for key, b in budgets.items():
            try:
                self.matchers[key] = compile_selector(b.spec.selector)
            except ValueError:  # selects nothing; the engine says why in its status
                continue
        self.leak_budgets = {k for k, b in budgets.items() if b.spec.leak_detection and b.spec.leak_detection.enabled}
        self.total_budgets = {k for k, b in budgets.items() if b.spec.limits.total is not None}
        self.pod_budgets: dict[SimPod, tuple[BudgetKey, ...]] = {}
        self.budget_pods: dict[BudgetKey, set[SimPod]] = {k: set() for k in budgets}
        self.budget_wake: dict[BudgetKey, float] = {}
        self.budget_sig: dict[BudgetKey, dict[str | None, Signature]] = {}
        self.totals: dict[BudgetKey, _Interval] = {k: _Interval() for k in self.total_budgets}
        self.tracks: dict[SimPod, _Track] = {}
        # the agent's own history code and defaults, one store per node as each node's agent keeps
        self.trends: dict[str, HistoryStore] = {}
        self.trend_pods: set[SimPod] = set()
        self.last_trend: dict[SimPod, TrendFeatures | None] = {}
        self.clear: dict[int, _ClearDevice] = {}  # id(GPU) -> its last slack, with couple_devices
        self._hot: dict[int, bool] = {}  # this tick's verdicts of ``_is_hot``
        self._coupled: dict[int, tuple[GPU, _ClearDevice]] = {}  # devices evaluated with all their pods

    # --- collecting ---------------------------------------------------------------------

    def collect(self, t: float, fleet: Fleet, exhaustive: bool = False) -> tuple[set[SimPod], set[BudgetKey]]:
        """The pods and budgets to evaluate at ``t``, closed over budgets (and devices)."""
        pods: set[SimPod] = set()
        budgets: set[BudgetKey] = set()
        for p in fleet.removed:
            for key in self.pod_budgets.pop(p, ()):
                self.budget_pods[key].discard(p)
                budgets.add(key)
            if p.gpu is not None and self.config.couple_devices:
                pods.update(q for q in p.gpu.pods if not q.gone)
            self.tracks.pop(p, None)
            self.trend_pods.discard(p)
            self.last_trend.pop(p, None)  # its history ages out of the store
        for p in fleet.changed:
            if not p.gone and p.gpu is not None:
                if p not in self.tracks:
                    self._see(p, t)
                pods.add(p)
        self._sample_trends(t, pods)
        for p, tr in self.tracks.items():  # every pod, every tick: kept flat
            proc = p.proc
            v = proc.used_bytes if proc is not None else 0
            u = tr.usage
            if v > u.hi or v < u.lo or t >= tr.due:
                pods.add(p)
        self._hot, self._coupled = {}, {}
        if self.config.couple_devices:
            for node in fleet.nodes:
                for gpu in node.gpus:
                    if gpu.pods and self._is_hot(gpu):
                        pods.update(q for q in gpu.pods if not q.gone and q in self.tracks)
        for key, interval in self.totals.items():
            if interval.outside(sum(p.held() for p in self.budget_pods[key] if not p.terminating)):
                budgets.add(key)
        budgets.update(k for k, at in self.budget_wake.items() if at <= t)
        if exhaustive:
            pods.update(self.tracks)
            budgets.update(self.budget_pods)
        return self._closure(pods, budgets)

    def _sample_trends(self, t: float, pods: set[SimPod]) -> None:
        """As each node's agent samples: every pod's value into its node's history,
        then the features on their schedule (``HistoryStore.trends``, with its cap
        on refreshes per tick); a pod whose features were recomputed is due."""
        by_node: dict[str, list[SimPod]] = {}
        for p in self.trend_pods:
            if p.gpu is not None:
                by_node.setdefault(p.gpu.node.name, []).append(p)
        for node, members in by_node.items():
            store = self.trends.get(node)
            if store is None:
                store = self.trends[node] = HistoryStore()
            values = {p.uid: p.held() for p in members}
            store.add(t, values)
            found = store.trends(values, t)
            for p in members:
                features = found.get(p.uid)
                if features is not self.last_trend.get(p):  # recomputed now
                    self.last_trend[p] = features
                    pods.add(p)

    def _see(self, pod: SimPod, t: float) -> None:
        keys = tuple(
            k for k, match in self.matchers.items() if k[0] == pod.namespace and match(pod.labels)
        )
        self.pod_budgets[pod] = keys
        for k in keys:
            self.budget_pods[k].add(pod)
        if any(k in self.leak_budgets for k in keys):
            self.trend_pods.add(pod)
        # refreshes spread over the interval, so that pods started together do not all refresh together
        offset = (zlib.crc32(pod.uid.encode()) % 1000) / 1000 * self.config.refresh_s
        self.tracks[pod] = _Track(t + offset)

    def _closure(self, pods: set[SimPod], budgets: set[BudgetKey]) -> tuple[set[SimPod], set[BudgetKey]]:
        todo = [p for k in budgets for p in self.budget_pods.get(k, ())]
        todo.extend(pods)
        seen: set[SimPod] = set()
        while todo:
            p = todo.pop()
            if p in seen or p.gone or p.gpu is None or p not in self.tracks:
                continue
            seen.add(p)
            if self.config.couple_devices and self._is_hot(p.gpu):
                todo.extend(p.gpu.pods)
                if id(p.gpu) not in self._coupled:
                    self._coupled[id(p.gpu)] = (p.gpu, _ClearDevice.now(p.gpu, 0))
            for k in self.pod_budgets.get(p, ()):
                if k not in budgets:
                    budgets.add(k)
                    todo.extend(self.budget_pods[k])
        for p in seen:
            self.tracks[p].wake = INF  # recomputed from this evaluation's statuses
        return seen, budgets

    def _is_hot(self, gpu: GPU) -> bool:
        """Whether the device may be under a rule's threshold (see the module doc)."""
        hot = self._hot.get(id(gpu))
        if hot is None:
            kept = self.clear.get(id(gpu))
            hot = self._hot[id(gpu)] = kept is None or kept.used_up(gpu)
        return hot

    def devices_judged(self, reports: Iterable[DevicePressureReport]) -> None:
        """After a tick's evaluations: each device evaluated with all its pods is
        clear with the slack its reports give (``plan.coupling.device_slacks``,
        the operator's measure), not clear when a report is not ``Clear``, and
        clear without limit when no report names it (no pod on it has a rule)."""
        slack = device_slacks(reports)
        for key, (gpu, seen) in self._coupled.items():
            found = slack.get(gpu.uuid, INF)
            if found < 0:
                self.clear.pop(key, None)
            else:
                self.clear[key] = _ClearDevice(seen.members, seen.used, seen.held, found)

    def trend_features(self) -> dict[str, TrendFeatures]:
        """The current trend features of the pods a leak-detecting budget selects, by uid."""
        return {p.uid: f for p, f in self.last_trend.items() if f is not None}

    # --- after an evaluation ------------------------------------------------------------

    def budget_status(self, key: BudgetKey, status: GPUMemoryBudgetStatus, t: float) -> None:
        """A real budget's new status: its entries by pod, when it is due again."""
        by_pod: dict[str | None, list[Any]] = {}
        for entry in (*(status.violations or ()), *(status.warnings or ())):
            by_pod.setdefault(entry.pod, []).append(_entry_sig(entry))
        self.budget_sig[key] = {pod: tuple(entries) for pod, entries in by_pod.items()}
        self.budget_wake[key] = _wake(status, t, self.tick_s)

    def implicit_status(self, pod: SimPod, status: GPUMemoryBudgetStatus, t: float) -> None:
        """The new status of ``pod``'s implicit budget."""
        tr = self.tracks.get(pod)
        if tr is not None:
            tr.implicit_sig = tuple(_entry_sig(e) for e in (*(status.violations or ()), *(status.warnings or ())))
            tr.wake = min(tr.wake, _wake(status, t, self.tick_s))

    def settle(self, pod: SimPod, t: float) -> None:
        """Something was done to ``pod``: evaluate it again at the next tick."""
        tr = self.tracks.get(pod)
        if tr is not None:
            tr.wake = min(tr.wake, t + self.tick_s)

    def evaluated(self, t: float, pods: Iterable[SimPod], budgets: Iterable[BudgetKey], decided: set[str]) -> None:
        """Record each evaluated pod's (and total budget's) value, state and
        next due time; ``decided``: uids of pods something was decided on."""
        for p in pods:
            tr = self.tracks.get(p)
            if tr is None or p.gone:
                continue
            sig = self._signature(p, tr)
            changed = p.uid in decided
            if changed:
                tr.wake = min(tr.wake, t + self.tick_s)
            tr.usage.update(p.held(), sig, not any(sig), changed, self.band)
            tr.refresh_at = t + self.config.refresh_s
            tr.due = min(tr.refresh_at, tr.wake)
        for key in budgets:
            interval = self.totals.get(key)
            if interval is not None:
                members = self.budget_pods[key]
                sig = tuple(sorted(self.budget_sig.get(key, {}).items(), key=lambda kv: kv[0] or ""))
                changed = any(p.uid in decided for p in members)
                total = sum(p.held() for p in members if not p.terminating)
                interval.update(total, sig, not sig, changed, self.band)

    def _signature(self, pod: SimPod, tr: _Track) -> Signature:
        """The pod's escalation state: its annotation and the status entries
        naming it (or its budgets' totals), measured values left out."""
        parts: list[Any] = [pod.facts.annotations.get(ANNOTATION_VIOLATIONS), tr.implicit_sig]
        for k in self.pod_budgets.get(pod, ()):
            entries = self.budget_sig.get(k, {})
            parts.append(entries.get(pod.name, ()))
            parts.append(entries.get(None, ()))
        return tuple(parts) if any(parts) else ()


class _ClearDevice:
    """A device evaluated with all its pods and found ``Clear``: its pods
    (uid, terminating, phase), its used memory and each pod's (bytes) then,
    and its slack (free memory above the threshold, bytes; ``inf`` when no
    pod on it has a rule)."""

    __slots__ = ("members", "used", "held", "slack")

    def __init__(self, members: frozenset[tuple[str, bool, str]], used: int, held: dict[str, int],
                 slack: float) -> None:
        self.members, self.used, self.held, self.slack = members, used, held, slack

    @classmethod
    def now(cls, gpu: GPU, slack: float) -> _ClearDevice:
        live = [q for q in gpu.pods if not q.gone]
        members = frozenset((q.uid, q.terminating, q.facts.phase) for q in live)
        return cls(members, gpu.device.used_bytes, {q.uid: q.held() for q in live}, slack)

    def used_up(self, gpu: GPU) -> bool:
        """Whether its pods changed, or what moved since may exceed the slack."""
        live = [q for q in gpu.pods if not q.gone]
        if frozenset((q.uid, q.terminating, q.facts.phase) for q in live) != self.members:
            return True
        if self.slack == INF:
            return False
        moved = abs(gpu.device.used_bytes - self.used) + sum(abs(q.held() - self.held[q.uid]) for q in live)
        return moved > self.slack


def _entry_sig(entry: Any) -> Signature:
    """A violation or warning entry without its measured values."""
    return (
        entry.kind, entry.pod, entry.device, entry.since, getattr(entry, "opened_at", None),
        getattr(entry, "step", None), getattr(entry, "step_time", None), getattr(entry, "dry_run", None),
        getattr(entry, "next_step", None), getattr(entry, "next_step_time", None),
        getattr(entry, "evict_target_uid", None), entry.limit_bytes,
    )


def _wake(status: GPUMemoryBudgetStatus, t: float, tick_s: float) -> float:
    """When a budget with this status must be evaluated again without any
    change: when its next step is due (at the next tick while one is pending
    or can only come due by projection); never (``inf``) otherwise."""
    soonest = INF
    for v in status.violations or ():
        if v.opened_at is None or (v.next_step is not None and v.next_step_time is None):
            return t + tick_s
        if v.next_step_time is not None:
            soonest = min(soonest, max(t + tick_s, sim_seconds(v.next_step_time)))
    return soonest
