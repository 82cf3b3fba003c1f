"""Outputs of the pure policy engine: the decisions (each with its Event), the
pod annotation patches, the desired budget statuses and ``EngineOutput``.
Re-exported by ``engine.types`` (see its module doc for the contract and the
apply order)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.memlimits import DeviceMemoryLimit
from vramguard_api.steps import Action
from vramguard_operator.engine.keys import BudgetRef, PodRef, ViolationKey
from vramguard_operator.engine.pressure import VerdictKind

DecisionAction = Literal["Warn", "Recover"] | Action
"""What a decision does: a ladder step (``vramguard_api.steps``), a warning or a recovery
(the ``action`` label of ``vramguard_actions_total``)."""
EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A Kubernetes Event to post on the decision's pod (if any) and on its budget.

    ``key``: the identity of what the Event explains (a step, a recovery or an
    eviction of one violation, ``event_key``), when it has one. The Event's
    name follows from it and the object, so that posting it again (a retry,
    or a restart that finds it unposted) updates the Event instead of adding
    another; None: repeats are counted by content (client-go's correlator)."""

    type: EventType
    reason: str
    message: str
    key: str | None = None


@dataclass(frozen=True, slots=True)
class ContainerCPU:
    """Desired CPU resources of one container in a ``pods/resize`` patch
    (quantity strings; ``request`` None means leave the request unchanged)."""

    name: str
    limit: str
    request: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionBase:
    """Fields shared by every decision.

    ``pod`` is None for a budget-level decision (a Total violation's Warn or
    Recover). ``observed_bytes``/``limit_bytes`` are the measured value and the
    limit (for Leak: growth in bytes per hour and ``minGrowthPerHour``).
    ``next_step``/``next_step_time``: the ladder's next step and when it is due
    (``next_step_time`` None when only a leak's projected exhaustion can make
    it due; both None when the ladder is exhausted). ``time`` is the
    evaluation's ``now`` (whole seconds). ``action`` names the decision for
    metrics and the replay (a ``DryRunStep`` reports the step it stands for).
    ``repost``: the step fired at an earlier evaluation and the pod's record
    says its Events were not all posted (the operator stopped in between):
    post them now (once the action they explain is done), count no new action.
    """

    budget: BudgetRef
    violation: ViolationKey
    pod: PodRef | None
    time: datetime
    observed_bytes: int
    limit_bytes: int
    event: EventSpec
    next_step: Action | None = None
    next_step_time: datetime | None = None
    repost: bool = False

    @property
    def action(self) -> DecisionAction:
        raise NotImplementedError(type(self).__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Warn(DecisionBase):
    """Usage passed ``warningThreshold × limit`` (no violation open): Event only."""

    threshold: float

    @property
    def action(self) -> DecisionAction:
        return "Warn"


@dataclass(frozen=True, slots=True, kw_only=True)
class Annotate(DecisionBase):
    """The Annotate step fired on ``pod``: post the Event; the annotations are in
    ``EngineOutput.pod_patches``."""

    @property
    def action(self) -> DecisionAction:
        return Action.ANNOTATE


@dataclass(frozen=True, slots=True, kw_only=True)
class Throttle(DecisionBase):
    """The Throttle step fired on ``pod``: resize the containers in ``resize``
    (the originals are recorded in ``vramguard.io/original-cpu`` by the pod
    patch, to be written first). ``impossible_reason`` is set (and ``resize``
    empty) when no container can be throttled in place; the step still counts
    as fired, and the reason goes to the Event and the budget status.

    ``reapply`` is True when the step fired at an earlier evaluation and the pod
    is not at the target (see the module doc): resize again, post no Event."""

    resize: tuple[ContainerCPU, ...]
    original: Mapping[str, Mapping[str, str | None]]
    impossible_reason: str | None = None
    reapply: bool = False

    @property
    def action(self) -> DecisionAction:
        return Action.THROTTLE


@dataclass(frozen=True, slots=True, kw_only=True)
class Cap(DecisionBase):
    """The Cap step fired on ``pod``: post the Event. The hard limits themselves
    (``hard_limits``: bytes by GPU UUID, as first written) are in the pod patch
    (``vramguard.io/memory-limits``), which the pod's node agent applies.
    ``impossible_reason`` is set (and ``hard_limits`` empty) when no device of
    the pod can hold a limit (RAM, a MIG device, a device that reports memory
    limits unsupported, an agent without ``--enforce-caps``); the step still
    counts as fired, and the reason goes to the Event and the budget status."""

    hard_limits: Mapping[str, int]
    impossible_reason: str | None = None

    @property
    def action(self) -> DecisionAction:
        return Action.CAP


@dataclass(frozen=True, slots=True, kw_only=True)
class Evict(DecisionBase):
    """Evict ``pod`` through the Eviction API (level-triggered: see module doc).

    A device-pressure eviction (violation kind ``DevicePressure``) may carry
    ``alternatives``: the next pods above their shares on the same device, in
    rank order, each evicted only when every one before it could not be (a
    PodDisruptionBudget, the rate limit, a back-off); and ``exhausted``, the
    Event to post on the pod (and its budget) when none could be: the device
    will run out (docs/device-pressure.md)."""

    reason: str
    alternatives: tuple[Evict, ...] = ()
    exhausted: EventSpec | None = None

    @property
    def action(self) -> DecisionAction:
        return Action.EVICT


@dataclass(frozen=True, slots=True, kw_only=True)
class Recover(DecisionBase):
    """A violation closed (usage back under the limit, pod no longer selected,
    or budget deleted). ``restore``: CPU resources to put back through
    ``pods/resize`` (empty when the pod was not throttled or is still throttled
    by another open violation). The annotation removals are in the pod patch."""

    restore: tuple[ContainerCPU, ...] = ()
    cause: str = "UsageBelowLimit"

    @property
    def action(self) -> DecisionAction:
        return "Recover"


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRunStep(DecisionBase):
    """A step that would have fired (mode DryRun or exempt namespace): Event
    only (message starts with "dry run: would ..."); recorded in budget status."""

    would: Action

    @property
    def action(self) -> DecisionAction:
        return self.would


Decision = Warn | Annotate | Throttle | Cap | Evict | Recover | DryRunStep
SIDE_EFFECT_DECISIONS: tuple[type, ...] = (Annotate, Throttle, Cap, Evict)


@dataclass(frozen=True, slots=True)
class PodPatch:
    """Annotation changes for one pod, as a JSON merge patch on
    ``metadata.annotations`` (``None`` removes the key): ``annotations`` before
    the pod's actions (the escalation state, steps' Events marked unposted),
    ``explained`` once the Events of its steps are posted (the records marked
    posted); either may be empty."""

    pod: PodRef
    annotations: Mapping[str, str | None]
    explained: Mapping[str, str | None] | None = None


@dataclass(frozen=True, slots=True)
class PodMemoryLimits:
    """A pod's driver-enforced memory limits as one evaluation leaves them
    (written, or kept as they are on unknown data): bytes by GPU UUID, as in
    ``vramguard.io/memory-limits``. ``not_held``: the devices where the pod's
    node agent does not report its hard limit ``Applied``. For metrics."""

    pod: PodRef
    limits: Mapping[str, DeviceMemoryLimit]
    not_held: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BudgetStatusUpdate:
    """The desired status of one budget (compare with the current one before writing).

    A budget's status follows its pods: ``unwritten`` is the status to write
    instead when the annotation patch of any pod in ``pods`` failed (the
    steps this evaluation fired on those pods rolled back; None when it fired
    none)."""

    budget: BudgetRef
    status: GPUMemoryBudgetStatus
    unwritten: GPUMemoryBudgetStatus | None = None
    pods: frozenset[str] = frozenset()


ProblemKind = Literal["Pod", "GPUMemoryBudget", "NodeGPUUsage"]


@dataclass(frozen=True, slots=True)
class ObjectProblem:
    """Something wrong with one object, which affects that object only: a budget
    held (``HeldBudget``), a node report not believed, escalation state on a
    pod not obeyed. The operator posts it as a Warning Event on the object
    (once per problem) and counts it. ``namespace`` is empty for a
    cluster-scoped object; ``reason`` is CamelCase (``keys.EVENT_*``)."""

    kind: ProblemKind
    namespace: str
    name: str
    uid: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DevicePressureReport:
    """A device under a device-pressure rule as the last evaluation saw it (for
    metrics and ``vramguard top``): its ``state`` (``pressure.Verdict.kind``),
    free, usable and minimum free memory (bytes; None when unknown), the pod
    chosen (``Act``), the pods within their shares and, for ``Unknown``, why."""

    node: str
    device: str
    state: VerdictKind
    free_bytes: int | None
    usable_bytes: int | None
    min_free_bytes: int | None
    chosen: PodRef | None = None
    protected: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """What one evaluation decided. ``decisions`` are in a stable order (budget,
    violation key, step order); ``pod_patches`` and ``statuses`` hold one entry
    per pod / budget that needs it (pod patches only where something changes)."""

    decisions: tuple[Decision, ...]
    pod_patches: tuple[PodPatch, ...]
    statuses: tuple[BudgetStatusUpdate, ...]
    evaluated_pairs: int = 0
    """Number of (budget, selected pod) pairs evaluated; for metrics and the benchmark."""
    memory_limits: tuple[PodMemoryLimits, ...] = ()
    """Every pod with driver-enforced memory limits after this evaluation."""
    problems: tuple[str, ...] = ()
    """Malformed state found on objects (e.g. an unparsable annotation entry, which
    is skipped); for the operator's log. Each names the object, field and value."""
    devices: tuple[DevicePressureReport, ...] = ()
    """The devices a device-pressure rule applies to, in node and device order."""
    object_problems: tuple[ObjectProblem, ...] = ()
    """Objects held or not believed in this evaluation, for Events and metrics."""
