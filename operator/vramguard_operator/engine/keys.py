"""Names and keys the engine shares with the operator: the pod annotation keys,
the Event reasons, and the references that identify pods, budgets and
violations. Re-exported by ``engine.types``."""

from __future__ import annotations

from dataclasses import dataclass

from vramguard_api.budget import ViolationKind
from vramguard_api.memlimits import MEMORY_LIMITS_ANNOTATION

# --- Annotation keys (all written by the operator on pods) -------------------

ANNOTATION_PREFIX = "vramguard.io/"
ANNOTATION_VIOLATIONS = "vramguard.io/violations"
"""Escalation state of the pod: compact JSON list of ``records.record_to_json``
objects, one per open violation that has reached at least one step on this pod."""
ANNOTATION_MESSAGE = "vramguard.io/violation"
"""Human-readable summary of the pod's open violations (``; ``-separated), set
when a step fires: budget, kind, measured value, limit, step, next step and when."""
ANNOTATION_ORIGINAL_CPU = "vramguard.io/original-cpu"
"""CPU resources before throttling: compact JSON ``{"<container>": {"limit": "2",
"request": "500m"}}`` (``null`` for an unset request). Present exactly while the
pod is throttled by vramguard."""
ANNOTATION_STATE_SIGNATURE = "vramguard.io/state-signature"
"""HMAC-SHA256 of the pod's uid, ``vramguard.io/violations`` and
``vramguard.io/original-cpu`` under the operator's state key (``v1:<hex>``),
present while either is and a key is configured (``engine.seal``): state
that does not verify was not written by this operator and is not obeyed."""

ANNOTATION_MEMORY_LIMITS = MEMORY_LIMITS_ANNOTATION
"""Driver-enforced memory limits the pod's node agent applies: compact JSON
``{"<GPU UUID>": {"hardLimit": bytes, "softLimit": bytes}}``
(``vramguard_api.memlimits``). Written by the Cap step (hard limits) and by
soft limits at each pod's share (``softLimits: Share``)."""

# Event reasons (CamelCase, as Kubernetes Events use them).
EVENT_ABOVE_WARNING = "AboveWarningThreshold"
EVENT_LIMIT_EXCEEDED = "LimitExceeded"
EVENT_LEAK_DETECTED = "LeakDetected"
EVENT_THROTTLED = "Throttled"
EVENT_THROTTLE_IMPOSSIBLE = "ThrottleImpossible"
EVENT_CAPPED = "Capped"
EVENT_CAP_IMPOSSIBLE = "CapImpossible"
EVENT_EVICTING = "Evicting"
EVENT_RECOVERED = "Recovered"
EVENT_DRY_RUN = "DryRun"
EVENT_DEVICE_PRESSURE = "DevicePressure"
"""A device-pressure eviction (docs/device-pressure.md)."""
EVENT_DEVICE_WILL_RUN_OUT = "DeviceWillRunOut"
"""Device pressure with no pod above its share that could be evicted."""
# Problems with objects (``ObjectProblem.reason``): each affects only its object.
EVENT_INVALID_SPEC = "InvalidSpec"
EVENT_EVALUATION_FAILED = "EvaluationFailed"
EVENT_EVALUATION_TIMEOUT = "EvaluationTimeout"
EVENT_REPORT_INVALID = "ReportInvalid"
EVENT_REPORT_UNKNOWN_PODS = "ReportUnknownPods"  # a warning: the report is still believed
EVENT_STATE_REJECTED = "StateRejected"


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
