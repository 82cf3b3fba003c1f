"""GPUMemoryBudget: a namespaced budget for the VRAM and RAM of a set of pods."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .bounds import DELAY, GROWTH_PER_HOUR, THROTTLE_CPU, CPUQuantity, Delay, GrowthQuantity, duration_guard
from .limits import DeviceLimit, MemoryLimit, le_message, le_rule
from .meta import APIModel, Condition, LabelSelector, ObjectMeta
from .pressure import DevicePressure
from .steps import ACTION_DOC, ACTIONS, LADDER_ORDER, Action, ActionField, rank_cel
from .units import parse_duration, quantity_to_bytes

Mode = Literal["Enforce", "DryRun"]
SoftLimits = Literal["Share", "Off"]
ViolationKind = Literal[
    "PodVRAM", "PodRAM", "DeviceVRAM", "TotalVRAM", "TotalRAM", "Leak", "RAMLeak", "DevicePressure"
]
LeakMemory = Literal["VRAM", "RAM"]
"""A memory whose trend the leak detector watches: the pod's VRAM over its devices,
or its RAM working set (the cgroup's usage less inactive file pages)."""

LEAK_KINDS: dict[LeakMemory, ViolationKind] = {"VRAM": "Leak", "RAM": "RAMLeak"}
"""The violation kind of a leak in each memory (``Leak`` keeps its name from
before RAM was watched, so that existing statuses read alike)."""
LEAK_MEMORY: dict[ViolationKind, LeakMemory] = {kind: memory for memory, kind in LEAK_KINDS.items()}
"""The memory of each leak kind: ``LEAK_MEMORY[kind]`` names it in Events, status and metrics."""

DEFAULT_THROTTLE_CPU = "100m"
DEFAULT_WARNING_THRESHOLD = 0.85

# Checked only when every delay can go through duration() (each step's own rule reports the others).
_STEPS_INCREASING = (
    f"!self.all(s, {duration_guard('s.after')}) || "
    f"self.all(a, self.all(b, {rank_cel('a')} >= {rank_cel('b')} || duration(a.after) < duration(b.after)))"
)


class Limits(APIModel):
    """The limits of a budget; at least one must be set."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.perPod) || has(self.perDevice) || has(self.total)",
                    "message": "at least one of perPod, perDevice or total must be set",
                },
                le_rule("perPod.vram", "total.vram"),
                le_rule("perPod.ram", "total.ram"),
                le_rule("perDevice.vram", "perPod.vram"),
            ]
        }
    )

    per_pod: MemoryLimit | None = Field(
        default=None,
        alias="perPod",
        description="Limits for each selected pod: VRAM summed over its devices, RAM working set.",
    )
    per_device: DeviceLimit | None = Field(
        default=None,
        alias="perDevice",
        description="Limit on the VRAM each selected pod holds on any single device (GPU or MIG device).",
    )
    total: MemoryLimit | None = Field(
        default=None, description="Limits on the sum over all selected pods (for example all workers of one job)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Limits:
        if self.per_pod is None and self.per_device is None and self.total is None:
            raise ValueError("at least one of perPod, perDevice or total must be set")
        for kind in ("vram", "ram"):
            pod = getattr(self.per_pod, kind, None)
            tot = getattr(self.total, kind, None)
            if pod is not None and tot is not None and quantity_to_bytes(pod) > quantity_to_bytes(tot):
                raise ValueError(le_message(f"perPod.{kind}", pod, f"total.{kind}", tot))
        dev = self.per_device.vram if self.per_device else None
        pod_vram = self.per_pod.vram if self.per_pod else None
        if dev is not None and pod_vram is not None and quantity_to_bytes(dev) > quantity_to_bytes(pod_vram):
            raise ValueError(le_message("perDevice.vram", dev, "perPod.vram", pod_vram))
        return self


class Tolerance(APIModel):
    """How much and how long usage may exceed a limit before a violation opens.

    Usage above ``limit × (1 + overshootPercent/100)`` opens a violation at once;
    usage above the limit but within the overshoot opens one only after it has
    lasted ``duration``.
    """

    overshoot_percent: int = Field(
        default=0,
        alias="overshootPercent",
        ge=0,
        le=100,
        description="Percentage above a limit that is tolerated for up to duration; above it a violation opens at once.",
    )
    duration: Delay = Field(
        default="0s",
        description="How long usage may stay above a limit (within the overshoot) before a violation opens. "
        + DELAY.doc,
    )

    def seconds(self) -> float:
        """The tolerated duration in seconds."""
        return parse_duration(self.duration, "tolerance.duration")


class EscalationStep(APIModel):
    """One step of the escalation ladder; it fires once per violation, when the
    violation has lasted ``after``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!has(self.cpuLimit) || self.action == '{Action.THROTTLE}'",
                    "message": "cpuLimit is only valid on a Throttle step",
                    "fieldPath": ".cpuLimit",
                },
                {
                    "rule": f"!has(self.hardLimit) || self.action == '{Action.CAP}'",
                    "message": "hardLimit is only valid on a Cap step",
                    "fieldPath": ".hardLimit",
                },
            ]
        }
    )

    action: ActionField = Field(description=ACTION_DOC)
    after: Delay = Field(
        default="0s", description=f"How long the violation must have lasted before this step fires. {DELAY.doc}"
    )
    cpu_limit: CPUQuantity | None = Field(
        default=None,
        alias="cpuLimit",
        description="Throttle only: the CPU limit set on each container while throttled "
        f"(default {DEFAULT_THROTTLE_CPU}). {THROTTLE_CPU.doc}",
    )
    hard_limit: DeviceLimit | None = Field(
        default=None,
        alias="hardLimit",
        description="Cap only: the level of the hard limit on each device the pod uses, bytes or a fraction of the "
        "device's usable memory. Default: the violated limit (a per-pod limit split over the pod's devices by "
        "their use; for a leak, the pod's use when the step fires). The hard limit starts at the pod's use when "
        "that is higher and follows the pod down to this level as it frees memory.",
    )

    def after_seconds(self) -> float:
        """The step's delay in seconds."""
        return parse_duration(self.after, "escalation.after")

    @model_validator(mode="after")
    def _hard_limit_on_cap(self) -> EscalationStep:
        if self.hard_limit is not None and self.action != Action.CAP:
            raise ValueError("hardLimit is only valid on a Cap step")
        return self


def _default_ladder() -> list[EscalationStep]:
    return [EscalationStep(action=Action.ANNOTATE, after="0s")]


class Enforcement(APIModel):
    """What happens when a limit is violated."""

    mode: Mode = Field(
        default="Enforce",
        description="Enforce: run the escalation ladder. DryRun: change nothing but status, Events and metrics.",
    )
    soft_limits: SoftLimits | None = Field(
        default=None,
        alias="softLimits",
        description="Share: set the driver's soft limit of each selected pod on each device to its per-device limit "
        "(its share), so that under real memory pressure the driver evicts a pod above its share before one within "
        "it (NVML per-cgroup memory limits, applied by the node agent where devices support them). Off: none. "
        "Unset: as the GPUMemoryPolicy says (softLimits), else Off.",
    )
    escalation: list[EscalationStep] = Field(
        default_factory=_default_ladder,
        min_length=1,
        max_length=len(ACTIONS),
        description=f"The escalation ladder, at most one step per action, in the order {LADDER_ORDER}, "
        "with strictly increasing delays. Default: Annotate at once.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["action"],
            "x-kubernetes-validations": [
                {
                    "rule": _STEPS_INCREASING,
                    "message": f"escalation delays must increase along {LADDER_ORDER}",
                }
            ],
        },
    )

    @model_validator(mode="after")
    def _ladder(self) -> Enforcement:
        actions = [s.action for s in self.escalation]
        if len(set(actions)) != len(actions):
            raise ValueError(f"escalation: duplicate action in {actions}")
        ordered = sorted(self.escalation, key=lambda s: s.action.rank)
        delays = [s.after_seconds() for s in ordered]
        if any(b <= a for a, b in zip(delays, delays[1:], strict=False)):
            raise ValueError(f"escalation delays must increase along {LADDER_ORDER}")
        self.escalation = ordered
        return self


class LeakDetection(APIModel):
    """Leak detection on each selected pod's VRAM trend, RAM working-set trend, or both
    (``memories``): one detector, the same thresholds for each memory."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.evictBefore) || self.enabled",
                    "message": "evictBefore requires enabled: true",
                    "fieldPath": ".evictBefore",
                }
            ]
        }
    )

    enabled: bool = Field(
        default=False, description="Whether a detected leak opens a violation: Leak (VRAM) or RAMLeak (RAM)."
    )
    memories: list[LeakMemory] = Field(
        default=["VRAM"],
        min_length=1,
        max_length=2,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="Which memories are watched: VRAM (the default), RAM (the pod's working set: data loaders, "
        "pinned buffers, preprocessing caches), or both. The thresholds below apply to each alike.",
    )
    min_growth_per_hour: GrowthQuantity = Field(
        default="200Mi",
        alias="minGrowthPerHour",
        description="Smallest sustained growth, per hour, of a watched memory that counts as a leak. "
        f"{GROWTH_PER_HOUR.doc}",
    )
    min_window: Delay = Field(
        default="30m",
        alias="minWindow",
        description="The longest a steady rise waits: a floor that has risen steadily this long at "
        "minGrowthPerHour or more is a leak, however noisy. A clean, fast rise is declared sooner, from "
        f"minEvidence on (docs/leak-detection.md). {DELAY.doc}",
    )
    min_evidence: Delay = Field(
        default="7m",
        alias="minEvidence",
        description="The least evidence any leak verdict rests on: a rise shorter than this is never a leak, "
        "however fast. Between minEvidence and minWindow a rise is a leak when the lower 95% bound of its "
        f"growth reaches minGrowthPerHour; minEvidence at or above minWindow turns that off. {DELAY.doc}",
    )
    evict_before: Delay | None = Field(
        default=None,
        alias="evictBefore",
        description="Evict a leaking pod this long before its projected exhaustion of the limit, "
        f"so that a replacement starts before the OOM takes neighbours down. {DELAY.doc}",
    )

    @field_validator("memories")
    @classmethod
    def _distinct(cls, memories: list[LeakMemory]) -> list[LeakMemory]:
        if len(set(memories)) != len(memories):
            raise ValueError(f"memories: duplicate memory in {memories}")
        return memories


class GPUMemoryBudgetSpec(APIModel):
    """The desired budget: which pods, which limits, and what happens on a violation."""

    selector: LabelSelector = Field(
        description="Label selector over pods in the budget's namespace; an empty selector selects every pod."
    )
    limits: Limits = Field(description="VRAM and RAM limits per pod, per device and in total.")
    tolerance: Tolerance = Field(default_factory=Tolerance, description="Tolerated overshoot and its duration.")
    warning_threshold: float = Field(
        default=DEFAULT_WARNING_THRESHOLD,
        alias="warningThreshold",
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Fraction of a limit, in (0, 1], above which a Warning condition and Event are raised before any violation.",
    )
    leak_detection: LeakDetection | None = Field(
        default=None, alias="leakDetection", description="Leak detection settings; off unless enabled."
    )
    enforcement: Enforcement = Field(default_factory=Enforcement, description="Mode and escalation ladder.")
    device_pressure: DevicePressure | None = Field(
        default=None,
        alias="devicePressure",
        description="Overrides the GPUMemoryPolicy's devicePressure for the selected pods: the free memory they "
        "want kept on their devices (a device keeps the largest minFree of its pods' rules) and the action taken "
        "on them when they are the pod most above its share. The budget's mode applies (DryRun: would evict).",
    )


class Violation(APIModel):
    """An open violation and how far it has escalated."""

    kind: ViolationKind = Field(
        description="Which limit: PodVRAM, PodRAM, DeviceVRAM, TotalVRAM, TotalRAM, Leak (VRAM) or RAMLeak "
        "(RAM working set); DevicePressure: the pod "
        "was the one most above its share on a device whose free memory fell under minFree (observedBytes: its "
        "use there, limitBytes: its share)."
    )
    pod: str | None = Field(default=None, description="Name of the pod; empty for a total over all selected pods.")
    device: str | None = Field(
        default=None, description="UUID of the device, for a DeviceVRAM or DevicePressure violation."
    )
    observed_bytes: int = Field(alias="observedBytes", ge=0, description="Measured usage in bytes.")
    limit_bytes: int = Field(alias="limitBytes", ge=0, description="The effective limit in bytes.")
    since: datetime = Field(description="When the usage first went above the limit.")
    opened_at: datetime | None = Field(
        default=None, alias="openedAt", description="When the violation opened (after the tolerance)."
    )
    step: ActionField | None = Field(default=None, description="The last escalation step that fired.")
    step_time: datetime | None = Field(default=None, alias="stepTime", description="When that step fired.")
    dry_run: bool | None = Field(
        default=None,
        alias="dryRun",
        description="True when the step only would have fired: it was reached while the budget was not enforcing "
        "(effective mode DryRun, or an exempt namespace), so nothing was done. Once the budget enforces, such a step "
        "is disregarded and the due steps fire for real.",
    )
    next_step: ActionField | None = Field(default=None, alias="nextStep", description="The next step, if any.")
    next_step_time: datetime | None = Field(
        default=None, alias="nextStepTime", description="When the next step is due."
    )
    evict_target_uid: str | None = Field(
        default=None,
        alias="evictTargetUID",
        max_length=128,
        description="For a TotalVRAM or TotalRAM violation whose Evict step is due: the uid of the pod chosen for "
        "eviction. The step counts as fired once that pod is terminating or gone.",
    )
    message: str = Field(default="", max_length=1024, description="Human-readable explanation.")


class LimitWarning(APIModel):
    """Usage above the budget's warning threshold of a limit, before any violation."""

    kind: ViolationKind = Field(description="Which limit: PodVRAM, PodRAM, DeviceVRAM, TotalVRAM or TotalRAM.")
    pod: str | None = Field(default=None, description="Name of the pod; empty for a total over all selected pods.")
    device: str | None = Field(default=None, description="UUID of the device, for a DeviceVRAM warning.")
    observed_bytes: int = Field(alias="observedBytes", ge=0, description="Measured usage in bytes.")
    limit_bytes: int = Field(alias="limitBytes", ge=0, description="The effective limit in bytes.")
    since: datetime = Field(description="When the usage first went above the warning threshold.")


class BudgetUsage(APIModel):
    """Measured usage of the selected pods."""

    vram_bytes: int | None = Field(
        default=None, alias="vramBytes", ge=0, description="VRAM of all selected pods, bytes."
    )
    ram_bytes: int | None = Field(
        default=None, alias="ramBytes", ge=0, description="RAM working set of all selected pods, bytes."
    )
    vram: str | None = Field(default=None, description="VRAM used / limit, for display (e.g. 41Gi/60Gi).")
    ram: str | None = Field(default=None, description="RAM used / limit, for display.")


class OOMKills(APIModel):
    """Out-of-memory kills of the pods a budget selects, as the operator published
    them (``docs/oom.md``): a counter per verdict, from the budget's creation."""

    innocent: int = Field(default=0, ge=0, description="GPU OOM kills of a pod within its limits and its share.")
    own: int = Field(default=0, ge=0, description="GPU OOM kills of a pod above its own limit or share.")
    unknown: int = Field(default=0, ge=0, description="GPU OOM kills where no share was known to blame.")
    host: int = Field(default=0, ge=0, description="Host RAM OOM kills (the kubelet's OOMKilled, a cgroup OOM kill).")
    cap: int = Field(default=0, ge=0, description="Kills by a driver-enforced cap (hard limit, soft-limit eviction).")
    last_kill_time: datetime | None = Field(
        default=None, alias="lastKillTime", description="When the agent noticed the most recent kill counted."
    )

    def counted(self, kind: str, blame: str | None, time: datetime) -> OOMKills:
        """These counters with one more kill of ``kind`` (the classifier's:
        GPUOutOfMemory, HostOutOfMemory, CapKill) and ``blame`` (Innocent, Own,
        Unknown; None), noticed at ``time``. Raises ValueError for a kind that
        is no memory kill (NotMemory is not counted)."""
        field = OOM_KILL_FIELDS.get((kind, blame)) or OOM_KILL_FIELDS.get((kind, None))
        if field is None:
            raise ValueError(f"kind={kind!r} blame={blame!r}: not an out-of-memory kill")
        last = time if self.last_kill_time is None else max(self.last_kill_time, time)
        return self.model_copy(update={field: getattr(self, field) + 1, "last_kill_time": last})


OOM_KILL_FIELDS: dict[tuple[str, str | None], str] = {
    ("GPUOutOfMemory", "Innocent"): "innocent",
    ("GPUOutOfMemory", "Own"): "own",
    ("GPUOutOfMemory", "Unknown"): "unknown",
    ("HostOutOfMemory", None): "host",
    ("CapKill", None): "cap",  # whatever its blame: the cap, not a neighbour, killed it
}
"""The ``OOMKills`` counter of each (kind, blame); ``None``: any blame of that kind."""

OOM_KILLS_FIELD = "oomKills"
"""The status field the OOM publisher owns (``controller/oom.py``); the budget
status writer leaves it alone."""


class GPUMemoryBudgetStatus(APIModel):
    """The observed state of a budget."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration", description="The generation of the spec that this status reflects."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="Ready, Violating, Warning and DataStale conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    effective_mode: Mode | None = Field(
        default=None,
        alias="effectiveMode",
        description="The mode in force after cluster policy (DryRun overrides Enforce).",
    )
    matched_pods: int | None = Field(default=None, alias="matchedPods", ge=0, description="Number of selected pods.")
    usage: BudgetUsage | None = Field(default=None, description="Measured usage of the selected pods.")
    open_violations: int | None = Field(
        default=None, alias="openViolations", ge=0, description="Number of open violations."
    )
    violations: list[Violation] | None = Field(
        default=None, max_length=256, description="Open violations, with the escalation step reached."
    )
    warnings: list[LimitWarning] | None = Field(
        default=None,
        max_length=256,
        description="Limits whose usage is above the warning threshold without a violation; "
        "kept so that each crossing raises one Event.",
    )
    limit_sources: dict[str, str] | None = Field(
        default=None,
        alias="limitSources",
        description="Where each effective limit came from, by limit (perPod.vram, perPod.ram, perDevice, "
        "total.vram, total.ram): budget, or policy/<name>/ceiling when a GPUMemoryPolicy ceiling lowered or set it.",
    )
    mode_source: str | None = Field(
        default=None,
        alias="modeSource",
        description="Where effectiveMode came from: budget, or policy/<name> when that GPUMemoryPolicy's mode decided it.",
    )
    oom_kills: OOMKills | None = Field(
        default=None,
        alias="oomKills",
        description="Out-of-memory kills of the selected pods by verdict, counted by the operator as it "
        "publishes each (docs/oom.md).",
    )


class GPUMemoryBudget(APIModel):
    """A namespaced budget for the VRAM and RAM of the pods its selector matches."""

    api_version: Literal["vramguard.io/v1alpha1"] = Field(default="vramguard.io/v1alpha1", alias="apiVersion")
    kind: Literal["GPUMemoryBudget"] = "GPUMemoryBudget"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUMemoryBudgetSpec
    status: GPUMemoryBudgetStatus | None = None
