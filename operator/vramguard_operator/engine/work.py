"""What one budget's evaluation reads and returns, and its working state.

Budgets are evaluated one after another. What an earlier budget decided that
a later one must see goes in as ``PassState`` (read-only): the pods' records,
pods being evicted in this evaluation, pods resized in it and the CPU
resources recorded for them. Each budget returns a ``BudgetResult``, and
``evaluate`` merges it into the state handed to the next budget.

``BudgetWork`` is the working state of one budget's evaluation, private to
it: its decisions and records so far, and its changes over the ``PassState``
(a pod's records are copied when the budget first changes them, so the state
it was given is never written). ``result()`` turns it into the ``BudgetResult``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, NamedTuple

from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.steps import Action
from vramguard_operator.engine.caps import LimitsWant
from vramguard_operator.engine.inputs import EngineConfig, PodFacts
from vramguard_operator.engine.keys import BudgetRef, ViolationKey
from vramguard_operator.engine.ladder import Ladder
from vramguard_operator.engine.measure import BudgetLimits, Measure, Node, PodData, pod_data
from vramguard_operator.engine.outputs import Decision, DecisionBase, EventSpec
from vramguard_operator.engine.records import ViolationRecord, event_key, merge_records
from vramguard_operator.engine.throttle import Original

PodRecords = Mapping[str, Mapping[ViolationKey, ViolationRecord]]
"""Pod uid -> violation key -> record: the desired state of the pods' annotations."""


@dataclass(frozen=True, slots=True)
class PassState:
    """What the budgets evaluated so far in this evaluation decided, for the next.

    ``pod_records``: every pod's records (read from its annotation, then as the
    budgets changed them). ``pod_data``: pods already measured (a cache, and
    the pods a total's Throttle re-apply may reach). ``evicting``: pods an
    Evict was returned for (one per pod per evaluation). ``resized``: pods as
    a Throttle left them (planned from their new resources). ``new_original``:
    the ``vramguard.io/original-cpu`` content to write per pod. ``nodes``: the
    node reports as read at ``now``."""

    now: datetime
    config: EngineConfig
    pods_by_uid: Mapping[str, PodFacts]
    pod_records: PodRecords = field(default_factory=dict)
    pod_data: Mapping[str, PodData] = field(default_factory=dict)
    evicting: AbstractSet[str] = frozenset()
    resized: Mapping[str, PodFacts] = field(default_factory=dict)
    new_original: Mapping[str, Original] = field(default_factory=dict)
    nodes: Mapping[str, Node] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Selection:
    """A valid budget as the device-pressure rule reads it after the budgets:
    the budget, its limits in numbers and the unfinished pods it selects
    (``matched``, the list its evaluation built)."""

    ref: BudgetRef
    budget: GPUMemoryBudget
    limits: BudgetLimits
    matched: list[PodFacts]


@dataclass(frozen=True, slots=True)
class BudgetResult:
    """What one budget's evaluation decided.

    ``decisions`` in order; ``pod_records``: the full new records of each pod
    whose records it changed; ``dirty``: pods whose annotations must be
    rewritten; ``throttle_targets``: per pod, the CPU limits of this budget's
    violations that throttled it (what a restore may undo); ``ladder``: the
    budget's ladder, for the pod message; ``pairs``: the pods it selects;
    ``unwritten``: the status should the pod writes of the steps fired now
    fail, and ``step_pods`` those pods; ``explained``: the (pod uid, violation)
    whose step Events are posted now (their records are marked posted once
    they are); ``selection``: what the device-pressure rule reads of it;
    ``limits``: per pod, what the budget wants of its memory limits
    (``engine.caps``). The other fields add to ``PassState``'s."""

    ref: BudgetRef
    status: GPUMemoryBudgetStatus
    unwritten: GPUMemoryBudgetStatus | None = None
    step_pods: frozenset[str] = frozenset()
    explained: frozenset[tuple[str, ViolationKey]] = frozenset()
    decisions: tuple[Decision, ...] = ()
    pod_records: PodRecords = field(default_factory=dict)
    dirty: frozenset[str] = frozenset()
    pod_data: Mapping[str, PodData] = field(default_factory=dict)
    evicting: frozenset[str] = frozenset()
    resized: Mapping[str, PodFacts] = field(default_factory=dict)
    new_original: Mapping[str, Original] = field(default_factory=dict)
    throttle_targets: Mapping[str, frozenset[str]] = field(default_factory=dict)
    ladder: Ladder | None = None
    pairs: int = 0
    selection: Selection | None = None
    limits: Mapping[str, LimitsWant] = field(default_factory=dict)


class Fire(NamedTuple):
    """A decision's subject: the violation's record, its measurement, and the
    ladder's next step with its time (None: no further step, or no time yet)."""

    rec: ViolationRecord
    m: Measure
    next_step: Action | None = None
    next_time: datetime | None = None


class BudgetWork:
    """The working state of one budget's evaluation (see the module doc)."""

    def __init__(self, state: PassState, ref: BudgetRef, acting: bool, ladder: Ladder, leak_ladder: Ladder) -> None:
        self.state = state
        self.ref = ref
        self.now = state.now
        self.config = state.config
        self.acting = acting
        self.ladder = ladder
        self.leak_ladder = leak_ladder
        self.data: list[PodData] = []
        self.decisions: list[Decision] = []
        self.records: dict[ViolationKey, ViolationRecord] = {}  # as read back
        self.next_records: dict[ViolationKey, ViolationRecord] = {}  # as they leave this evaluation
        self.measured: dict[ViolationKey, Measure] = {}
        self._pod_records: dict[str, dict[ViolationKey, ViolationRecord]] = {}
        self._dirty: set[str] = set()
        self._pod_data: dict[str, PodData] = {}
        self._evicting: set[str] = set()
        self._resized: dict[str, PodFacts] = {}
        self._new_original: dict[str, Original] = {}
        self._throttle_targets: dict[str, set[str]] = {}
        self._limits: dict[str, LimitsWant] = {}
        self.unfired: dict[ViolationKey, ViolationRecord] = {}  # records before a step fired now
        self._step_pods: set[str] = set()
        self._explained: set[tuple[str, ViolationKey]] = set()

    def ladder_for(self, key: ViolationKey) -> Ladder:
        """The ladder a violation follows (a leak's may have an extra Evict rung)."""
        return self.leak_ladder if key.kind in LEAK_MEMORY else self.ladder

    # -- pods' records

    def pod_records(self) -> Iterator[tuple[str, Mapping[ViolationKey, ViolationRecord]]]:
        """Every pod's records as they stand now, in a stable order."""
        mine = self._pod_records
        for uid, recs in self.state.pod_records.items():
            yield uid, mine.get(uid, recs)
        for uid, recs in mine.items():
            if uid not in self.state.pod_records:
                yield uid, recs

    def records_on(self, uid: str) -> Mapping[ViolationKey, ViolationRecord]:
        """The pod's records as they stand now."""
        mine = self._pod_records.get(uid)
        return mine if mine is not None else self.state.pod_records.get(uid, {})

    def holders(self, key: ViolationKey) -> list[str]:
        """The pods whose records hold ``key``."""
        return [uid for uid, recs in self.pod_records() if key in recs]

    def _writable(self, uid: str) -> dict[ViolationKey, ViolationRecord]:
        recs = self._pod_records.get(uid)
        if recs is None:
            recs = self._pod_records[uid] = dict(self.state.pod_records.get(uid, {}))
        self._dirty.add(uid)
        return recs

    def put_on_pod(self, uid: str, rec: ViolationRecord) -> None:
        """Set ``rec`` in the pod's records."""
        self._writable(uid)[rec.key] = rec

    def merge_on_pod(self, uid: str, rec: ViolationRecord) -> None:
        """Record a fired step on the pod (merged with the record it has)."""
        recs = self._writable(uid)
        old = recs.get(rec.key)
        recs[rec.key] = rec if old is None else merge_records(old, rec)

    def drop_on_pods(self, key: ViolationKey) -> list[str]:
        """Remove ``key`` from every pod's records; returns those pods."""
        holders = self.holders(key)
        for uid in holders:
            del self._writable(uid)[key]
        return holders

    def fired_on_pod(self, uid: str, before: ViolationRecord, done: ViolationRecord) -> None:
        """Record a step fired now on the pod: its record with the Events not yet
        posted, the record as it was (for the status should the write fail)."""
        self.unfired.setdefault(before.key, before)
        self._step_pods.add(uid)
        self.merge_on_pod(uid, replace(done, events_posted=False))
        self._explained.add((uid, done.key))

    def explaining(self, uid: str, key: ViolationKey) -> None:
        """Note that the Events of ``key``'s step on the pod are posted now."""
        self._explained.add((uid, key))

    def explained(self, uid: str, key: ViolationKey) -> bool:
        """Whether the Events of ``key``'s step on the pod are posted now."""
        return (uid, key) in self._explained

    # -- this evaluation's other changes

    def measure_pods(self, pods: list[PodFacts], nodes: Mapping[str, Node]) -> list[PodData]:
        """The pods' data; each pod is measured once per evaluation."""
        known, mine = self.state.pod_data, self._pod_data
        return [
            known[p.uid] if p.uid in known else mine[p.uid] if p.uid in mine else self._measure(p, nodes) for p in pods
        ]

    def _measure(self, pod: PodFacts, nodes: Mapping[str, Node]) -> PodData:
        d = self._pod_data[pod.uid] = pod_data(pod, nodes)
        return d

    def known_pod_data(self, uid: str) -> PodData | None:
        """The pod's data if any budget measured it in this evaluation so far."""
        return self.state.pod_data.get(uid) or self._pod_data.get(uid)

    def add_throttle_target(self, uid: str, key: ViolationKey) -> None:
        """Note the CPU limit that ``key``'s Throttle set on the pod (a restore may undo it)."""
        rung = self.ladder_for(key).rung(Action.THROTTLE)
        if rung is not None and rung.cpu_limit is not None:
            self._throttle_targets.setdefault(uid, set()).add(rung.cpu_limit)

    def evicting(self, uid: str) -> bool:
        """Whether an Evict was returned for the pod in this evaluation."""
        return uid in self._evicting or uid in self.state.evicting

    def start_evicting(self, uid: str) -> None:
        """Note an Evict returned for the pod."""
        self._evicting.add(uid)

    def current_pod(self, pod: PodFacts) -> PodFacts:
        """The pod as a Throttle earlier in this evaluation left it (else as given)."""
        uid = pod.uid
        return self._resized[uid] if uid in self._resized else self.state.resized.get(uid, pod)

    def recorded_original(self, uid: str) -> Original | None:
        """The CPU resources recorded for the pod in this evaluation, if any."""
        if uid in self._new_original:
            return self._new_original[uid]
        return self.state.new_original.get(uid)

    def has_new_original(self, uid: str) -> bool:
        """Whether this evaluation records CPU resources for the pod."""
        return uid in self._new_original or uid in self.state.new_original

    def throttled_to(self, pod: PodFacts, original: Original) -> None:
        """Note the pod's new resources and the originals to record."""
        self._new_original[pod.uid] = original
        self._resized[pod.uid] = pod
        self._dirty.add(pod.uid)

    def event_key(self, rec: ViolationRecord, what: str) -> str:
        """The Event key of ``what`` (a step, ``Recovered``) for ``rec``'s violation
        (``records.event_key``)."""
        return event_key(self.ref.uid or rec.budget_uid, rec.key, rec.opened_at, what)

    def want_limits(self, uid: str, want: LimitsWant) -> None:
        """Add what this budget wants of the pod's memory limits."""
        old = self._limits.get(uid)
        self._limits[uid] = want if old is None else old.merged(want)

    def emit(self, cls: type[DecisionBase], f: Fire, pod: PodData | None, event: EventSpec, **extra: Any) -> None:
        """Append a decision of ``cls`` about ``f``'s violation on ``pod`` (None: the
        budget); ``extra``: the fields of ``cls`` itself."""
        self.decisions.append(
            cls(
                budget=self.ref,
                violation=f.rec.key,
                pod=None if pod is None else pod.pod.ref,
                time=self.now,
                observed_bytes=f.m.observed or 0,
                limit_bytes=f.m.limit,
                event=event,
                next_step=f.next_step,
                next_step_time=f.next_time,
                **extra,
            )  # type: ignore[arg-type]
        )

    def result(
        self,
        status: GPUMemoryBudgetStatus,
        unwritten: GPUMemoryBudgetStatus | None,
        pairs: int,
        selection: Selection | None = None,
    ) -> BudgetResult:
        """What this budget decided."""
        return BudgetResult(
            ref=self.ref,
            status=status,
            unwritten=unwritten,
            step_pods=frozenset(self._step_pods),
            explained=frozenset(self._explained),
            decisions=tuple(self.decisions),
            pod_records=self._pod_records,
            dirty=frozenset(self._dirty),
            pod_data=self._pod_data,
            evicting=frozenset(self._evicting),
            resized=self._resized,
            new_original=self._new_original,
            throttle_targets={uid: frozenset(t) for uid, t in self._throttle_targets.items()},
            ladder=self.ladder,
            pairs=pairs,
            selection=selection,
            limits=self._limits,
        )
