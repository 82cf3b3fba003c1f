"""GPUMemoryPolicy: a cluster-scoped policy for the GPU pods in a set of namespaces."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from .budget import Mode, SoftLimits
from .diagnosis import DiagnosisThresholds
from .limits import DeviceLimit, MemoryLimit
from .meta import APIModel, Condition, LabelSelector, ObjectMeta
from .pressure import DevicePressure


class PolicyDefaults(APIModel):
    """Limits applied to GPU pods that no GPUMemoryBudget selects."""

    per_pod: MemoryLimit | None = Field(default=None, alias="perPod", description="Default per-pod VRAM/RAM limits.")
    per_device: DeviceLimit | None = Field(
        default=None,
        alias="perDevice",
        description="Default per-device VRAM limit; when unset and shareFromNode is true, the node's share is used.",
    )
    share_from_node: bool = Field(
        default=True,
        alias="shareFromNode",
        description="Derive a per-device share from the node: usable memory / replicas on time-sliced or MPS GPUs, "
        "the MIG profile's memory on MIG devices.",
    )


class PolicyCeilings(APIModel):
    """Ceilings that budgets in the policy's namespaces may not exceed."""

    per_pod: MemoryLimit | None = Field(
        default=None, alias="perPod", description="Highest per-pod limits a budget may set."
    )
    per_device: DeviceLimit | None = Field(
        default=None, alias="perDevice", description="Highest per-device limit a budget may set."
    )
    total: MemoryLimit | None = Field(default=None, description="Highest total limits a budget may set.")


class EvictionRateLimit(APIModel):
    """Token-bucket rate limit on evictions made under this policy."""

    per_minute: int = Field(default=2, alias="perMinute", ge=0, le=600, description="Evictions allowed per minute.")
    burst: int = Field(default=2, ge=1, le=100, description="Evictions allowed at once before the rate applies.")


class GPUMemoryPolicySpec(APIModel):
    """The platform team's rules for GPU pods in a set of namespaces."""

    namespace_selector: LabelSelector | None = Field(
        default=None,
        alias="namespaceSelector",
        description="Namespaces the policy applies to, by label; unset means every namespace.",
    )
    exempt_namespaces: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=lambda: ["kube-system"],
        alias="exemptNamespaces",
        max_length=256,
        description="Namespaces where vramguard never acts (no annotation, throttle or eviction).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    mode: Mode = Field(
        default="Enforce", description="Cluster-wide mode: DryRun overrides every budget's Enforce in these namespaces."
    )
    soft_limits: SoftLimits = Field(
        default="Off",
        alias="softLimits",
        description="Share: set the driver's soft limit of every GPU pod in these namespaces to its per-device "
        "limit (its share: a budget's, or for pods no budget selects the policy's default, a DRA claim or a "
        "sharer's grant), so that under real memory pressure the driver evicts a pod above its share before one "
        "within it. A budget's own enforcement.softLimits overrides it. Needs devices that support per-cgroup "
        "memory limits and agents with enforceCaps.",
    )
    defaults: PolicyDefaults | None = Field(default=None, description="Limits for GPU pods that no budget selects.")
    ceilings: PolicyCeilings | None = Field(default=None, description="Ceilings for budgets in these namespaces.")
    eviction_rate_limit: EvictionRateLimit = Field(
        default_factory=EvictionRateLimit, alias="evictionRateLimit", description="Rate limit on evictions."
    )
    inject_framework_caps: bool = Field(
        default=False,
        alias="injectFrameworkCaps",
        description="Opt in to the mutating webhook that injects framework memory caps into GPU pods.",
    )
    termination_message_fallback: bool | None = Field(
        default=None,
        alias="terminationMessageFallback",
        description="The mutating webhook sets terminationMessagePolicy: FallbackToLogsOnError on GPU containers that "
        "keep the default (File), so that a framework's out-of-memory message reaches the pod's status for OOM "
        "records (docs/oom.md). Unset: on; false switches it off.",
    )
    device_pressure: DevicePressure | None = Field(
        default=None,
        alias="devicePressure",
        description="Device-pressure protection for the GPU pods of these namespaces: when a device's free memory "
        "falls under minFree, the pod on it most above its share is evicted at once (never a pod within its "
        "share; one pod per device at a time). Pods no budget selects take part through their implicit budgets "
        "(their node's share when the policy has no defaults). Unset: off.",
    )
    diagnosis: DiagnosisThresholds = Field(
        default_factory=DiagnosisThresholds,
        description="When a pod of these namespaces is diagnosed RAMShort, VRAMShort or VRAMIdle (its one diagnosis "
        "of RAMLeak, VRAMLeak, RAMShort, VRAMShort, VRAMIdle, OK: docs/policy.md, \"Diagnosis\").",
    )


class GPUMemoryPolicyStatus(APIModel):
    """The observed state of a policy."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration", description="Generation observed."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="Ready condition.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    matched_namespaces: int | None = Field(
        default=None, alias="matchedNamespaces", ge=0, description="Number of namespaces the policy applies to."
    )
    namespaces: list[Annotated[str, Field(max_length=63)]] | None = Field(
        default=None,
        max_length=256,
        description="Namespaces the policy applies to (sorted, at most 256).",
    )
    overridden: list[Annotated[str, Field(max_length=512)]] | None = Field(
        default=None,
        max_length=256,
        description="Fields where a stricter policy wins in some of these namespaces, as "
        "'<field> in <namespace>: policy/<name>' (at most 256).",
    )


class GPUMemoryPolicy(APIModel):
    """A cluster-scoped policy: defaults, ceilings, exemptions, mode and eviction rate limits."""

    model_config = ConfigDict(title="GPUMemoryPolicy")

    api_version: Literal["vramguard.io/v1alpha1"] = Field(default="vramguard.io/v1alpha1", alias="apiVersion")
    kind: Literal["GPUMemoryPolicy"] = "GPUMemoryPolicy"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUMemoryPolicySpec = Field(default_factory=GPUMemoryPolicySpec)
    status: GPUMemoryPolicyStatus | None = None
