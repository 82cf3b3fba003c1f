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
    those devices only. ``quiet``: by budget uid, what the selected pods left
    out of ``pods`` add to the budget's status (``QuietPods``: the running
    totals of incremental evaluation).
    """

    budgets: tuple[GPUMemoryBudget, ...]
    pods: tuple[PodFacts, ...]
    reports: Mapping[str, NodeGPUUsage]
    now: datetime
    policy: EffectivePolicy = EffectivePolicy()
    config: EngineConfig = EngineConfig()
    device_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    quiet: Mapping[str, QuietPods] = field(default_factory=dict)
