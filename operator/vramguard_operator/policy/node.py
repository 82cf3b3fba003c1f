"""What a node says about its GPUs: the labels NVIDIA GPU feature discovery
(GFD) publishes, its allocatable resources and, when its agent reports, the
devices of its ``NodeGPUUsage``. Pure: nodes are JSON-like dicts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vramguard_api.usage import GPUDevice, NodeGPUUsage

MiB = 1024**2
GiB = 1024**3

# Node labels published by NVIDIA GPU feature discovery (GFD).
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB, the device's total memory
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"  # none | single | mixed
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_VGPU = "nvidia.com/vgpu.present"

MIG_NAME_GB = re.compile(r"(?:^|\.)(\d+)gb")
"""The nominal size in a MIG profile's name (``1g.5gb`` -> 5)."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a node says about its GPUs: GFD labels, allocatable resources and,
    when the agent reports, its devices (``NodeGPUUsage.status.devices``)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[GPUDevice, ...] = ()

    @classmethod
    def from_api(cls, node: Mapping[str, Any], report: NodeGPUUsage | None = None) -> NodeFacts:
        """Build from a Node as a JSON-like dict and its report (if any)."""
        meta = node.get("metadata") or {}
        status = node.get("status") or {}
        alloc = status.get("allocatable") or status.get("capacity") or {}
        devices = tuple(report.status.devices) if report and report.status else ()
        return cls(
            name=meta.get("name") or "",
            labels=dict(meta.get("labels") or {}),
            allocatable={k: str(v) for k, v in alloc.items()},
            devices=devices,
        )

    @property
    def sharing_strategy(self) -> str:
        """``time-slicing``, ``mps`` or ``none`` (GFD's label; none when absent)."""
        return self.labels.get(LABEL_SHARING, "none") or "none"

    @property
    def replicas(self) -> int:
        """Pods that share one device (``nvidia.com/gpu.replicas``; 1 when absent or
        bad: ``problems`` says so)."""
        raw = self.labels.get(LABEL_REPLICAS, "1")
        return int(raw) if raw.isdigit() and int(raw) >= 1 else 1

    @property
    def problems(self) -> tuple[str, ...]:
        """What the node's labels say that cannot be read, one line each naming
        the label, its value and what is wanted (empty when all are fine)."""
        raw = self.labels.get(LABEL_REPLICAS)
        if raw is None or (raw.isdigit() and int(raw) >= 1):
            return ()
        return (
            f"node {self.name}: label {LABEL_REPLICAS}={raw!r}: wanted a whole number of at least 1; "
            "its devices are taken as unshared",
        )

    @property
    def is_vgpu(self) -> bool:
        """Whether the node's GPUs are vGPUs (GFD label, or a device in vGPU guest mode)."""
        if self.labels.get(LABEL_VGPU) == "true":
            return True
        return any(d.virtualization_mode == "VGPU" for d in self.devices)

    @property
    def uses_mps(self) -> bool:
        """Whether the device plugin shares the node's GPUs through MPS."""
        return self.sharing_strategy == "mps"

    def _whole_gpus(self) -> list[GPUDevice]:
        return [d for d in self.devices if d.mig_profile is None and d.memory is not None]

    def device_usable(self) -> tuple[int, str] | None:
        """Usable memory of one (non-MIG) device in bytes and its basis: the
        smallest reported ``usableBytes`` (``report``), else the GFD memory label
        (``label``: total memory; the reserved part is unknown without a report)."""
        gpus = self._whole_gpus()
        if gpus:
            return min(d.memory.usable_bytes for d in gpus if d.memory), "report"
        total = self._label_mib(LABEL_GPU_MEMORY)
        return None if total is None else (total, "label")

    def device_total(self) -> int | None:
        """Total memory of one (non-MIG) device in bytes (what CUDA reports as
        total): the smallest reported ``totalBytes``, else the GFD label."""
        gpus = self._whole_gpus()
        if gpus:
            return min(d.memory.total_bytes for d in gpus if d.memory)
        return self._label_mib(LABEL_GPU_MEMORY)

    def mig_memory(self, profile: str) -> tuple[int, str] | None:
        """Memory of a MIG device of ``profile`` (``1g.5gb``) in bytes and its basis:
        the GFD label ``nvidia.com/mig-<profile>.memory`` (MiB), else a reported MIG
        device of that profile (usable), else the nominal size in the profile's
        name (``5gb`` → 5·10⁹ bytes, below the real size)."""
        label = self._label_mib(f"nvidia.com/mig-{profile}.memory")
        if label is not None:
            return label, "label"
        reported = [
            d.memory.usable_bytes for d in self.devices if d.mig_profile == profile and d.memory
        ]
        if reported:
            return min(reported), "report"
        m = MIG_NAME_GB.search(profile)
        return (int(m.group(1)) * 10**9, "profile name") if m else None

    def single_mig_profile(self) -> str | None:
        """The MIG profile every ``nvidia.com/gpu`` is, under GFD's ``single``
        strategy (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` → ``1g.5gb``); else None."""
        if self.labels.get(LABEL_MIG_STRATEGY) != "single":
            return None
        product = self.labels.get(LABEL_PRODUCT, "")
        _, sep, profile = product.partition("-MIG-")
        return profile if sep and profile else None

    def _label_mib(self, key: str) -> int | None:
        try:
            return int(self.labels[key]) * MiB
        except (KeyError, ValueError):
            return None
