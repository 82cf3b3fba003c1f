"""Fluent builders for agent test objects: fake GPUs, cgroup paths, pods."""

from __future__ import annotations

from typing import Any

from vramguard_sim.fakenvml import FakeGPU, FakeMigDevice, FakeNVML, FakeProcess

MIB = 1024 * 1024
GIB = 1024 * MIB


def gpu(index: int = 0, *processes: tuple[int, int], total: int = 81559 * MIB, **kwargs: Any) -> FakeGPU:
    """An H100-like GPU with ``(pid, bytes)`` compute processes; used = reserved + sum."""
    kwargs.setdefault("reserved_bytes", 579 * MIB)
    return FakeGPU(
        uuid=f"GPU-0000000{index}-0000-0000-0000-000000000000",
        name=kwargs.pop("name", "NVIDIA H100 80GB HBM3"),
        total_bytes=total,
        processes=[FakeProcess(pid, used) for pid, used in processes],
        **kwargs,
    )


def mig_gpu(*instances: list[tuple[int, int]], privileged: bool = False) -> FakeGPU:
    """An A100-40GB with MIG on: one 1g.5gb device per ``instances`` entry of (pid, bytes)."""
    devices = [
        FakeMigDevice(
            uuid=f"MIG-0000000{slot}-aaaa-0000-0000-000000000000",
            profile="1g.5gb",
            gpu_instance_id=9 + slot,
            compute_instance_id=0,
            total_bytes=4864 * MIB,
            processes=[FakeProcess(pid, used) for pid, used in procs],
        )
        for slot, procs in enumerate(instances)
    ]
    return FakeGPU(
        uuid="GPU-a100a100-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-40GB",
        total_bytes=40960 * MIB,
        reserved_bytes=570 * MIB,
        mig_capable=True,
        mig_devices=devices,
    )


def nvml(*gpus: FakeGPU, privileged: bool = False) -> FakeNVML:
    """A fake pynvml over ``gpus``."""
    return FakeNVML(list(gpus), privileged=privileged)


def pod_json(
    name: str,
    uid: str,
    namespace: str = "default",
    containers: dict[str, str | None] | None = None,
    gpu: bool = True,
    qos: str = "Burstable",
    annotations: dict[str, str] | None = None,
    resource_version: str = "1",
) -> dict[str, Any]:
    """A Pod as the API server returns it (camelCase JSON)."""
    containers = containers if containers is not None else {"main": None}
    resources = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": resource_version,
            "annotations": annotations or {},
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": c, "resources": resources} for c in containers]},
        "status": {
            "qosClass": qos,
            "containerStatuses": [
                {"name": c, **({"containerID": f"containerd://{cid}"} if cid else {})} for c, cid in containers.items()
            ],
        },
    }
