"""Per-device shares from what the node says, and budgets other GPU-sharing
systems already declare on a pod.

Sources of each limit (the ``source`` strings that status, annotations and
``vramguard top`` show; units and spellings in docs/policy.md):

===============================  ==============================================
``node/time-slicing:<N>``        usable memory / N (``nvidia.com/gpu.replicas``,
``node/mps:<N>``                 ``nvidia.com/gpu.sharing-strategy`` from GFD)
``node/exclusive``               a whole, unshared device's usable memory
``vgpu/usable``                  a vGPU's usable memory (total − reserved, from
                                 the node's NodeGPUUsage report), / N if shared
``mig/<profile>``                the MIG profile's memory (GFD label
                                 ``nvidia.com/mig-<profile>.memory``, MiB)
``hami/nvidia.com/gpumem``       HAMi: MiB per vGPU (resource limit)
``hami/nvidia.com/gpumem-percentage``  HAMi: percent of the device's memory
``aliyun/aliyun.com/gpu-mem``    Aliyun gpushare: GiB per pod (MiB when the
                                 node advertises memory in MiB)
``kai/gpu-memory``               KAI scheduler annotation: MiB per device
``kai/gpu-fraction``             KAI scheduler annotation: fraction of a device
``policy/<name>``                a GPUMemoryPolicy default
``policy/<name>/ceiling``        a GPUMemoryPolicy ceiling that lowered the limit
===============================  ==============================================

vramguard's own shares are computed on *usable* memory (total − reserved, as
NVML reports it). Budgets declared for another system are reproduced with that
system's own arithmetic (HAMi, Aliyun and KAI all count a device's *total*
memory), so that vramguard's limit is the one the pod was granted.

Everything here is pure: nodes and pods are JSON-like dicts, reports are
``NodeGPUUsage`` models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from vramguard_api.units import format_bytes, quantity_decimal
from vramguard_api.usage import GPUDevice, NodeGPUUsage
from vramguard_operator.policy.merge import MergedPolicy, Sourced

MiB = 1024**2
GiB = 1024**3

# Node labels published by NVIDIA GPU feature discovery (GFD).
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB, the device's total memory
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING = "nvidia.com/gpu.sharing-strategy"  # none | time-slicing | mps
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"  # none | single | mixed
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_VGPU = "nvidia.com/vgpu.present"

# Pod resources and annotations of GPU-sharing systems.
RESOURCE_GPU = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
HAMI_GPUMEM = "nvidia.com/gpumem"  # MiB per vGPU
HAMI_GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"  # percent of the device per vGPU
ALIYUN_GPU_MEM = "aliyun.com/gpu-mem"  # GiB (default unit of gpushare-device-plugin)
ALIYUN_GPU_COUNT = "aliyun.com/gpu-count"  # node resource: number of shared GPUs
KAI_GPU_MEMORY = "gpu-memory"  # pod annotation, MiB per device
KAI_GPU_FRACTION = "gpu-fraction"  # pod annotation, fraction of one device in (0, 1]

_MIG_NAME_GB = re.compile(r"(?:^|\.)(\d+)gb")


@dataclass(frozen=True, slots=True)
class EffectiveLimit:
    """A limit in bytes, where it came from (``source``, see the module table)
    and a short human explanation of the arithmetic (``detail``)."""

    bytes: int
    source: str
    detail: str = ""

    def describe(self) -> str:
        """``19.8Gi from node/time-slicing:4 (79.2Gi usable / 4)``."""
        extra = f" ({self.detail})" if self.detail else ""
        return f"{format_bytes(self.bytes)} from {self.source}{extra}"


# --- the node -----------------------------------------------------------------------


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
        """Pods that share one device (``nvidia.com/gpu.replicas``; 1 when absent or bad)."""
        try:
            return max(1, int(self.labels.get(LABEL_REPLICAS, "1")))
        except ValueError:
            return 1

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
        m = _MIG_NAME_GB.search(profile)
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


# --- the pod ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodGPURequest:
    """What a pod asks for on GPUs, summed or maxed over its containers.

    ``gpus``: ``nvidia.com/gpu`` devices (or vGPUs under HAMi). ``mig``: count
    per MIG profile. ``hami_gpumem_mib`` / ``hami_percentage``: the largest
    per-container HAMi grant per device. ``aliyun_gpu_mem``: sum over
    containers, in the node's unit. ``kai_memory_mib`` / ``kai_fraction``: the
    KAI scheduler annotations. ``problems``: unparsable values (skipped), each
    naming the field and the value.
    """

    gpus: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)
    hami_gpumem_mib: int | None = None
    hami_percentage: int | None = None
    aliyun_gpu_mem: Decimal | None = None
    kai_memory_mib: int | None = None
    kai_fraction: float | None = None
    gpu_containers: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def is_gpu_pod(self) -> bool:
        """Whether the pod uses a GPU through any of the supported resources."""
        return bool(
            self.gpus
            or self.mig
            or self.aliyun_gpu_mem
            or self.kai_memory_mib
            or self.kai_fraction
            or self.hami_gpumem_mib
        )

    @property
    def device_count(self) -> int:
        """Devices the pod holds (GPUs plus MIG devices; 1 for a fractional share)."""
        return max(1, self.gpus + sum(self.mig.values()))

    @classmethod
    def from_api(cls, pod: Mapping[str, Any]) -> PodGPURequest:
        """Parse a Pod (JSON-like dict). Resource values are read from
        ``limits``, else ``requests`` (extended resources must have equal ones)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        where = f"pod {meta.get('namespace')}/{meta.get('name') or meta.get('generateName')}"
        problems: list[str] = []
        gpus = 0
        mig: dict[str, int] = {}
        gpumem: list[int] = []
        percent: list[int] = []
        aliyun = Decimal(0)
        gpu_containers = []
        for i, c in enumerate(spec.get("containers") or ()):
            res = _container_resources(c)
            path = f"{where}: spec.containers[{i}].resources"
            uses = False
            for name, raw in res.items():
                value = _number(raw, f"{path}[{name}]", problems)
                if value is None or value <= 0:
                    continue
                if name == RESOURCE_GPU:
                    gpus += int(value)
                elif name.startswith(MIG_RESOURCE_PREFIX):
                    profile = name.removeprefix(MIG_RESOURCE_PREFIX)
                    mig[profile] = mig.get(profile, 0) + int(value)
                elif name == HAMI_GPUMEM:
                    gpumem.append(int(value))
                elif name == HAMI_GPUMEM_PERCENTAGE:
                    percent.append(int(value))
                elif name == ALIYUN_GPU_MEM:
                    aliyun += value
                else:
                    continue
                uses = True
            if uses:
                gpu_containers.append(c.get("name") or "")
        ann = meta.get("annotations") or {}
        kai_mem = _number(ann.get(KAI_GPU_MEMORY), f"{where}: annotation {KAI_GPU_MEMORY}", problems)
        kai_frac = _fraction(ann.get(KAI_GPU_FRACTION), f"{where}: annotation {KAI_GPU_FRACTION}", problems)
        return cls(
            gpus=gpus,
            mig=mig,
            hami_gpumem_mib=max(gpumem) if gpumem else None,
            hami_percentage=max(percent) if percent else None,
            aliyun_gpu_mem=aliyun or None,
            kai_memory_mib=int(kai_mem) if kai_mem else None,
            kai_fraction=kai_frac,
            gpu_containers=tuple(gpu_containers),
            problems=tuple(problems),
        )


def _container_resources(c: Mapping[str, Any]) -> dict[str, Any]:
    res = c.get("resources") or {}
    return {**(res.get("requests") or {}), **(res.get("limits") or {})}


def _number(raw: Any, where: str, problems: list[str]) -> Decimal | None:
    if raw is None:
        return None
    try:
        return quantity_decimal(raw)
    except (ValueError, TypeError, InvalidOperation):
        problems.append(f"{where}: invalid quantity {raw!r}")
        return None


def _fraction(raw: Any, where: str, problems: list[str]) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not 0 < value <= 1:
        problems.append(f"{where}: {raw!r} is not a fraction in (0, 1]")
        return None
    return value


# --- limits -------------------------------------------------------------------------


def declared_limit(req: PodGPURequest, node: NodeFacts | None) -> EffectiveLimit | None:
    """The per-device limit another GPU-sharing system declares for the pod, or
    None. Order when a pod declares several: HAMi gpumem, HAMi percentage,
    Aliyun, KAI gpu-memory, KAI gpu-fraction. A percentage or fraction needs
    the device's total memory (from the node); without it, it is skipped."""
    total = node.device_total() if node else None
    if req.hami_gpumem_mib is not None:
        return EffectiveLimit(
            req.hami_gpumem_mib * MiB, f"hami/{HAMI_GPUMEM}", f"{req.hami_gpumem_mib} MiB per vGPU"
        )
    if req.hami_percentage is not None and total is not None:
        pct = min(100, req.hami_percentage)
        return EffectiveLimit(
            total * pct // 100,
            f"hami/{HAMI_GPUMEM_PERCENTAGE}",
            f"{pct}% of {format_bytes(total)}",
        )
    if req.aliyun_gpu_mem is not None:
        unit, unit_name = _aliyun_unit(node)
        return EffectiveLimit(
            int(req.aliyun_gpu_mem * unit),
            f"aliyun/{ALIYUN_GPU_MEM}",
            f"{req.aliyun_gpu_mem} {unit_name} per pod",
        )
    if req.kai_memory_mib is not None:
        return EffectiveLimit(
            req.kai_memory_mib * MiB, f"kai/{KAI_GPU_MEMORY}", f"{req.kai_memory_mib} MiB per device"
        )
    if req.kai_fraction is not None and total is not None:
        return EffectiveLimit(
            int(total * req.kai_fraction),
            f"kai/{KAI_GPU_FRACTION}",
            f"{req.kai_fraction:g} of {format_bytes(total)}",
        )
    return None


def _aliyun_unit(node: NodeFacts | None) -> tuple[int, str]:
    """gpushare-device-plugin counts memory in GiB unless started with
    ``--memory-unit=MiB``. Per GPU, the node advertises its memory in that unit:
    more than 1024 units per GPU can only be MiB."""
    if node is not None:
        try:
            total = quantity_decimal(node.allocatable[ALIYUN_GPU_MEM])
            count = quantity_decimal(node.allocatable.get(ALIYUN_GPU_COUNT, "1")) or 1
            if total / count > 1024:
                return MiB, "MiB"
        except (KeyError, ValueError, TypeError, InvalidOperation):
            pass
    return GiB, "GiB"


def mig_limit(req: PodGPURequest, node: NodeFacts | None) -> EffectiveLimit | None:
    """The memory of the pod's MIG device: the largest profile it requests
    (mixed strategy: ``nvidia.com/mig-<profile>`` resources), or the node's
    profile under the single strategy. None for a pod without MIG devices or
    when the profile's memory is unknown."""
    profiles = list(req.mig)
    if not profiles and req.gpus and node is not None:
        single = node.single_mig_profile()
        profiles = [single] if single else []
    best: EffectiveLimit | None = None
    for profile in profiles:
        found = _mig_memory(profile, node)
        if found is None:
            continue
        size, basis = found
        if best is None or size > best.bytes:
            best = EffectiveLimit(size, f"mig/{profile}", f"MIG {profile}: {format_bytes(size)} ({basis})")
    return best


def _mig_memory(profile: str, node: NodeFacts | None) -> tuple[int, str] | None:
    if node is not None:
        return node.mig_memory(profile)
    m = _MIG_NAME_GB.search(profile)
    return (int(m.group(1)) * 10**9, "profile name") if m else None


def node_share(node: NodeFacts) -> EffectiveLimit | None:
    """A device's usable memory divided among the pods that share it
    (``nvidia.com/gpu.replicas`` under time-slicing or MPS); None when the
    node says nothing about its devices' memory."""
    usable = node.device_usable()
    if usable is None:
        return None
    size, basis = usable
    n = node.replicas if node.sharing_strategy in ("time-slicing", "mps") else 1
    share = size // n
    what = "usable" if basis == "report" else "total (label; reserved unknown)"
    detail = f"{format_bytes(size)} {what}" + (f" / {n}" if n > 1 else "")
    if node.is_vgpu:
        prefix = "vgpu/usable" if basis == "report" else "vgpu/label"
        suffix = f"/{node.sharing_strategy}:{n}" if n > 1 else ""
        return EffectiveLimit(share, prefix + suffix, detail)
    if n > 1:
        return EffectiveLimit(share, f"node/{node.sharing_strategy}:{n}", detail)
    return EffectiveLimit(share, "node/exclusive", detail)


def _explicit_default(merged: MergedPolicy, usable: int | None) -> EffectiveLimit | None:
    candidates: list[EffectiveLimit] = []
    if merged.default_device_vram is not None:
        d = merged.default_device_vram
        candidates.append(EffectiveLimit(d.value, d.source, "default perDevice.vram"))
    if merged.default_device_fraction is not None and usable is not None:
        f = merged.default_device_fraction
        candidates.append(
            EffectiveLimit(int(usable * f.value), f.source, f"default perDevice.fraction {f.value:g}")
        )
    return min(candidates, key=lambda c: c.bytes, default=None)


def per_device_limit(
    req: PodGPURequest, node: NodeFacts | None, merged: MergedPolicy
) -> EffectiveLimit | None:
    """The per-device VRAM limit of a GPU pod that no GPUMemoryBudget selects.

    Precedence: a budget another GPU-sharing system declares (``declared_limit``)
    is the pod's grant and is used as it is; otherwise the smallest of the
    policy's explicit ``perDevice`` default and, where a policy asks for it
    (``shareFromNode``), the node's share (the MIG profile's memory for a MIG
    pod, else ``node_share``). Then the policy's ``perDevice`` ceiling lowers
    the result if it is smaller. None when nothing sets a limit.
    """
    usable = None
    if node is not None:
        found = node.device_usable()
        usable = found[0] if found else None
    limit = declared_limit(req, node)
    if limit is None:
        candidates = [_explicit_default(merged, usable)]
        if merged.share_from_node is not None:
            share = mig_limit(req, node) or (node_share(node) if node is not None else None)
            candidates.append(share)
        limit = min((c for c in candidates if c is not None), key=lambda c: c.bytes, default=None)
    if limit is None:
        return None
    return clamp(limit, device_ceiling(merged, usable))


def device_ceiling(merged: MergedPolicy, usable: int | None) -> EffectiveLimit | None:
    """The policy's ``perDevice`` ceiling in bytes on a device with ``usable``
    bytes (a fraction ceiling needs it), the smaller of the two when both exist."""
    candidates = []
    if merged.ceiling_device_vram is not None:
        c = merged.ceiling_device_vram
        candidates.append(EffectiveLimit(c.value, f"{c.source}/ceiling", "ceiling perDevice.vram"))
    if merged.ceiling_device_fraction is not None and usable is not None:
        f = merged.ceiling_device_fraction
        candidates.append(
            EffectiveLimit(
                int(usable * f.value), f"{f.source}/ceiling", f"ceiling perDevice.fraction {f.value:g}"
            )
        )
    return min(candidates, key=lambda c: c.bytes, default=None)


def clamp(limit: EffectiveLimit, ceiling: EffectiveLimit | None) -> EffectiveLimit:
    """``limit``, or ``ceiling`` when the ceiling is smaller (its source wins)."""
    if ceiling is None or ceiling.bytes >= limit.bytes:
        return limit
    return EffectiveLimit(
        ceiling.bytes, ceiling.source, f"{ceiling.detail}; lowered from {limit.describe()}"
    )


def sourced_limit(
    value: Sourced[int] | None, what: str, ceiling: Sourced[int] | None
) -> EffectiveLimit | None:
    """A policy default (``value``) lowered by a ceiling (``ceiling``), as an
    EffectiveLimit; None when the default is unset."""
    if value is None:
        return None
    limit = EffectiveLimit(value.value, value.source, f"default {what}")
    cap = None
    if ceiling is not None:
        cap = EffectiveLimit(ceiling.value, f"{ceiling.source}/ceiling", f"ceiling {what}")
    return clamp(limit, cap)


def candidate_nodes(pod: Mapping[str, Any], nodes: Sequence[NodeFacts]) -> list[NodeFacts]:
    """The nodes a pod can land on, as far as admission can tell: its
    ``spec.nodeName`` if set, else the nodes whose labels match its
    ``spec.nodeSelector`` and that allocate every GPU resource it requests.
    (Affinity and taints are the scheduler's; this errs towards more nodes.)"""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return [n for n in nodes if n.name == spec["nodeName"]]
    selector = spec.get("nodeSelector") or {}
    wanted = set()
    for c in spec.get("containers") or ():
        wanted |= {
            r for r in _container_resources(c) if r.startswith(("nvidia.com/", "aliyun.com/"))
        }
    return [
        n
        for n in nodes
        if all(n.labels.get(k) == v for k, v in selector.items())
        and all(r in n.allocatable for r in wanted)
    ]
