"""The fleet's GPU nodes: kinds, their devices, and each device's share.

Each node kind is a common shape of GPU node, labelled as NVIDIA GPU feature
discovery (GFD) labels it, so that vramguard's policy code derives the shares
from the labels and the node's report exactly as it does on a real cluster:

===============  ===============================================================
kind             devices
===============  ===============================================================
``time-slicing`` 8 × H100 80GB HBM3 (81559Mi, 579Mi reserved), 4 replicas each
``mps``          the same, shared through MPS (``sharing-strategy=mps``)
``mig``          8 × A100-SXM4-80GB, MIG ``single`` strategy, 2 × ``3g.40gb``
                 (40192Mi) per GPU: 16 devices of one pod each
``vgpu``         4 × A10-24Q vGPU guests (23028Mi, 1536Mi reserved by the
                 hypervisor), 2 replicas each
===============  ===============================================================

A pod takes one ``nvidia.com/gpu``: one replica of a shared device, or one MIG
device. Among a node's devices the one with the fewest pods is given (the
NVIDIA device plugin's preferred allocation spreads replicas that way).
Memory semantics are those of ``vramguard_sim.gpumem``; MPS shares a device's
memory like time-slicing (the MPS client memory limit is not set).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.policy.shares import NodeFacts, PodGPURequest, mig_limit, node_share
from vramguard_sim.gpumem import Device

if TYPE_CHECKING:
    from vramguard_sim.simulate.fleet import SimPod

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class NodeKind:
    """A node shape: ``gpus`` devices of ``memory`` bytes (``reserved`` by the
    driver or hypervisor, ``overhead`` used by no process), each shared by
    ``replicas`` pods, or split into ``mig_per_gpu`` MIG devices."""

    name: str
    model: str
    product: str
    gpus: int
    memory: int
    reserved: int = 0
    overhead: int = 0
    replicas: int = 1
    sharing: str = "none"
    mig_profile: str | None = None
    mig_memory: int = 0
    mig_per_gpu: int = 0
    vgpu: bool = False


# The most nodes one simulation takes: docs/operator.md's sizing measured up to
# 2,000; beyond 10,000 a run would take hours and most of the machine's memory.
MAX_NODES = 10_000

NODE_KINDS: dict[str, NodeKind] = {
    "time-slicing": NodeKind(
        "time-slicing", "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", 8, 81559 * MIB, 579 * MIB, 4 * MIB,
        replicas=4, sharing="time-slicing",
    ),
    "mps": NodeKind(
        "mps", "NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", 8, 81559 * MIB, 579 * MIB, 4 * MIB,
        replicas=4, sharing="mps",
    ),
    "mig": NodeKind(
        "mig", "NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 8, 81920 * MIB, 0, 0,
        mig_profile="3g.40gb", mig_memory=40192 * MIB, mig_per_gpu=2,
    ),
    "vgpu": NodeKind(
        "vgpu", "NVIDIA A10", "NVIDIA-A10-24Q", 4, 23028 * MIB, 1536 * MIB, 0,
        replicas=2, sharing="time-slicing", vgpu=True,
    ),
}


def parse_nodes(text: str) -> dict[str, int]:
    """``20`` (time-sliced nodes) or ``time-slicing=16,mps=2,mig=1,vgpu=1``.
    Raises ``ValueError`` naming ``--nodes`` and the bad item."""
    text = text.strip()
    out: dict[str, int] = {"time-slicing": int(text)} if text.isdigit() else {}
    for item in filter(None, (part.strip() for part in ("" if out else text).split(","))):
        kind, sep, count = item.partition("=")
        if not sep or kind.strip() not in NODE_KINDS or not count.strip().isdigit():
            raise ValueError(
                f"--nodes: {item!r} is not <kind>=<count> with a kind of {', '.join(NODE_KINDS)}"
            )
        out[kind.strip()] = out.get(kind.strip(), 0) + int(count)
    if sum(out.values()) <= 0:
        raise ValueError(f"--nodes: {text!r} gives no node")
    if sum(out.values()) > MAX_NODES:
        raise ValueError(f"--nodes: {text!r} is {sum(out.values())} nodes, above the maximum of {MAX_NODES}")
    return out


class GPU:
    """One device a pod can be given: a GPU (shared by ``capacity`` pods) or a
    MIG device, its memory (``gpumem.Device``) and the pods holding a replica
    of it (terminating ones too: a replica is free once its pod is gone)."""

    __slots__ = ("node", "index", "mig_slot", "device", "capacity", "pods", "share_bytes")

    def __init__(self, node: SimNode, index: int, mig_slot: int | None, device: Device, capacity: int) -> None:
        self.node = node
        self.index = index
        self.mig_slot = mig_slot
        self.device = device
        self.capacity = capacity
        self.pods: list[SimPod] = []
        self.share_bytes = 0  # set by the node once its share is known

    @property
    def uuid(self) -> str:
        return self.device.uuid


_UUIDS = uuid.UUID("3c1e9b4a-7f25-4d6e-9a0b-5e2c8d1f6a47")  # namespace of the simulated GPUs' UUIDs


def gpu_uuid(node: str, index: int) -> str:
    """A GPU's UUID, ``GPU-`` and a UUIDv5 of ``node/index`` (NVML's form, which
    per-cgroup memory limits are keyed by: ``vramguard_api.memlimits``)."""
    return f"GPU-{uuid.uuid5(_UUIDS, f'{node}/{index}')}"


@dataclass(eq=False)
class SimNode:
    """A GPU node: its kind, name, GFD labels, allocatable resources, devices."""

    kind: NodeKind
    name: str
    gpus: list[GPU] = field(default_factory=list)
    _api: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        k = self.kind
        for i in range(k.gpus):
            if k.mig_profile is None:
                dev = Device(gpu_uuid(self.name, i), k.memory, k.reserved, k.overhead)
                self.gpus.append(GPU(self, i, None, dev, k.replicas))
            else:
                for s in range(k.mig_per_gpu):
                    dev = Device(f"MIG-{self.name}-{i}-{s}", k.mig_memory, 0, 0)
                    self.gpus.append(GPU(self, i, s, dev, 1))
        share = self.share_of()
        for g in self.gpus:
            g.share_bytes = share

    def labels(self) -> dict[str, str]:
        """GFD's labels for this node."""
        k = self.kind
        labels = {
            "kubernetes.io/hostname": self.name,
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": k.product,
            "nvidia.com/gpu.count": str(k.gpus),
            "nvidia.com/gpu.memory": str(k.memory // MIB),
        }
        if k.mig_profile is not None:
            labels["nvidia.com/mig.strategy"] = "single"
            labels[f"nvidia.com/mig-{k.mig_profile}.memory"] = str(k.mig_memory // MIB)
        else:
            labels["nvidia.com/gpu.replicas"] = str(k.replicas)
            labels["nvidia.com/gpu.sharing-strategy"] = k.sharing
        if k.vgpu:
            labels["nvidia.com/vgpu.present"] = "true"
        return labels

    def api(self) -> dict[str, Any]:
        """The Node as the operator indexes it (``policy_handlers.node_entry``);
        the same object every time (nothing changes it)."""
        if self._api is None:
            slots = sum(g.capacity for g in self.gpus)
            self._api = {
                "metadata": {"name": self.name, "labels": self.labels()},
                "status": {"allocatable": {"nvidia.com/gpu": str(slots)}},
            }
        return self._api

    def device_entries(self, gpus: Iterable[GPU] | None = None) -> list[dict[str, Any]]:
        """The node's devices (or those of ``gpus``) as its agent reports them
        (``NodeGPUUsage`` API form)."""
        out = []
        k = self.kind
        for g in self.gpus if gpus is None else gpus:
            d = g.device
            entry: dict[str, Any] = {
                "uuid": d.uuid,
                "index": g.index,
                "modelName": k.model,
                "memory": {
                    "totalBytes": d.total_bytes,
                    "reservedBytes": d.reserved_bytes,
                    "usedBytes": d.used_bytes,
                    "freeBytes": d.free_bytes,
                    "usableBytes": d.usable_bytes,
                },
                "processBytes": d.process_bytes,
            }
            if g.mig_slot is not None:
                entry.update(migProfile=k.mig_profile, parentUUID=gpu_uuid(self.name, g.index),
                             gpuInstanceId=g.mig_slot + 1, computeInstanceId=0)
            if k.vgpu:
                entry["virtualizationMode"] = "VGPU"
            out.append(entry)
        return out

    def share_of(self) -> int:
        """A pod's share of one of this node's devices, by ``policy.shares``
        (what ``shareFromNode`` gives): usable / replicas, or the MIG profile's
        memory. Raises ``ValueError`` if the node says nothing about it."""
        report = NodeGPUUsage.model_validate(
            {
                "spec": {"nodeName": self.name},
                "status": {"sampleTime": "2026-01-01T00:00:00Z", "devices": self.device_entries()},
            }
        )
        facts = NodeFacts.from_api(self.api(), report)
        found = mig_limit(PodGPURequest(gpus=1), facts) or node_share(facts)
        if found is None:
            raise ValueError(f"node {self.name}: no share can be derived from its labels and devices")
        return found.bytes

    def free_replicas(self) -> int:
        """Replicas no pod holds."""
        return sum(g.capacity - len(g.pods) for g in self.gpus)

    def least_used_gpu(self) -> GPU | None:
        """The device with a free replica and the fewest pods (lowest index on ties)."""
        best = None
        for g in self.gpus:
            if len(g.pods) < g.capacity and (best is None or len(g.pods) < len(best.pods)):
                best = g
        return best


def build_nodes(counts: dict[str, int]) -> list[SimNode]:
    """The fleet's nodes: ``counts`` of each kind, named ``<kind>-<n>``."""
    nodes: list[SimNode] = []
    for kind, n in counts.items():
        nodes.extend(SimNode(NODE_KINDS[kind], f"{kind}-{i}") for i in range(n))
    return nodes
