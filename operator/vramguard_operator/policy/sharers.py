"""What GPU sharers granted a pod, read from the annotations they write, as
per-device ``Grants`` (``grants.py``). Each format was read in its project's
own code; the source is in each row of :data:`SHARERS`, the one table of the
sharers: the annotations each reads, which of them alone say the pod uses a GPU,
and its parser. Grants (``sharer_grants``), admission (``may_use_gpu``) and the
informer's kept annotations (``grant_annotations``) all derive from it, so a
new sharer is one row (and its parser). Pure: pods are JSON-like dicts.

=================================================  ===========================
source                                             unit and device
=================================================  ===========================
``nvfractions/nvidia.com/container.<c>.gpu-memory.limit``  quantity per container,
                                                   on each device of its
                                                   ``...<c>.gpus.devices``
``hami/hami.io/vgpu-devices-allocated``            MiB per device UUID
``koordinator/scheduling.koordinator.sh/device-allocated``  bytes (or percent)
                                                   per GPU minor number
``kai/gpu-memory``, ``kai/gpu-fraction``           per device; by UUID when the
                                                   pod's ``runai-gpu-group`` is
                                                   known to a reservation pod
=================================================  ===========================

A malformed value drops that system's whole grant (never half-applied: one
container or device left out would make the pod's limit too small) and is
reported as a ``PodProblem`` naming the annotation and the value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import InvalidOperation
from typing import Any

from vramguard_api.units import format_bytes, quantity_decimal
from vramguard_operator.policy.grants import (
    EVENT_MALFORMED_ALLOCATION,
    EffectiveLimit,
    Grant,
    Grants,
    PodProblem,
    combine,
)
from vramguard_operator.policy.node import MiB, NodeFacts
from vramguard_operator.policy.request import (
    KAI_GPU_FRACTION,
    KAI_GPU_FRACTION_DEVICES,
    KAI_GPU_MEMORY,
    PodGPURequest,
)
from vramguard_operator.policy.shares import kai_limit

# NVIDIA GPU fractioning (KAI's "NvFractions" mode, enforced by MPS through the
# gpu-sharing operator): github.com/run-ai/gpu-sharing-operator,
# sharing-manager/.../annotations (ParseGPUMemoryAnnotations, ParseVisibleDevices)
# and .../plugin/adapter.go (the key pattern). The limit is the MPS hard cap;
# when only the request is set, the limit defaults to it.
NVFRACTIONS_PREFIX = "nvidia.com/container."
_NVFRACTIONS_KEY = re.compile(r"^nvidia\.com/container\.([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)\.gpu-memory\.(limit|request)$")
_NVFRACTIONS_MIN_BYTES = 10**6  # the operator rejects a value under 1 MB
# HAMi: github.com/Project-HAMi/HAMi pkg/device/devices.go (EncodePodSingleDevice,
# DecodeContainerDevices): containers joined by ";", a container's devices by
# ":", each device "UUID,type,usedmem(MiB),usedcores". pkg/device/nvidia/device.go
# names the NVIDIA annotation.
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
# Koordinator: github.com/koordinator-sh/koordinator apis/extension/device_share.go
# (DeviceAllocations: JSON, device type -> [{minor, resources}]). The minor is
# NVML's minor number, which the node report does not carry: see koordinator_grant.
KOORD_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
KOORD_GPU_MEMORY = "koordinator.sh/gpu-memory"
KOORD_GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
# KAI scheduler: github.com/NVIDIA/KAI-Scheduler pkg/common/constants/constants.go,
# pkg/common/resources/gpu_sharing.go (GetGpuGroups) and
# pkg/binder/binding/resourcereservation (the reservation pod of a GPU group
# carries the device's UUID in the annotation run.ai/reserve_for_gpu_index).
KAI_GPU_GROUP = "runai-gpu-group"
KAI_RESERVATION_NAMESPACE = "kai-resource-reservation"
KAI_RESERVED_UUID = "run.ai/reserve_for_gpu_index"


def _bad(annotation: str, value: Any, why: str) -> Grants:
    text = f"annotation {annotation}={value!r}: {why}; this grant is ignored"
    return Grants(problems=(PodProblem(EVENT_MALFORMED_ALLOCATION, text),))


def _is_uuid(name: str) -> bool:
    return name.startswith(("GPU-", "MIG-"))


# --- NVIDIA GPU fractioning ------------------------------------------------------


def nvfractions_grant(annotations: Mapping[str, str]) -> Grants:
    """Per-container GPU memory limits (``nvidia.com/container.<c>.gpu-memory.limit``,
    else ``.request``; Kubernetes quantities): on each device a container lists in
    ``nvidia.com/container.<c>.gpus.devices`` the pod may hold the sum of its
    containers' limits there. When a container's devices are not all named by
    UUID (indices, or not yet assigned), the sum over all containers applies to
    each device instead."""
    per_container: dict[str, tuple[str, int]] = {}
    for key, raw in sorted(annotations.items()):
        m = _NVFRACTIONS_KEY.match(key)
        if m is None:
            continue
        name, kind = m.groups()
        if kind == "request" and name in per_container:
            continue  # the limit is read first (sorted keys) and wins
        try:
            value = int(quantity_decimal(raw))
        except (ValueError, TypeError, InvalidOperation):
            return _bad(key, raw, "not a Kubernetes quantity")
        if value < _NVFRACTIONS_MIN_BYTES:
            return _bad(key, raw, "below the 1 MB that MPS can enforce")
        per_container[name] = (key, value)
    if not per_container:
        return Grants()
    devices: dict[str, list[tuple[str, int]]] = {}
    named = True
    for name, (_, value) in per_container.items():
        listed = [d.strip() for d in annotations.get(f"{NVFRACTIONS_PREFIX}{name}.gpus.devices", "").split(",")]
        listed = [d for d in listed if d]
        named = named and bool(listed) and all(_is_uuid(d) for d in listed)
        for d in listed:
            devices.setdefault(d, []).append((name, value))
    keys = sorted(k for k, _ in per_container.values())
    source = "nvfractions/" + (keys[0] if len(keys) == 1 else f"{NVFRACTIONS_PREFIX}*.gpu-memory.limit")
    if named:
        return Grants((Grant(devices={uuid: _sum_limit(parts, source) for uuid, parts in devices.items()}),))
    return Grants((Grant(each=_sum_limit([(n, v) for n, (_, v) in per_container.items()], source)),))


def _sum_limit(parts: list[tuple[str, int]], source: str) -> EffectiveLimit:
    detail = " + ".join(f"{name} {format_bytes(v)}" for name, v in sorted(parts))
    return EffectiveLimit(sum(v for _, v in parts), source, detail)


# --- HAMi --------------------------------------------------------------------------


def hami_grant(annotations: Mapping[str, str]) -> Grants:
    """HAMi's record of the vGPUs it allocated (``hami.io/vgpu-devices-allocated``):
    the MiB of every container on a device UUID, summed per device. Entries on a
    dynamic-MIG slice (``GPU-...[...]``) name the parent GPU, not the MIG device
    the pod runs on; they set no limit (a MIG device's memory is its own)."""
    raw = annotations.get(HAMI_ALLOCATED)
    if raw is None:
        return Grants()
    per_device: dict[str, int] = {}
    for container in raw.split(";"):
        for entry in container.split(":"):
            if "," not in entry:
                continue  # HAMi skips these too; empty entries keep container positions
            fields = [f.strip() for f in entry.split(",")]
            if len(fields) < 4:
                return _bad(HAMI_ALLOCATED, raw, f"device entry {entry!r} has {len(fields)} fields, 4 expected (UUID,type,MiB,cores)")
            uuid, mem, cores = fields[0], fields[2], fields[3]
            if not (mem.isdigit() and cores.isdigit()) or not uuid:
                return _bad(HAMI_ALLOCATED, raw, f"device entry {entry!r}: memory and cores must be whole numbers")
            if "[" not in uuid and int(mem) > 0:  # 0 MiB books no memory: no limit
                per_device[uuid] = per_device.get(uuid, 0) + int(mem)
    source = f"hami/{HAMI_ALLOCATED}"
    devices = {u: EffectiveLimit(mib * MiB, source, f"{mib} MiB allocated by HAMi") for u, mib in per_device.items()}
    return Grants((Grant(devices=devices),)) if devices else Grants()


# --- Koordinator -------------------------------------------------------------------


def koordinator_grant(annotations: Mapping[str, str], node: NodeFacts | None) -> Grants:
    """Koordinator's device allocation (``scheduling.koordinator.sh/device-allocated``):
    per GPU, ``koordinator.sh/gpu-memory`` (a quantity), else
    ``koordinator.sh/gpu-memory-ratio`` percent of the device's total memory
    (needs the node's). GPUs are named by NVML minor number, which vramguard
    cannot map to a UUID, so the largest per-GPU grant applies to each device
    (the exact grant when, as Koordinator allocates, they are equal)."""
    raw = annotations.get(KOORD_ALLOCATED)
    if raw is None:
        return Grants()
    try:
        data = json.loads(raw)
        entries = (data.get("gpu") or []) if isinstance(data, dict) else None
    except ValueError:
        entries = None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return _bad(KOORD_ALLOCATED, raw, 'not JSON of the form {"gpu": [{"minor": N, "resources": {...}}]}')
    limits: list[EffectiveLimit] = []
    total = node.device_total() if node is not None else None
    for e in entries:
        found = _koord_device(e, total)
        if isinstance(found, str):
            return _bad(KOORD_ALLOCATED, raw, found)
        if found is not None:
            limits.append(found)
    if not limits or min(x.bytes for x in limits) == 0:
        return Grants()  # no GPU, or one with no memory booked: no limit (a whole device)
    return Grants((Grant(each=max(limits, key=lambda x: x.bytes)),))


def _koord_device(entry: Mapping[str, Any], total: int | None) -> EffectiveLimit | str | None:
    """One GPU's grant, an error text, or None (no memory named, or a ratio without the device's size)."""
    minor, res = entry.get("minor"), entry.get("resources") or {}
    if not isinstance(minor, int) or not isinstance(res, dict):
        return f"gpu entry {entry!r}: minor must be an integer and resources an object"
    source = f"koordinator/{KOORD_ALLOCATED}"
    try:
        if KOORD_GPU_MEMORY in res:
            value = int(quantity_decimal(res[KOORD_GPU_MEMORY]))
            return EffectiveLimit(value, source, f"{format_bytes(value)} on GPU minor {minor}")
        if KOORD_GPU_MEMORY_RATIO in res:
            ratio = quantity_decimal(res[KOORD_GPU_MEMORY_RATIO])
            if not 0 < ratio <= 100:  # percent of one GPU
                raise ValueError("ratio")
            if total is None:
                return None
            value = int(total * ratio / 100)
            return EffectiveLimit(value, source, f"{ratio}% of {format_bytes(total)} on GPU minor {minor}")
    except (ValueError, TypeError, InvalidOperation):
        return f"gpu minor {minor}: invalid {KOORD_GPU_MEMORY} or {KOORD_GPU_MEMORY_RATIO} in {res!r}"
    return None


# --- KAI GPU groups ----------------------------------------------------------------


def kai_groups(labels: Mapping[str, str]) -> list[str]:
    """The GPU groups KAI's binder bound the pod to: the label ``runai-gpu-group``,
    and ``runai-gpu-group/<group>`` for each device of a multi-fraction pod."""
    prefix = KAI_GPU_GROUP + "/"
    return sorted({v for k, v in labels.items() if k == KAI_GPU_GROUP or k.startswith(prefix)})


def kai_group_devices(reservation_pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """GPU group -> device UUID, from KAI's reservation pods (namespace
    ``kai-resource-reservation``; the group in their labels, the UUID in the
    annotation ``run.ai/reserve_for_gpu_index`` once the pod is running)."""
    out: dict[str, str] = {}
    for pod in reservation_pods:
        meta = pod.get("metadata") or {}
        uuid = (meta.get("annotations") or {}).get(KAI_RESERVED_UUID, "")
        if meta.get("namespace") != KAI_RESERVATION_NAMESPACE or not _is_uuid(uuid):
            continue
        for group in kai_groups(meta.get("labels") or {}):
            out[group] = uuid
    return out


def kai_grant(labels: Mapping[str, str], each: EffectiveLimit | None, group_devices: Mapping[str, str]) -> Grants:
    """KAI's per-device grant (``each``, from ``gpu-memory``/``gpu-fraction``:
    ``shares.kai_limit``) on the UUIDs of the pod's GPU groups, when every group
    is known to a reservation pod; nothing otherwise (``each`` still applies to
    each of the pod's devices through the declared limit)."""
    groups = kai_groups(labels)
    if each is None or not groups or not all(g in group_devices for g in groups):
        return Grants()
    devices = {
        group_devices[g]: EffectiveLimit(each.bytes, each.source, f"{each.detail}; GPU group {g}") for g in groups
    }
    return Grants((Grant(devices=devices),))


# --- the table of sharers ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodView:
    """What a sharer's parser may read of one pod: its annotations and labels, its
    node (None: unknown), its GPU request, and KAI's GPU groups' device UUIDs."""

    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    node: NodeFacts | None
    request: PodGPURequest
    group_devices: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Sharer:
    """One GPU sharer: ``name`` (the prefix of its grants' source), ``source`` (where
    its format was read: project and file), ``reads`` (the annotation keys its
    parser reads) and ``reads_prefix`` (a key prefix it reads: every key under it),
    ``declares`` (whether an annotation key alone says the pod uses a GPU: an
    allocation record), and ``grant`` (the parser: the pod's grants and problems)."""

    name: str
    source: str
    reads: tuple[str, ...]
    grant: Callable[[PodView], Grants]
    declares: Callable[[str], bool] = lambda key: False
    reads_prefix: str | None = None


SHARERS: tuple[Sharer, ...] = (
    Sharer(
        "nvfractions",
        "github.com/run-ai/gpu-sharing-operator sharing-manager annotations (ParseGPUMemoryAnnotations), plugin/adapter.go",
        reads=(),
        reads_prefix=NVFRACTIONS_PREFIX,
        grant=lambda v: nvfractions_grant(v.annotations),
        declares=lambda key: _NVFRACTIONS_KEY.match(key) is not None,
    ),
    Sharer(
        "hami",
        "github.com/Project-HAMi/HAMi pkg/device/devices.go (EncodePodSingleDevice), pkg/device/nvidia/device.go",
        reads=(HAMI_ALLOCATED,),
        grant=lambda v: hami_grant(v.annotations),
        declares=lambda key: key == HAMI_ALLOCATED,
    ),
    Sharer(
        "koordinator",
        "github.com/koordinator-sh/koordinator apis/extension/device_share.go (DeviceAllocations)",
        reads=(KOORD_ALLOCATED,),
        grant=lambda v: koordinator_grant(v.annotations, v.node),
        declares=lambda key: key == KOORD_ALLOCATED,
    ),
    Sharer(
        "kai",
        "github.com/NVIDIA/KAI-Scheduler pkg/common/constants/constants.go, pkg/common/resources/gpu_sharing.go",
        # gpu-memory and gpu-fraction make a GPU pod through PodGPURequest, not as a record
        reads=(KAI_GPU_MEMORY, KAI_GPU_FRACTION, KAI_GPU_FRACTION_DEVICES, KAI_RESERVED_UUID),
        grant=lambda v: kai_grant(v.labels, kai_limit(v.request, v.node), v.group_devices),
    ),
)
"""Every GPU sharer vramguard reads, in the order their grants combine."""

_READS = frozenset(k for s in SHARERS for k in s.reads)
_READ_PREFIXES = tuple(s.reads_prefix for s in SHARERS if s.reads_prefix is not None)


def sharer_grants(
    pod: Mapping[str, Any], node: NodeFacts | None, group_devices: Mapping[str, str] | None = None
) -> Grants:
    """Every grant the pod's GPU-sharer annotations record (:data:`SHARERS`),
    with the problems of those, of its resources and KAI annotations
    (``PodGPURequest.problems``) and of its node's labels (``NodeFacts.problems``). ``group_devices``: KAI's GPU groups' device
    UUIDs (``kai_group_devices``)."""
    meta = pod.get("metadata") or {}
    req = PodGPURequest.from_api(pod)
    view = PodView(meta.get("annotations") or {}, meta.get("labels") or {}, node, req, group_devices or {})
    parts = [s.grant(view) for s in SHARERS]
    unread = req.problems + (node.problems if node is not None else ())
    parts.append(Grants(problems=tuple(PodProblem(EVENT_MALFORMED_ALLOCATION, p) for p in unread)))
    return combine(parts)


def declares_grant(annotations: Mapping[str, str]) -> bool:
    """Whether a pod carries a sharer's allocation annotation (such a pod uses a
    GPU even when it requests no GPU resource: NVIDIA's fractions, Koordinator)."""
    return any(s.declares(k) for k in annotations for s in SHARERS)


def grant_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The pod annotations grants are read from (every sharer's ``reads`` and
    ``reads_prefix``): what the informer keeps of a GPU pod's annotations."""
    return {k: v for k, v in annotations.items() if k in _READS or k.startswith(_READ_PREFIXES)}


def may_use_gpu(pod: Mapping[str, Any]) -> bool:
    """Whether a pod may use a GPU: through GPU resources or KAI's annotations
    (``PodGPURequest.is_gpu_pod``), a sharer's allocation annotation, or a
    ResourceClaim (whose devices then decide: ``dra.claim_grants``)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return bool(
        spec.get("resourceClaims")
        or declares_grant(meta.get("annotations") or {})
        or PodGPURequest.from_api(pod).is_gpu_pod
    )
