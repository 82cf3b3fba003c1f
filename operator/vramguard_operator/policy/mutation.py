"""Framework memory caps for GPU pods, as a JSON patch (the mutating webhook).

Injected into each GPU container, never over a variable the container sets
itself (docs/policy.md, "Mutating webhook"):

``XLA_PYTHON_CLIENT_MEM_FRACTION``
    JAX preallocates this fraction of the device's *total* memory as CUDA
    reports it (XLA: ``allocator_memory = total_memory * memory_fraction``).
    Set to ``(limit − headroom) / total``, rounded down to 3 decimals, where
    headroom (512 MiB, at most half the limit) leaves room for the CUDA context
    and libraries outside the allocator, so that the process as NVML measures
    it stays under the limit. Omitted when the limit is the whole device or the
    total is unknown.
``TF_FORCE_GPU_ALLOW_GROWTH=true``
    TensorFlow allocates as it needs instead of mapping the whole device.
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    PyTorch's caching allocator grows segments in place, which keeps its
    reserved memory close to what is allocated (less fragmentation). Not set
    when the container sets ``PYTORCH_CUDA_ALLOC_CONF`` or its newer name
    ``PYTORCH_ALLOC_CONF``.
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
    On MPS nodes only: the MPS client's device memory limit, ``<ordinal>=<N>M``
    per device the container sees, comma-separated (``0=4096M,1=4096M``), as
    NVIDIA's MPS documentation gives it; N is the limit in MiB, rounded down.

A container with ``envFrom`` is left alone: its ConfigMap or Secret may set any
of these variables, and an ``env`` entry would silently override it.

What was set, kept and skipped is recorded in the pod annotation
``vramguard.io/injected`` (compact JSON). A pod that already carries the
annotation is not changed again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramguard_api.units import format_bytes
from vramguard_operator.policy.grants import EffectiveLimit
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import MiB, NodeFacts
from vramguard_operator.policy.request import GPU_RESOURCES, PodGPURequest
from vramguard_operator.policy.shares import per_device_limit

ANNOTATION_INJECTED = "vramguard.io/injected"
GPU_POD_LABEL = "vramguard.io/gpu-pod"
"""Set to ``"true"`` by the mutating webhook on every pod that requests a GPU:
the operator's pod watch selects it, so that other pods are never sent to the
operator (docs/operator.md, "Which pods are watched")."""
CONTEXT_HEADROOM_BYTES = 512 * MiB

XLA_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
TF_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
TORCH_ALLOC = "PYTORCH_CUDA_ALLOC_CONF"
TORCH_ALLOC_NEW = "PYTORCH_ALLOC_CONF"
MPS_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

JSONPatch = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What the caps depend on besides the limit: the total memory of one of
    the pod's devices as CUDA reports it (bytes; for a MIG device, its own
    memory), and whether the node shares devices through MPS."""

    total_bytes: int | None = None
    mps: bool = False


def xla_fraction(limit_bytes: int, total_bytes: int | None) -> str | None:
    """``XLA_PYTHON_CLIENT_MEM_FRACTION`` for a per-device limit (see module doc);
    None when no cap is needed (limit ≥ total) or possible (total unknown)."""
    if total_bytes is None or total_bytes <= 0 or limit_bytes >= total_bytes:
        return None
    usable = max(limit_bytes - CONTEXT_HEADROOM_BYTES, limit_bytes // 2)
    fraction = math.floor(usable / total_bytes * 1000) / 1000
    return f"{max(fraction, 0.001):.3f}"


def mps_limit(limit_bytes: int, devices: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for ``devices`` devices (ordinals
    0..devices-1), each limited to ``limit_bytes`` rounded down to MiB."""
    mib = max(1, limit_bytes // MiB)
    return ",".join(f"{i}={mib}M" for i in range(max(1, devices)))


def _wanted(limit: EffectiveLimit | None, facts: DeviceFacts, gpus: int) -> dict[str, str]:
    wanted = {TF_GROWTH: "true", TORCH_ALLOC: "expandable_segments:True"}
    if limit is not None:
        frac = xla_fraction(limit.bytes, facts.total_bytes)
        if frac is not None:
            wanted[XLA_FRACTION] = frac
        if facts.mps:
            wanted[MPS_LIMIT] = mps_limit(limit.bytes, gpus)
    return dict(sorted(wanted.items()))


def _own_names(container: Mapping[str, Any]) -> set[str]:
    names = {e.get("name") for e in container.get("env") or () if e.get("name")}
    if TORCH_ALLOC_NEW in names:
        names.add(TORCH_ALLOC)  # the newer name of the same setting
    return names


def _gpu_count(container: Mapping[str, Any]) -> int:
    res = container.get("resources") or {}
    total = 0
    for name in GPU_RESOURCES:
        raw = (res.get("limits") or {}).get(name) or (res.get("requests") or {}).get(name)
        try:
            total += int(str(raw)) if raw is not None else 0
        except (TypeError, ValueError):
            pass
    return max(1, total)


def mutate_pod(
    pod: Mapping[str, Any],
    limit: EffectiveLimit | None,
    facts: DeviceFacts,
    gpu_containers: Sequence[str] | None = None,
) -> tuple[JSONPatch, dict[str, Any] | None]:
    """The JSON patch (RFC 6902 ops) that injects the caps, and the record
    written to ``vramguard.io/injected`` (None when nothing is patched).

    ``limit``: the pod's effective per-device limit (None: only the
    limit-independent caps). ``gpu_containers``: names of the containers that
    use GPUs (None or empty: every container, as for KAI's annotation-only
    fractional pods). The pod itself is not modified.
    """
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if ANNOTATION_INJECTED in annotations:
        return [], None
    containers = (pod.get("spec") or {}).get("containers") or []
    chosen = set(gpu_containers or ())
    ops: JSONPatch = []
    record: dict[str, Any] = {
        "limit": format_bytes(limit.bytes) if limit else None,
        "source": limit.source if limit else None,
        "set": {},
        "kept": {},
        "skipped": {},
    }
    for i, c in enumerate(containers):
        name = c.get("name") or str(i)
        if chosen and name not in chosen:
            continue
        if c.get("envFrom"):
            record["skipped"][name] = "envFrom may set these variables"
            continue
        own = _own_names(c)
        wanted = _wanted(limit, facts, _gpu_count(c))
        new = [{"name": k, "value": v} for k, v in wanted.items() if k not in own]
        kept = sorted(k for k in wanted if k in own)
        if kept:
            record["kept"][name] = kept
        if not new:
            continue
        record["set"][name] = {e["name"]: e["value"] for e in new}
        base = f"/spec/containers/{i}/env"
        if c.get("env") is None:
            ops.append({"op": "add", "path": base, "value": new})
        else:
            ops.extend({"op": "add", "path": f"{base}/-", "value": e} for e in new)
    if not (record["set"] or record["kept"] or record["skipped"]):
        return [], None
    record = {k: v for k, v in record.items() if v not in (None, {})}
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if meta.get("annotations") is None:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION_INJECTED: text}})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations/vramguard.io~1injected", "value": text})
    return ops, record


def admission_limit(
    req: PodGPURequest, candidates: Sequence[NodeFacts], merged: MergedPolicy
) -> tuple[EffectiveLimit | None, DeviceFacts]:
    """The limit and device facts for a pod whose node is not chosen yet.

    Each candidate node (``shares.candidate_nodes``) gives a per-device limit
    and a device total; the one with the smallest fraction of its device wins,
    so the caps hold wherever the scheduler puts the pod. MPS is assumed when
    any candidate shares through MPS (the variable is ignored without MPS).
    Without candidates, a budget declared on the pod still gives a limit.
    """
    best: tuple[float, int, EffectiveLimit, DeviceFacts] | None = None
    for node in candidates:
        limit = per_device_limit(req, node, merged)
        if limit is None:
            continue
        total = _cuda_total(req, node)
        rank = limit.bytes / total if total else math.inf
        if best is None or (rank, limit.bytes) < best[:2]:
            best = (rank, limit.bytes, limit, DeviceFacts(total, node.uses_mps))
    mps = any(n.uses_mps for n in candidates)
    if best is None:
        return per_device_limit(req, None, merged), DeviceFacts(None, mps)
    return best[2], DeviceFacts(best[3].total_bytes, mps)


def _cuda_total(req: PodGPURequest, node: NodeFacts) -> int | None:
    """Total memory CUDA reports for the pod's device on ``node``: a MIG
    device's own memory for a MIG pod, else the GPU's total."""
    profiles = list(req.mig) or ([p] if (p := node.single_mig_profile()) else [])
    sizes = [found[0] for prof in profiles if (found := node.mig_memory(prof))]
    if sizes:
        return min(sizes)
    return node.device_total()


def gpu_pod_label_ops(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902 ops) that sets ``GPU_POD_LABEL`` to ``"true"``
    on a pod (empty when it is already set)."""
    labels = (pod.get("metadata") or {}).get("labels")
    if labels is None:
        return [{"op": "add", "path": "/metadata/labels", "value": {GPU_POD_LABEL: "true"}}]
    if labels.get(GPU_POD_LABEL) == "true":
        return []
    return [{"op": "add", "path": "/metadata/labels/" + GPU_POD_LABEL.replace("~", "~0").replace("/", "~1"),
             "value": "true"}]
