"""One diagnosis per pod: which memory is the problem, if any (issue 30).

The names, the thresholds a GPUMemoryPolicy sets (``spec.diagnosis``) and their
defaults. The function that decides is ``vramguard_operator.engine.diagnosis``
(pure, over what is measured); docs/policy.md, "Diagnosis", gives the table.

The defaults follow the seed documents and peers: 85% of a limit is the warning
level (the budgets' ``warningThreshold``), 97% of a device's usable memory is
"full" (tensor-fusion's VRAM-full alert), any swap of 64 MiB or more or memory
pressure stalling 10% of the time (``/proc/pressure/memory`` ``some avg10``, as
the kernel's PSI documentation reads it) is a RAM shortage, and a pod holding
half its share while its GPU's utilisation stays at or under 5% for 30 minutes
hoards the GPU.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .bounds import DELAY, MEMORY_LIMIT, Delay, MemoryQuantity
from .meta import APIModel
from .units import parse_duration, quantity_to_bytes

PodDiagnosis = Literal["RAMLeak", "VRAMLeak", "RAMShort", "VRAMShort", "VRAMIdle", "OK"]
"""The diagnoses, in the order they are tried: the first that holds is the pod's."""

DIAGNOSES: tuple[PodDiagnosis, ...] = ("RAMLeak", "VRAMLeak", "RAMShort", "VRAMShort", "VRAMIdle", "OK")


class DiagnosisThresholds(APIModel):
    """When a pod is diagnosed short of a memory or idle on its GPU (``spec.diagnosis``)."""

    vram_short_ratio: float = Field(
        default=0.85,
        alias="vramShortRatio",
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="VRAMShort from this fraction of the pod's VRAM limit (its budget's perPod.vram, or per "
        "device). Default 0.85.",
    )
    device_full_ratio: float = Field(
        default=0.97,
        alias="deviceFullRatio",
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="VRAMShort also when a device the pod uses holds this fraction of its usable memory. "
        "Default 0.97.",
    )
    ram_short_ratio: float = Field(
        default=0.85,
        alias="ramShortRatio",
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="RAMShort from this fraction of the pod's RAM limit (working set over the limit). Default 0.85.",
    )
    min_swap: MemoryQuantity = Field(
        default="64Mi",
        alias="minSwap",
        description="RAMShort when the pod has this much or more in swap (where the node reports swap). Default 64Mi. "
        f"{MEMORY_LIMIT.doc}",
    )
    pressure_percent: float = Field(
        default=10.0,
        alias="pressurePercent",
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="RAMShort when some of the pod's tasks stalled on memory this share of the last 10 s "
        "(PSI some avg10, percent; where the node reports pressure). Default 10.",
    )
    idle_utilization_percent: float = Field(
        default=5.0,
        alias="idleUtilizationPercent",
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="VRAMIdle when the GPU utilisation of the pod stayed at or under this (percent) for idleFor. "
        "Default 5.",
    )
    idle_hold_ratio: float = Field(
        default=0.5,
        alias="idleHoldRatio",
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="VRAMIdle only for a pod holding this fraction of its share (its VRAM limit, else its device's "
        "usable memory) or more. Default 0.5.",
    )
    idle_for: Delay = Field(
        default="30m",
        alias="idleFor",
        description=f"How long low utilisation must last for VRAMIdle. Default 30m. {DELAY.doc}",
    )

    def min_swap_bytes(self) -> int:
        """``minSwap`` in bytes."""
        return quantity_to_bytes(self.min_swap, "spec.diagnosis.minSwap")

    def idle_seconds(self) -> float:
        """``idleFor`` in seconds."""
        return parse_duration(self.idle_for, "spec.diagnosis.idleFor")
