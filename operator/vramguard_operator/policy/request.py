"""What a pod asks for on GPUs: device-plugin resources (``nvidia.com/gpu``,
MIG profiles, HAMi's and Aliyun's memory resources) and KAI's annotations,
summed or maxed over its containers. Pure: pods are JSON-like dicts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from vramguard_api.units import quantity_decimal

# Pod resources and annotations of GPU-sharing systems.
RESOURCE_GPU = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# NVIDIA's device plugin renames a shared resource to <name>.shared under
# time-slicing or MPS with renameByDefault (github.com/NVIDIA/k8s-device-plugin
# api/config/v1/resources.go, DefaultSharedRename; consts.go,
# DefaultSharedResourceNameSuffix): nvidia.com/gpu.shared, nvidia.com/mig-1g.5gb.shared.
SHARED_SUFFIX = ".shared"
GPU_RESOURCES = (RESOURCE_GPU, RESOURCE_GPU + SHARED_SUFFIX)
"""The names of whole (or time-sliced, MPS-shared) NVIDIA GPUs as pod resources."""
HAMI_GPUMEM = "nvidia.com/gpumem"  # MiB per vGPU
HAMI_GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"  # percent of the device per vGPU
ALIYUN_GPU_MEM = "aliyun.com/gpu-mem"  # GiB (default unit of gpushare-device-plugin)
ALIYUN_GPU_COUNT = "aliyun.com/gpu-count"  # node resource: number of shared GPUs
KAI_GPU_MEMORY = "gpu-memory"  # pod annotation, MiB per device
KAI_GPU_FRACTION = "gpu-fraction"  # pod annotation, fraction of one device in (0, 1)
KAI_GPU_FRACTION_DEVICES = "gpu-fraction-num-devices"  # pod annotation, devices of that fraction

# Resources whose value counts in a unit of their own (MiB, GiB, percent), not
# bytes: what a value must be. A Kubernetes suffix there ("3000Mi") would
# multiply again (3000 Mi MiB: about 2.9 PiB), so a value is a plain whole
# number or it is refused. HAMi (github.com/Project-HAMi/HAMi
# pkg/device/nvidia/device.go) reads gpumem and gpumem-percentage as integer
# counts; AliyunContainerService/gpushare-device-plugin counts gpu-mem in GiB
# (MiB when started with --memory-unit=MiB).
COUNTED_IN: Mapping[str, str] = {
    HAMI_GPUMEM: "a whole number of MiB, without a unit",
    HAMI_GPUMEM_PERCENTAGE: "a whole number of percent, without a unit",
    ALIYUN_GPU_MEM: "a whole number of GiB (MiB under --memory-unit=MiB), without a unit",
}
# A whole number as written ("3000", "1e3") or as the API server stores it: a
# quantity's canonical form writes a plain 3000 as "3k" (the e2e test saw HAMi's
# nvidia.com/gpumem: 3000 come back so). Only "k" is taken: a count of MiB or GiB
# in the millions ("3M") is no real grant, and "8G" is far likelier 8 GiB with a
# unit than eight billion GiB. Binary suffixes (Mi, Gi) and milli are units.
_WHOLE_NUMBER = re.compile(r"\d+(?:[eE]\+?\d+|k)?")


@dataclass(frozen=True, slots=True)
class PodGPURequest:
    """What a pod asks for on GPUs, summed or maxed over its containers.

    ``gpus``: ``nvidia.com/gpu`` (or ``nvidia.com/gpu.shared``) devices (or
    vGPUs under HAMi). ``mig``: count per MIG profile (``nvidia.com/mig-<profile>``,
    ``.shared`` or not). ``hami_gpumem_mib`` / ``hami_percentage``: the largest
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
        """Whether the pod uses a GPU through any of the supported resources (or
        names one with a value that cannot be read: its Event needs a GPU pod)."""
        return bool(
            self.problems
            or self.gpus
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
            res = container_resources(c)
            path = f"{where}: spec.containers[{i}].resources"
            uses = False
            for name, raw in res.items():
                if not _is_gpu_resource(name):
                    continue
                value = _gpu_value(name, raw, f"{path}[{name}]", problems)
                if value is None or value == 0:
                    continue
                if name in GPU_RESOURCES:
                    gpus += int(value)
                elif name.startswith(MIG_RESOURCE_PREFIX):
                    profile = name.removeprefix(MIG_RESOURCE_PREFIX).removesuffix(SHARED_SUFFIX)
                    mig[profile] = mig.get(profile, 0) + int(value)
                elif name == HAMI_GPUMEM:
                    gpumem.append(int(value))
                elif name == HAMI_GPUMEM_PERCENTAGE:
                    percent.append(int(value))
                else:
                    aliyun += value
                uses = True
            if uses:
                gpu_containers.append(c.get("name") or "")
        kai_mem, kai_frac = _kai(meta.get("annotations") or {}, where, problems)
        return cls(
            gpus=gpus,
            mig=mig,
            hami_gpumem_mib=max(gpumem) if gpumem else None,
            hami_percentage=max(percent) if percent else None,
            aliyun_gpu_mem=aliyun or None,
            kai_memory_mib=kai_mem,
            kai_fraction=kai_frac,
            gpu_containers=tuple(gpu_containers),
            problems=tuple(problems),
        )


def container_resources(c: Mapping[str, Any]) -> dict[str, Any]:
    res = c.get("resources") or {}
    return {**(res.get("requests") or {}), **(res.get("limits") or {})}


def _gpu_value(name: str, raw: Any, where: str, problems: list[str]) -> Decimal | None:
    """A resource's value; None, with a problem naming the field, the value and
    what is wanted, when it cannot be used: not a quantity, negative, or (a
    resource counted in MiB, GiB or percent: ``COUNTED_IN``) not a plain whole
    number."""
    if raw is None:
        return None
    counted = COUNTED_IN.get(name)
    if counted is not None and _WHOLE_NUMBER.fullmatch(str(raw).strip()) is None:
        problems.append(f"{where}={raw!r}: wanted {counted}; this value is ignored")
        return None
    try:
        value = quantity_decimal(raw)
    except (ValueError, TypeError, InvalidOperation):
        problems.append(f"{where}={raw!r}: wanted a Kubernetes quantity; this value is ignored")
        return None
    if value < 0:
        problems.append(f"{where}={raw!r}: wanted a count of at least 0; this value is ignored")
        return None
    return value


def _is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX) or name in COUNTED_IN


def _kai(ann: Mapping[str, str], where: str, problems: list[str]) -> tuple[int | None, float | None]:
    """KAI's ``gpu-memory`` (a whole number of MiB above 0), ``gpu-fraction`` (in
    (0, 1)) and ``gpu-fraction-num-devices`` (a whole number above 0), checked as
    KAI's binder checks them (github.com/NVIDIA/KAI-Scheduler,
    pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go); a
    value KAI would reject is a problem and is not used."""
    mem_raw, frac_raw, count_raw = (ann.get(k) for k in (KAI_GPU_MEMORY, KAI_GPU_FRACTION, KAI_GPU_FRACTION_DEVICES))
    mem = None
    if mem_raw is not None:
        if str(mem_raw).isdigit() and int(mem_raw) > 0:
            mem = int(mem_raw)
        else:
            problems.append(f"{where}: annotation {KAI_GPU_MEMORY}={mem_raw!r} is not a whole number of MiB above 0")
    if count_raw is not None and not (str(count_raw).isdigit() and int(count_raw) > 0):
        problems.append(f"{where}: annotation {KAI_GPU_FRACTION_DEVICES}={count_raw!r} is not a whole number above 0")
    return mem, _fraction(frac_raw, f"{where}: annotation {KAI_GPU_FRACTION}", problems)


def _fraction(raw: Any, where: str, problems: list[str]) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not 0 < value < 1:
        problems.append(f"{where}={raw!r} is not a fraction in (0, 1)")
        return None
    return value
