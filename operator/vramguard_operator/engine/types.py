"""Inputs and outputs of the pure policy engine (``engine.evaluate``).

The engine is a function ``evaluate(EngineInput) -> EngineOutput``: no clock,
no API calls, no globals. Everything it needs is in ``EngineInput``; everything
the operator must do afterwards is in ``EngineOutput``:

- ``decisions``: one typed decision per escalation step, warning or recovery,
  each with the Event to post (on the pod, when there is one, and on the budget);
- ``pod_patches``: the merged annotation changes per pod (a JSON merge patch:
  ``None`` removes a key), which hold the escalation state and the throttled
  pods' original CPU resources;
- ``statuses``: the desired ``GPUMemoryBudgetStatus`` per budget (the writer
  compares it with the current one, ``budget_status.status_changed``, and
  writes only when it differs);
- ``problems``: malformed state found on objects, for the log.

Decisions of a DryRun budget (or of an exempt namespace) are ``DryRunStep``
objects, never ``Annotate``/``Throttle``/``Evict`` (``SIDE_EFFECT_DECISIONS``).
The steps they stand for are recorded in status with ``dryRun: true`` and do
not count as fired once the budget enforces.

Escalation state is read back from the objects, never kept in memory: from each
budget's ``status.violations`` and from each pod's ``vramguard.io/violations``
annotation (see ``ANNOTATION_VIOLATIONS``). So the caller passes budgets *with
their status* and pods *with their annotations*; after applying an output, the
next evaluation sees the new state. See docs/engine.md for the semantics.

Apply order for one pod (the engine never returns a Throttle and a restoring
Recover for the same pod in one output):

1. Throttle: write the pod patch first (it records the original CPU resources),
   then resize through ``pods/resize``. Throttle is level-triggered too: while
   a violation holds a pod at Throttle (and the budget enforces, on fresh data)
   and the pod's CPU is not at the step's target (a resize that was refused or
   timed out, an operator restart between the patch and the resize, or a
   container raised again since), a ``Throttle`` with ``reapply=True`` carries
   the resize again. A re-apply is no new step: post no Event for it (its
   ``event`` is filled only for logs) and count it apart in metrics.
2. Recover with ``restore``: resize first; write the pod patch (which removes
   ``vramguard.io/original-cpu``) only when the resize succeeded, so that a
   failed restore is retried at the next evaluation.
3. Evict: write the pod patch (if any), then call the Eviction API. Evict is
   level-triggered: it is returned at every evaluation while it is due and the
   pod exists and is not terminating, so a 429 (PodDisruptionBudget) or a
   rate-limited eviction is simply retried later. The pod terminating or
   disappearing is the record that it fired (for a Total violation: the pod
   chosen for it, ``ViolationRecord.evict_target_uid``). The eviction rate
   limiter lives in the actions layer (the engine sees time only through ``now``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from vramguard_api.budget import (
    DEFAULT_THROTTLE_CPU,
    Action,
    GPUMemoryBudget,
    GPUMemoryBudgetStatus,
    Mode,
    ViolationKind,
)
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage

# --- Annotation keys (all written by the operator on pods) -------------------

ANNOTATION_PREFIX = "vramguard.io/"
ANNOTATION_VIOLATIONS = "vramguard.io/violations"
"""Escalation state of the pod: compact JSON list of ``ViolationRecord.to_json()``
objects, one per open violation that has reached at least one step on this pod."""
ANNOTATION_MESSAGE = "vramguard.io/violation"
"""Human-readable summary of the pod's open violations (``; ``-separated), set
when a step fires: budget, kind, measured value, limit, step, next step and when."""
ANNOTATION_ORIGINAL_CPU = "vramguard.io/original-cpu"
"""CPU resources before throttling: compact JSON ``{"<container>": {"limit": "2",
"request": "500m"}}`` (``null`` for an unset request). Present exactly while the
pod is throttled by vramguard."""

# Event reasons (CamelCase, as Kubernetes Events use them).
EVENT_ABOVE_WARNING = "AboveWarningThreshold"
EVENT_LIMIT_EXCEEDED = "LimitExceeded"
EVENT_LEAK_DETECTED = "LeakDetected"
EVENT_THROTTLED = "Throttled"
EVENT_THROTTLE_IMPOSSIBLE = "ThrottleImpossible"
EVENT_EVICTING = "Evicting"
EVENT_RECOVERED = "Recovered"
EVENT_DRY_RUN = "DryRun"

DecisionAction = Literal["Warn", "Annotate", "Throttle", "Evict", "Recover"]
EventType = Literal["Normal", "Warning"]

DEFAULT_FRESHNESS_SECONDS = 60.0
DEFAULT_RECOVERY_MARGIN = 0.02
MAX_STATUS_ENTRIES = 256


# --- Inputs --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine settings that are not part of any custom resource.

    ``freshness_seconds``: a node report whose ``status.sampleTime`` is older than
    this (relative to ``now``) is stale. ``recovery_margin``: an open violation
    closes when usage is at most ``limit × (1 − recovery_margin)`` (hysteresis;
    between that and the limit the violation stays open but never escalates).
    ``default_throttle_cpu``: CPU limit set by a Throttle step without
    ``cpuLimit``. ``max_status_entries``: bound on ``status.violations`` and
    ``status.warnings``.
    """

    freshness_seconds: float = DEFAULT_FRESHNESS_SECONDS
    recovery_margin: float = DEFAULT_RECOVERY_MARGIN
    default_throttle_cpu: str = DEFAULT_THROTTLE_CPU
    max_status_entries: int = MAX_STATUS_ENTRIES


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The cluster policy as the engine applies it.

    ``mode``: cluster-wide mode; ``DryRun`` overrides every budget's ``Enforce``
    (a budget's own ``DryRun`` always holds). ``exempt_namespaces``: namespaces
    where the engine returns no Annotate/Throttle/Evict (violations are still
    reported in status and Events, as in DryRun).
    """

    mode: Mode = "Enforce"
    exempt_namespaces: frozenset[str] = frozenset({"kube-system"})

    @classmethod
    def from_policy(cls, policy: GPUMemoryPolicy | None) -> EffectivePolicy:
        """The effective policy of one ``GPUMemoryPolicy`` (defaults when None)."""
        if policy is None:
            return cls()
        exempt = frozenset(policy.spec.exempt_namespaces)
        return cls(mode=policy.spec.mode, exempt_namespaces=exempt)


@dataclass(frozen=True, slots=True)
class ContainerFacts:
    """One container of a pod, as the engine needs it for throttling.

    CPU values are Kubernetes quantity strings as in the pod spec (``"2"``,
    ``"500m"``), ``None`` when unset. ``cpu_resize_restart`` is True when the
    container's ``resizePolicy`` for cpu is ``RestartContainer``.
    """

    name: str
    cpu_limit: str | None = None
    cpu_request: str | None = None
    cpu_resize_restart: bool = False


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the engine reads from a Pod object.

    ``phase`` is ``status.phase``; ``terminating`` is True when
    ``metadata.deletionTimestamp`` is set. ``annotations`` must include the
    ``vramguard.io/*`` keys (the escalation state).
    """

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    node_name: str | None = None
    phase: str = "Running"
    containers: tuple[ContainerFacts, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False

    @property
    def ref(self) -> PodRef:
        """The pod's reference."""
        return PodRef(self.namespace, self.name, self.uid)

    @classmethod
    def from_api(cls, pod: Mapping[str, Any]) -> PodFacts:
        """Build from a Pod as a JSON-like dict (a kopf body, or the output of
        ``ApiClient.sanitize_for_serialization``).

        Raises ``ValueError`` naming the field when metadata.name/namespace/uid is missing.
        """
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        for key in ("namespace", "name", "uid"):
            if not meta.get(key):
                raise ValueError(f"pod metadata.{key}: missing in {meta.get('name')!r}")
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            labels=dict(meta.get("labels") or {}),
            node_name=spec.get("nodeName"),
            phase=status.get("phase") or "Pending",
            containers=tuple(_container_facts(c) for c in spec.get("containers") or ()),
            annotations=dict(meta.get("annotations") or {}),
            terminating=meta.get("deletionTimestamp") is not None,
        )


def _container_facts(container: Mapping[str, Any]) -> ContainerFacts:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    restart = any(
        p.get("resourceName") == "cpu" and p.get("restartPolicy") == "RestartContainer"
        for p in container.get("resizePolicy") or ()
    )
    cpu_limit = limits.get("cpu")
    cpu_request = requests.get("cpu")
    return ContainerFacts(
        name=container.get("name") or "",
        cpu_limit=None if cpu_limit is None else str(cpu_limit),
        cpu_request=None if cpu_request is None else str(cpu_request),
        cpu_resize_restart=restart,
    )


@dataclass(frozen=True, slots=True)
class EngineInput:
    """One evaluation's snapshot.

    ``budgets``: every GPUMemoryBudget of the namespaces whose pods are given
    (with metadata.namespace/name/uid/generation and their current status, which
    holds escalation state); a pod's state entry naming a budget that is not
    given (or has another uid) is treated as a deleted budget and recovered.
    ``reports``: NodeGPUUsage by node name. ``pods``: the pods of those
    namespaces (any phase; only Running, non-terminating pods are evaluated).
    ``now``: the evaluation time, timezone-aware UTC. ``device_limits``: by
    budget uid, bytes per device UUID that replace the budget's ``perDevice``
    limit on those devices (what a DRA claim or a sharer granted on a named
    device: ``policy.implicit``); a budget without ``perDevice`` is limited on
    those devices only.
    """

    budgets: tuple[GPUMemoryBudget, ...]
    pods: tuple[PodFacts, ...]
    reports: Mapping[str, NodeGPUUsage]
    now: datetime
    policy: EffectivePolicy = EffectivePolicy()
    config: EngineConfig = EngineConfig()
    device_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


# --- References and keys --------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A pod: namespace, name, uid."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True, order=True)
class BudgetRef:
    """A GPUMemoryBudget: namespace, name, uid (empty when the object has none)."""

    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True, slots=True, order=True)
class ViolationKey:
    """Identity of a violation: budget (namespace, name), kind, pod name (None for
    a TotalVRAM/TotalRAM violation) and device UUID (DeviceVRAM only)."""

    namespace: str
    budget: str
    kind: ViolationKind
    pod: str | None = None
    device: str | None = None

    def label(self) -> str:
        """Short text: ``PodVRAM`` / ``DeviceVRAM on GPU-…`` / ``TotalRAM``."""
        return self.kind if self.device is None else f"{self.kind} on {self.device}"


# --- Outputs --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A Kubernetes Event to post on the decision's pod (if any) and on its budget."""

    type: EventType
    reason: str
    message: str


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
        return "Annotate"


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
        return "Throttle"


@dataclass(frozen=True, slots=True, kw_only=True)
class Evict(DecisionBase):
    """Evict ``pod`` through the Eviction API (level-triggered: see module doc)."""

    reason: str

    @property
    def action(self) -> DecisionAction:
        return "Evict"


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


Decision = Warn | Annotate | Throttle | Evict | Recover | DryRunStep
SIDE_EFFECT_DECISIONS: tuple[type, ...] = (Annotate, Throttle, Evict)


@dataclass(frozen=True, slots=True)
class PodPatch:
    """Annotation changes for one pod, as a JSON merge patch on
    ``metadata.annotations`` (``None`` removes the key)."""

    pod: PodRef
    annotations: Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class BudgetStatusUpdate:
    """The desired status of one budget (compare with the current one before writing)."""

    budget: BudgetRef
    status: GPUMemoryBudgetStatus


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
    problems: tuple[str, ...] = ()
    """Malformed state found on objects (e.g. an unparsable annotation entry, which
    is skipped); for the operator's log. Each names the object, field and value."""


# --- Escalation state records ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ViolationRecord:
    """Persisted escalation state of one violation (as stored in the pod annotation
    ``vramguard.io/violations`` and, without budget/uid, in ``status.violations``).

    ``since``: usage first above the limit. ``opened_at``: when the violation
    opened (None while pending within the tolerance). ``step``/``step_time``:
    the last step that fired (Evict is recorded once the pod is terminating).
    ``observed_bytes``/``limit_bytes``: the values when that step fired (so the
    annotation changes only on transitions, not with every sample).
    ``dry_run``: ``step`` only would have fired (the budget was not enforcing);
    once the budget enforces, such a step is disregarded and the ladder fires
    the due steps for real. ``evict_target_uid``: for a Total violation whose
    Evict is due, the uid of the pod chosen for eviction; the step is recorded
    once that pod is terminating or gone.
    All times are whole seconds (metav1.Time's resolution).
    """

    key: ViolationKey
    budget_uid: str
    since: datetime
    opened_at: datetime | None = None
    step: Action | None = None
    step_time: datetime | None = None
    observed_bytes: int | None = None
    limit_bytes: int | None = None
    dry_run: bool = False
    evict_target_uid: str | None = None
