"""Inputs of the pure policy engine: the settings, the effective policy, the
pod facts and the snapshot ``EngineInput``. Re-exported by ``engine.types``
(see its module doc for the contract)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vramguard_api.budget import DEFAULT_THROTTLE_CPU, GPUMemoryBudget, Mode
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.keys import PodRef
from vramguard_operator.engine.pressure import PressureRule

DEFAULT_FRESHNESS_SECONDS = 60.0
DEFAULT_RECOVERY_MARGIN = 0.02
MAX_STATUS_ENTRIES = 256


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine settings that are not part of any custom resource.

    ``freshness_seconds``: a node report whose ``status.sampleTime`` is older than
    this (relative to ``now``) is stale. ``recovery_margin``: an open violation
    closes when usage is at most ``limit × (1 − recovery_margin)`` (hysteresis;
    between that and the limit the violation stays open but never escalates).
    ``default_throttle_cpu``: CPU limit set by a Throttle step without
    ``cpuLimit``. ``max_status_entries``: bound on ``status.violations`` and
    ``status.warnings``. ``state_key``: the key that seals the escalation
    state written on pods (``engine.seal``); None: state is neither sealed nor
    checked (anyone who can update a pod can forge it, docs/operator.md).
    """

    freshness_seconds: float = DEFAULT_FRESHNESS_SECONDS
    recovery_margin: float = DEFAULT_RECOVERY_MARGIN
    default_throttle_cpu: str = DEFAULT_THROTTLE_CPU
    max_status_entries: int = MAX_STATUS_ENTRIES
    state_key: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class EffectivePolicy:
    """The cluster policy as the engine applies it.

    ``mode``: cluster-wide mode; ``DryRun`` overrides every budget's ``Enforce``
    (a budget's own ``DryRun`` always holds). ``exempt_namespaces``: namespaces
    where the engine returns no Annotate/Throttle/Cap/Evict (violations are
    still reported in status and Events, as in DryRun). ``soft_limits``: a
    policy asks for soft limits at each pod's share (``softLimits: Share``),
    for the budgets that leave their own ``enforcement.softLimits`` unset.
    """

    mode: Mode = "Enforce"
    exempt_namespaces: frozenset[str] = frozenset({"kube-system"})
    soft_limits: bool = False

    @classmethod
    def from_policy(cls, policy: GPUMemoryPolicy | None) -> EffectivePolicy:
        """The effective policy of one ``GPUMemoryPolicy`` (defaults when None)."""
        if policy is None:
            return cls()
        exempt = frozenset(policy.spec.exempt_namespaces)
        return cls(mode=policy.spec.mode, exempt_namespaces=exempt, soft_limits=policy.spec.soft_limits == "Share")


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
class QuietPods:
    """Pods a budget selects that the caller leaves out of ``EngineInput.pods``
    because none can change the budget's decisions (``engine.quiet.quiet_pod``
    says which, and what each adds): the engine adds them to the budget's status.

    ``matched``: selected pods not finished; ``vram_bytes``/``ram_bytes``: the
    sum of their usage where it is known, ``vram_known``/``ram_known``: of how
    many; ``stale_nodes``/``missing_nodes``: their nodes whose report is stale
    or missing (for the DataStale condition)."""

    matched: int = 0
    vram_bytes: int = 0
    vram_known: int = 0
    ram_bytes: int = 0
    ram_known: int = 0
    stale_nodes: frozenset[str] = frozenset()
    missing_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class HeldBudget:
    """A budget that is not evaluated this time, and why: its spec does not
    parse (``InvalidSpec``), its evaluation raised (``EvaluationFailed``) or ran
    out of time (``EvaluationTimeout``). Nothing is decided for it and its
    escalation state is kept as it is (its records on pods neither escalate
    nor close, a pod it throttled stays throttled); everything else is
    evaluated as if it were absent. ``uid``: the budget's uid (its records on
    pods are told from a deleted budget's by it)."""

    uid: str
    reason: str
    message: str


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
    those devices only. ``pressure_rules``: by namespace, the device-pressure
    rule of its GPUMemoryPolicies (absent: none; a budget's ``devicePressure``
    overrides it for its pods). ``device_shares``: by device UUID, the node's
    share of that device (bytes: ``policy.shares.node_share``), the share of a
    pod that no budget limits on the device. The pressure rule compares the
    pods on a device, so it needs them all in one evaluation: callers that
    evaluate subsets pass every pod sharing a device with one evaluated
    (docs/device-pressure.md). ``held``: by (namespace, name), budgets not to
    evaluate (``HeldBudget``); one given in ``budgets`` too gets the status
    Ready=False with the reason, one that is not (its spec does not parse)
    only keeps its records. ``unknown_nodes``: by node name, why the data of a
    node cannot be believed whatever its report says (two reports claim it,
    its report does not parse): no action on its pods, as on a stale report.
    ``quiet``: by budget uid, what the selected pods left out of ``pods`` add
    to the budget's status (``QuietPods``: the running totals of incremental
    evaluation; a pod left out must be one ``engine.quiet.quiet_pod`` allows).
    """

    budgets: tuple[GPUMemoryBudget, ...]
    pods: tuple[PodFacts, ...]
    reports: Mapping[str, NodeGPUUsage]
    now: datetime
    policy: EffectivePolicy = EffectivePolicy()
    config: EngineConfig = EngineConfig()
    device_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    pressure_rules: Mapping[str, PressureRule] = field(default_factory=dict)
    device_shares: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[tuple[str, str], HeldBudget] = field(default_factory=dict)
    unknown_nodes: Mapping[str, str] = field(default_factory=dict)
    quiet: Mapping[str, QuietPods] = field(default_factory=dict)
