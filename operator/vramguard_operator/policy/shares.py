"""The limit on each of a pod's devices: what another system granted it
(declared in its resources or KAI's annotations, or recorded as a grant:
``grants.py``), else its policies' defaults and the node's share, lowered by
the policies' ceilings; and the limits on the devices a grant names.

Sources of each limit (the ``source`` strings that status, annotations and
``vramguard top`` show; units, spellings and precedence in docs/policy.md and
docs/allocations.md):

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
``dra/<claim>``, ``hami/...``,   grants on named devices (``dra.py``,
``nvfractions/...``,             ``sharers.py``)
``koordinator/...``
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

from collections.abc import Mapping, Sequence
from decimal import InvalidOperation
from typing import Any

from vramguard_api.units import format_bytes, quantity_decimal
from vramguard_operator.policy.grants import EffectiveLimit, Grants, strictest
from vramguard_operator.policy.merge import MergedPolicy, Sourced
from vramguard_operator.policy.node import MIG_NAME_GB, GiB, MiB, NodeFacts
from vramguard_operator.policy.request import (
    ALIYUN_GPU_COUNT,
    ALIYUN_GPU_MEM,
    HAMI_GPUMEM,
    HAMI_GPUMEM_PERCENTAGE,
    KAI_GPU_FRACTION,
    KAI_GPU_MEMORY,
    PodGPURequest,
    container_resources,
)

# --- limits -------------------------------------------------------------------------


def declared_limit(req: PodGPURequest, node: NodeFacts | None) -> EffectiveLimit | None:
    """The per-device limit another GPU-sharing system declares for the pod in
    its resources or KAI's annotations, or None. Order when a pod declares
    several: HAMi gpumem, HAMi percentage, Aliyun, KAI gpu-memory, KAI
    gpu-fraction. A percentage or fraction needs the device's total memory
    (from the node); without it, it is skipped."""
    return _hami_limit(req, node) or _aliyun_limit(req, node) or kai_limit(req, node)


def _hami_limit(req: PodGPURequest, node: NodeFacts | None) -> EffectiveLimit | None:
    """HAMi's ``nvidia.com/gpumem`` (MiB per vGPU), else ``gpumem-percentage`` of
    the device's total (HAMi ignores the percentage when both are set)."""
    if req.hami_gpumem_mib is not None:
        return EffectiveLimit(
            req.hami_gpumem_mib * MiB, f"hami/{HAMI_GPUMEM}", f"{req.hami_gpumem_mib} MiB per vGPU"
        )
    total = node.device_total() if node else None
    if req.hami_percentage is not None and total is not None:
        pct = min(100, req.hami_percentage)
        return EffectiveLimit(total * pct // 100, f"hami/{HAMI_GPUMEM_PERCENTAGE}", f"{pct}% of {format_bytes(total)}")
    return None


def _aliyun_limit(req: PodGPURequest, node: NodeFacts | None) -> EffectiveLimit | None:
    if req.aliyun_gpu_mem is None:
        return None
    unit, unit_name = _aliyun_unit(node)
    return EffectiveLimit(
        int(req.aliyun_gpu_mem * unit), f"aliyun/{ALIYUN_GPU_MEM}", f"{req.aliyun_gpu_mem} {unit_name} per pod"
    )


def kai_limit(req: PodGPURequest, node: NodeFacts | None) -> EffectiveLimit | None:
    """KAI's per-device grant: ``gpu-memory`` MiB, else ``gpu-fraction`` of the
    device's total memory (KAI's arithmetic); None without either, or for a
    fraction without the device's size."""
    if req.kai_memory_mib is not None:
        return EffectiveLimit(req.kai_memory_mib * MiB, f"kai/{KAI_GPU_MEMORY}", f"{req.kai_memory_mib} MiB per device")
    total = node.device_total() if node else None
    if req.kai_fraction is not None and total is not None:
        return EffectiveLimit(
            int(total * req.kai_fraction), f"kai/{KAI_GPU_FRACTION}", f"{req.kai_fraction:g} of {format_bytes(total)}"
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
    m = MIG_NAME_GB.search(profile)
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
    return strictest(*candidates)


def per_device_limit(
    req: PodGPURequest, node: NodeFacts | None, merged: MergedPolicy, grants: Grants | None = None
) -> EffectiveLimit | None:
    """The limit on each of a GPU pod's devices (per-UUID grants aside: ``device_limits``).

    Precedence: what another system granted the pod (``declared_limit`` and the
    ``each`` part of its ``grants``, the strictest of them) is the pod's share
    and is used as it is; a pod with only per-UUID grants gets no limit on its
    other devices from here. Otherwise the smallest of the policy's explicit
    ``perDevice`` default and, where a policy asks for it (``shareFromNode``),
    the node's share (the MIG profile's memory for a MIG pod, else
    ``node_share``). Then the policy's ``perDevice`` ceiling lowers the result
    if it is smaller. None when nothing sets a limit.
    """
    granted = grants or Grants()
    usable = _usable(node)
    limit = strictest(declared_limit(req, node), granted.each_device())
    if limit is None and not granted.by_device():
        candidates = [_explicit_default(merged, usable)]
        if merged.share_from_node is not None:
            candidates.append(mig_limit(req, node) or (node_share(node) if node is not None else None))
        limit = strictest(*candidates)
    if limit is None:
        return None
    return clamp(limit, device_ceiling(merged, usable))


def device_limits(
    each: EffectiveLimit | None, node: NodeFacts | None, merged: MergedPolicy, grants: Grants
) -> dict[str, EffectiveLimit]:
    """The limit on each device UUID a grant names: the strictest grant there,
    lowered by the pod's limit on each device (``each``: ``per_device_limit``)
    and by the policy's ``perDevice`` ceiling on that device (a fraction
    ceiling of the device's usable memory as its node reports it)."""
    reported = {d.uuid: d.memory.usable_bytes for d in (node.devices if node else ()) if d.memory}
    out = {}
    for uuid, granted in sorted(grants.by_device().items()):
        limit = granted if each is None or granted.bytes <= each.bytes else each
        out[uuid] = clamp(limit, device_ceiling(merged, reported.get(uuid, _usable(node))))
    return out


def _usable(node: NodeFacts | None) -> int | None:
    found = node.device_usable() if node is not None else None
    return found[0] if found else None


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
            r for r in container_resources(c) if r.startswith(("nvidia.com/", "aliyun.com/"))
        }
    return [
        n
        for n in nodes
        if all(n.labels.get(k) == v for k, v in selector.items())
        and all(r in n.allocatable for r in wanted)
    ]
