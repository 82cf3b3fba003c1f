"""What the device-pressure rule's verdicts do (docs/device-pressure.md): the
decisions, the DevicePressure entries of the chosen pods' budgets' statuses,
and the devices' reports.

- ``Act`` on an enforcing pod: an ``Evict`` (reason ``DevicePressure``) with
  the other enforcing candidates, in rank order, as ``alternatives``, and the
  ``DeviceWillRunOut`` Event for when none can be evicted. Level-triggered as
  the ladder's Evict: returned at every evaluation while the device is under
  pressure and the pod runs; its terminating is the record.
- ``Act`` on a pod in DryRun: a ``DryRunStep`` ("would evict"), once: its
  status entry (``dryRun: true``) says it was announced.
- The chosen pod's budget (the one that set its share, else the first that
  selects it) gets a status entry of kind DevicePressure (step Evict); it is
  kept while that pod is leaving (``Waiting``) or its device's data is
  unknown, and dropped otherwise. A pod no budget selects has no entry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from vramguard_api import conditions as C
from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus, Violation
from vramguard_api.steps import Action
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.engine import messages
from vramguard_operator.engine.inputs import EngineInput
from vramguard_operator.engine.keys import (
    EVENT_DEVICE_PRESSURE,
    EVENT_DEVICE_WILL_RUN_OUT,
    EVENT_DRY_RUN,
    BudgetRef,
    ViolationKey,
)
from vramguard_operator.engine.measure import Node
from vramguard_operator.engine.outputs import Decision, DevicePressureReport, DryRunStep, EventSpec, Evict
from vramguard_operator.engine.pressure import Occupant, Verdict, decide
from vramguard_operator.engine.pressure_facts import KIND, Previous, PreviousKey, device_facts, previous_entries
from vramguard_operator.engine.work import Selection

D = TypeVar("D", Evict, DryRunStep)
BudgetKey = tuple[str, str]
"""(namespace, name) of a budget."""


@dataclass(slots=True)
class PressureResult:
    """The decisions, the status entries by budget and the device reports."""

    decisions: list[Decision] = field(default_factory=list)
    entries: dict[BudgetKey, list[Violation]] = field(default_factory=lambda: defaultdict(list))
    devices: list[DevicePressureReport] = field(default_factory=list)


def evaluate_pressure(
    inp: EngineInput,
    nodes: Mapping[str, Node],
    selections: Sequence[Selection],
    evicting: Iterable[str],
    now: datetime,
    held_namespaces: frozenset[str] = frozenset(),
) -> PressureResult:
    """The device-pressure rule over one evaluation, after its budgets
    (``selections``: the valid budgets as evaluated; ``evicting``: pods a
    budget's Evict was returned for; ``held_namespaces``: namespaces with a
    held budget, whose pods' shares are unknown)."""
    facts = device_facts(inp, nodes, selections, evicting, held_namespaces)
    if not facts and not inp.pressure_rules:
        return PressureResult()
    previous = previous_entries(inp)
    verdicts = [decide(d) for d in facts]
    judged = {d.uuid for d in facts}
    pods = {(p.namespace, p.name): p for p in inp.pods if p.phase not in ("Succeeded", "Failed")}
    unseen = [
        k
        for k in previous
        if k[2] not in judged
        and (pod := pods.get((k[0], k[1]))) is not None
        and (node := nodes.get(pod.node_name or "")) is not None
        and node.state != "Fresh"
    ]
    return outcome(verdicts, previous, unseen, now)


def outcome(
    verdicts: Sequence[Verdict],
    previous: Mapping[PreviousKey, Previous],
    keep_unseen: Iterable[PreviousKey],
    now: datetime,
) -> PressureResult:
    """What ``verdicts`` do at ``now``. ``previous``: the DevicePressure entries of
    the budgets' statuses; ``keep_unseen``: those whose device was not judged
    (its node's report is stale or missing) and whose pod is still there: kept."""
    res = PressureResult()
    for v in verdicts:
        res.devices.append(_report(v))
        if v.kind == "Act":
            _act(res, v, previous, now)
        elif v.kind == "Waiting":
            for o in v.waiting_for:
                _keep(res, previous, o, v.device.uuid, messages.pressure_entry_message(v, o, "Leaving"))
        elif v.kind == "Unknown":
            for o in v.device.occupants:
                _keep(res, previous, o, v.device.uuid, None)
    for key in keep_unseen:
        prev = previous[key]
        res.entries[(prev.budget.namespace, prev.budget.name)].append(prev.entry)
    return res


def _report(v: Verdict) -> DevicePressureReport:
    d, chosen = v.device, v.chosen
    return DevicePressureReport(
        node=d.node,
        device=d.uuid,
        state=v.kind,
        free_bytes=d.free,
        usable_bytes=d.usable,
        min_free_bytes=v.min_free,
        chosen=None if chosen is None else chosen.pod,
        protected=len(v.protected),
        reason=d.unknown_reason,
    )


def _key(o: Occupant, uuid: str) -> ViolationKey:
    home = o.home.name if o.home is not None else ""
    return ViolationKey(o.pod.namespace, home, KIND, o.pod.name, uuid)


def _act(res: PressureResult, v: Verdict, previous: Mapping[PreviousKey, Previous], now: datetime) -> None:
    o = v.candidates[0]
    uuid = v.device.uuid
    dry = o.mode == "DryRun"
    prev = previous.get((o.pod.namespace, o.pod.name, uuid))
    same = prev is not None and o.home is not None and prev.budget.name == o.home.name and prev.entry.step == Action.EVICT
    announced = same and prev is not None and bool(prev.entry.dry_run) == dry
    since = prev.entry.since if same and prev is not None else now
    step_time = prev.entry.step_time if announced and prev is not None and prev.entry.step_time else now
    if o.home is not None:
        state = "DryRun" if dry else Action.EVICT
        entry = _entry(o, uuid, since, step_time, dry, messages.pressure_entry_message(v, o, state))
        res.entries[(o.home.namespace, o.home.name)].append(entry)
    if not dry:
        alternatives = tuple(_evict(v, c, now) for c in v.candidates[1:] if c.mode == "Enforce")
        exhausted = EventSpec("Warning", EVENT_DEVICE_WILL_RUN_OUT, messages.pressure_exhausted_text(v))
        res.decisions.append(_evict(v, o, now, alternatives, exhausted))
    elif not announced:
        event = EventSpec("Warning", EVENT_DRY_RUN, messages.pressure_evict_text(v, o, dry_run=True))
        res.decisions.append(_make(DryRunStep, v, o, now, event, would=Action.EVICT))


def _make(cls: type[D], v: Verdict, o: Occupant, now: datetime, event: EventSpec, **extra: Any) -> D:
    """A decision of ``cls`` about ``o`` on ``v``'s device (``extra``: ``cls``'s own fields)."""
    return cls(
        budget=o.home if o.home is not None else BudgetRef(o.pod.namespace, ""),
        violation=_key(o, v.device.uuid),
        pod=o.pod,
        time=now,
        observed_bytes=o.used or 0,
        limit_bytes=o.share or 0,
        event=event,
        **extra,
    )


def _evict(
    v: Verdict, o: Occupant, now: datetime, alternatives: tuple[Evict, ...] = (), exhausted: EventSpec | None = None
) -> Evict:
    event = EventSpec("Warning", EVENT_DEVICE_PRESSURE, messages.pressure_evict_text(v, o, dry_run=False))
    return _make(Evict, v, o, now, event, reason=KIND, alternatives=alternatives, exhausted=exhausted)


def _entry(o: Occupant, uuid: str, since: datetime, step_time: datetime, dry: bool, message: str) -> Violation:
    return Violation(
        kind=KIND,
        pod=o.pod.name,
        device=uuid,
        observedBytes=max(0, o.used or 0),
        limitBytes=max(0, o.share or 0),
        since=since,
        openedAt=since,
        step=Action.EVICT,
        stepTime=step_time,
        dryRun=True if dry else None,
        message=message,
    )


def _keep(
    res: PressureResult, previous: Mapping[PreviousKey, Previous], o: Occupant, uuid: str, message: str | None
) -> None:
    """Carry the pod's previous entry on the device (with a new message when given)."""
    prev = previous.get((o.pod.namespace, o.pod.name, uuid))
    if prev is None:
        return
    entry = prev.entry if message is None else prev.entry.model_copy(update={"message": message})
    res.entries[(prev.budget.namespace, prev.budget.name)].append(entry)


def with_entries(
    status: GPUMemoryBudgetStatus, entries: list[Violation], budget: GPUMemoryBudget, now: datetime, bound: int
) -> GPUMemoryBudgetStatus:
    """``status`` with the DevicePressure ``entries`` first in its violations
    (bounded), counted as open, and the Violating condition True (reason
    DevicePressure) when nothing else holds it."""
    if not entries:
        return status
    violations = [*entries, *(status.violations or ())][:bound]
    conditions = list(status.conditions or ())
    for i, c in enumerate(conditions):
        if c.type == C.VIOLATING and c.status != "True":
            pods = ", ".join(f"{e.pod} on {e.device}" for e in entries[:20])
            wanted = bs.ConditionSpec(C.VIOLATING, "True", C.REASON_DEVICE_PRESSURE, f"device pressure: {pods}")
            prev = budget.status.conditions if budget.status is not None else None
            conditions[i] = bs.settle_conditions([wanted], prev, budget.metadata.generation, now)[0]
    return status.model_copy(
        update={
            "violations": violations,
            "open_violations": (status.open_violations or 0) + len(entries),
            "conditions": conditions or None,
        }
    )
