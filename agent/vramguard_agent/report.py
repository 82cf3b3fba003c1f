"""Pure assembly of a ``NodeGPUUsageStatus`` from one sample.

``build_report`` joins the per-pod sums of ``aggregation.aggregate`` with pod
names, RAM, trends and the previous conditions, applies the size bounds and
returns the report. No I/O here: everything read from NVML, /proc, the cgroup
filesystem or the API server is an argument. The formulas for the sums and for
incomplete process lists are in ``aggregation``'s docstring and docs/agent.md.

``build_report`` returns a ``NodeReport``: the status in plain objects whose
attributes have the API model's names. It is what every sample builds, what
the publish decision and the metrics read; ``NodeReport.to_status()`` turns it
into the pydantic ``NodeGPUUsageStatus`` (validated) only when a report is
written or printed, since building ~1,400 models per sample on a busy node
would cost more CPU than the rest of the sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from vramguard_api import conditions as C
from vramguard_api.meta import Condition
from vramguard_api.trend import TrendFeatures
from vramguard_api.usage import (
    MAX_DEVICES,
    MAX_PODS,
    MAX_UNATTRIBUTED,
    AgentInfo,
    ContainerUsage,
    DeviceMemory,
    DeviceUsage,
    DmemRegion,
    GPUDevice,
    HostMemory,
    MemoryPressure,
    NodeGPUUsageStatus,
    PodUsage,
    UnattributedProcess,
    VRAMSource,
)
from vramguard_api.usage import Attribution as PodAttribution

from .aggregation import Aggregation, PodVRAM, sum_or_none
from .dmem import vram_source
from .gpu import DeviceSample, GPUSample
from .limits_plan import LimitEntry, PodLimits
from .memory import CgroupMemory, PodMemory
from .pods import PodMeta

MAX_CONTAINERS = 64
MAX_MESSAGE = 1000


@dataclass(frozen=True, slots=True)
class Bounds:
    """Size bounds of one report (the API model's maxima by default)."""

    max_pods: int = MAX_PODS
    max_unattributed: int = MAX_UNATTRIBUTED
    max_devices: int = MAX_DEVICES
    max_containers: int = MAX_CONTAINERS


DEFAULT_BOUNDS = Bounds()


def build_devices(sample: GPUSample | None, agg: Aggregation) -> list[GPUDevice]:
    """The report's device list, MIG devices after their parent."""
    if sample is None:
        return []
    return [_device(d, agg) for d in sample.devices]


def _device(d: DeviceSample, agg: Aggregation) -> GPUDevice:
    memory = None
    if d.memory is not None:
        memory = DeviceMemory(
            totalBytes=d.memory.total,
            reservedBytes=d.memory.reserved,
            usedBytes=d.memory.used,
            freeBytes=d.memory.free,
            usableBytes=d.memory.usable,
        )
    healthy = d.health == "Healthy"
    support = d.memory_limits
    return GPUDevice(
        uuid=d.uuid[:128],
        index=d.index,
        modelName=(d.model_name or None) and d.model_name[:128],
        parentUUID=d.parent_uuid,
        migProfile=d.mig_profile,
        gpuInstanceId=d.gpu_instance_id,
        computeInstanceId=d.compute_instance_id,
        migEnabled=d.mig_enabled,
        virtualizationMode=d.virtualization_mode,
        memory=memory,
        processBytes=agg.process_bytes.get(d.uuid) if healthy else None,
        processesComplete=agg.complete.get(d.uuid, False) if healthy else False,
        health=d.health,
        error=(d.error or None) and d.error[:1024],
        gpuUtilizationPercent=d.utilization_gpu,
        memoryUtilizationPercent=d.utilization_memory,
        memoryLimits=None if support is None else ("Supported" if support.supported else "Unsupported"),
        memoryLimitsReason=support.reason if support else None,
        memoryLimitsMessage=support.message[:1024] if support else None,
    )


@dataclass(frozen=True, slots=True)
class PodInputs:
    """Everything besides the GPU sample that a pod entry is built from.

    ``pods`` maps a cgroup uid (API uid, or static pod config hash) to the pod's
    API metadata; ``memory``, ``trends`` (VRAM) and ``ram_trends`` (RAM working
    set) are keyed by cgroup uid too;
    ``gpu_pods`` are cgroup uids of pods that use a GPU but have no process now;
    ``container_names`` adds names for container ids the API does not show;
    ``memory_limits`` holds pods' driver-enforced memory limits (``caps``), by cgroup uid;
    ``sm_utilization``: cgroup uid → device UUID → SM percent (``utilization``);
    ``dmem``: cgroup uid → its dmem charges per NVIDIA region (``dmem``).
    """

    pods: Mapping[str, PodMeta] = field(default_factory=dict)
    memory: Mapping[str, PodMemory] = field(default_factory=dict)
    trends: Mapping[str, TrendFeatures] = field(default_factory=dict)
    ram_trends: Mapping[str, TrendFeatures] = field(default_factory=dict)
    gpu_pods: Iterable[str] = ()
    container_names: Mapping[str, str] = field(default_factory=dict)
    memory_limits: Mapping[str, PodLimits] = field(default_factory=dict)
    sm_utilization: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    dmem: Mapping[str, list[DmemRegion]] = field(default_factory=dict)


class DeviceEntry(NamedTuple):
    """A pod's VRAM on one device (``DeviceUsage`` in the API), bytes; None: unknown."""

    uuid: str
    used_bytes: int | None
    sm_utilization_percent: int | None = None


@dataclass(slots=True)
class ContainerEntry:
    """One container of a report (``ContainerUsage`` in the API; same attribute names)."""

    container_id: str
    name: str | None = None
    vram_bytes: int | None = None
    ram_working_set_bytes: int | None = None
    oom_kills: int | None = None


@dataclass(slots=True)
class PodEntry:
    """One pod of a report (``PodUsage`` in the API; same attribute names)."""

    uid: str
    namespace: str | None = None
    name: str | None = None
    qos_class: str | None = None
    attribution: PodAttribution = "Measured"
    vram_bytes: int | None = None
    ram_working_set_bytes: int | None = None
    oom_kills: int | None = None
    swap_bytes: int | None = None
    memory_pressure: MemoryPressure | None = None
    vram_source: VRAMSource | None = None
    dmem: list[DmemRegion] | None = None
    devices: list[DeviceEntry] = field(default_factory=list)
    containers: list[ContainerEntry] = field(default_factory=list)
    trend: TrendFeatures | None = None
    ram_trend: TrendFeatures | None = None
    memory_limits: list[LimitEntry] = field(default_factory=list)
    memory_limits_error: str | None = None


def build_pods(agg: Aggregation, inputs: PodInputs) -> list[PodEntry]:
    """One entry per attributed pod and per idle GPU pod (unbounded; see ``bound``)."""
    entries: list[PodEntry] = []
    idle = [uid for uid in dict.fromkeys([*inputs.gpu_pods, *inputs.memory_limits]) if uid not in agg.pods]
    for uid in [*agg.pods, *idle]:
        entries.append(_pod(uid, agg.pods.get(uid), agg.listing_failed, inputs))
    return entries


def _pod(uid: str, vram: PodVRAM | None, listing_failed: bool, inputs: PodInputs) -> PodEntry:
    meta = inputs.pods.get(uid)
    ram = inputs.memory.get(uid)
    if vram is None:
        # A GPU pod with no process: zero, unless some device could not be listed.
        total: int | None = None if listing_failed else 0
        devices: list[DeviceEntry] = []
    else:
        total = vram.total
        util = inputs.sm_utilization.get(uid, {})
        devices = [DeviceEntry(u, b, util.get(u)) for u, b in vram.devices.items()]
    containers = _containers(vram, ram, meta, inputs.container_names, total is None)
    qos = (meta.qos_class if meta else None) or (vram.qos if vram else None)
    limits = inputs.memory_limits.get(uid) or PodLimits()
    dmem = inputs.dmem.get(uid)
    total, source = vram_source(total, vram is not None and bool(vram.devices), dmem)
    return PodEntry(
        uid=meta.uid if meta else uid,
        namespace=meta.namespace if meta else None,
        name=meta.name if meta else None,
        qos_class=qos,
        attribution="Unknown" if total is None else "Measured",
        vram_bytes=total,
        vram_source=source,
        dmem=dmem,
        ram_working_set_bytes=ram.pod.working_set_bytes if ram else None,
        oom_kills=ram.pod.oom_kills if ram else None,
        swap_bytes=ram.pod.swap_bytes if ram else None,
        memory_pressure=ram.pod.pressure if ram else None,
        devices=devices,
        containers=containers,
        trend=inputs.trends.get(uid),
        ram_trend=inputs.ram_trends.get(uid),
        memory_limits=limits.entries,
        memory_limits_error=limits.error,
    )


def _containers(
    vram: PodVRAM | None,
    ram: PodMemory | None,
    meta: PodMeta | None,
    extra_names: Mapping[str, str],
    pod_unknown: bool,
) -> list[ContainerEntry]:
    by_device = vram.containers if vram else {}
    ram_by_id: Mapping[str, CgroupMemory] = ram.containers if ram else {}
    names = meta.containers if meta else {}
    result = []
    for cid in dict.fromkeys([*by_device, *ram_by_id]):
        devices = by_device.get(cid)
        vram_bytes = sum_or_none(devices.values()) if devices else (None if pod_unknown else 0)
        memory = ram_by_id.get(cid)
        result.append(
            ContainerEntry(
                container_id=cid,
                name=names.get(cid) or extra_names.get(cid),
                vram_bytes=vram_bytes,
                ram_working_set_bytes=memory.working_set_bytes if memory else None,
                oom_kills=memory.oom_kills if memory else None,
            )
        )
    return result


def _usage_key(pod: PodEntry) -> tuple[int, int, int]:
    # Unknown VRAM first (never hide what cannot be measured), then by VRAM, then RAM.
    return (
        0 if pod.vram_bytes is None else 1,
        -(pod.vram_bytes or 0),
        -(pod.ram_working_set_bytes or 0),
    )


def bound(
    pods: list[PodEntry],
    unattributed: list[UnattributedProcess],
    devices: list[GPUDevice],
    bounds: Bounds,
) -> tuple[list[PodEntry], list[UnattributedProcess], list[GPUDevice], bool]:
    """Cut the lists to their bounds, keeping the largest users; sort them stably.

    Returns the lists and whether anything was cut.
    """
    truncated = False
    if len(pods) > bounds.max_pods:
        pods, truncated = sorted(pods, key=_usage_key)[: bounds.max_pods], True
    for pod in pods:
        if len(pod.containers) > bounds.max_containers:
            pod.containers = sorted(pod.containers, key=lambda c: -(c.vram_bytes or 0))[: bounds.max_containers]
            truncated = True
    if len(unattributed) > bounds.max_unattributed:
        unattributed = sorted(unattributed, key=lambda u: -(u.used_bytes or 0))[: bounds.max_unattributed]
        truncated = True
    if len(devices) > bounds.max_devices:
        devices, truncated = devices[: bounds.max_devices], True
    pods = sorted(pods, key=lambda p: (p.namespace or "~", p.name or "", p.uid))
    for pod in pods:
        pod.containers.sort(key=lambda c: (c.name or "~", c.container_id))
    unattributed = sorted(unattributed, key=lambda u: (u.device, u.pid))
    return pods, unattributed, devices, truncated


# --- conditions ------------------------------------------------------------


def build_conditions(
    sample: GPUSample | None,
    backend_error: str | None,
    agg: Aggregation,
    now: datetime,
    previous: Iterable[Condition] | None = None,
) -> list[Condition]:
    """AgentHealthy and ProcessesMissing, keeping lastTransitionTime while a status holds."""
    if backend_error is not None or sample is None:
        healthy = ("False", C.REASON_NVML_UNAVAILABLE, backend_error or "no GPU sample")
    else:
        bad = [f"{d.uuid}: {d.health} ({d.error})" for d in sample.devices if d.health != "Healthy"]
        if bad:
            healthy = ("False", C.REASON_DEVICE_ERRORS, "; ".join(bad))
        else:
            healthy = ("True", C.REASON_SAMPLING, f"sampled {len(sample.devices)} devices")
    if agg.short:
        missing = ("True", C.REASON_PROCESS_SUM_BELOW_USED, _join({**agg.short, **agg.problems}))
    elif agg.problems:
        missing = ("True", C.REASON_DEVICE_ERRORS, _join(agg.problems))
    else:
        missing = (
            "False",
            C.REASON_PROCESSES_COMPLETE,
            "process sums match used memory on every device",
        )
    old = {c.type: c for c in previous or []}
    return [
        _condition(C.AGENT_HEALTHY, *healthy, now=now, old=old.get(C.AGENT_HEALTHY)),
        _condition(C.PROCESSES_MISSING, *missing, now=now, old=old.get(C.PROCESSES_MISSING)),
    ]


def _join(messages: Mapping[str, str]) -> str:
    return "; ".join(f"{uuid}: {text}" for uuid, text in sorted(messages.items()))


def _condition(kind: str, status: str, reason: str, message: str, now: datetime, old: Condition | None) -> Condition:
    since = old.last_transition_time if old is not None and old.status == status else now
    return Condition(
        type=kind,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        message=message[:MAX_MESSAGE],
        lastTransitionTime=since,
    )


@dataclass(slots=True)
class NodeReport:
    """A node's report in plain objects: ``NodeGPUUsageStatus``'s fields and
    attribute names, with pods as ``PodEntry`` (devices and conditions are the
    API models already: they are few)."""

    sample_time: datetime
    agent: AgentInfo
    conditions: list[Condition]
    devices: list[GPUDevice]
    pods: list[PodEntry]
    unattributed: list[UnattributedProcess]
    truncated: bool
    host_memory: HostMemory | None = None
    _status: NodeGPUUsageStatus | None = field(default=None, init=False, repr=False, compare=False)

    def to_status(self) -> NodeGPUUsageStatus:
        """The API model of this report, built (and validated) on first call.

        Raises ``pydantic.ValidationError`` if an entry breaks the API's
        bounds (``bound`` keeps them, so that is a bug)."""
        if self._status is None:
            self._status = NodeGPUUsageStatus(
                sampleTime=self.sample_time,
                agent=self.agent,
                conditions=self.conditions,
                devices=self.devices,
                pods=[_pod_usage(p) for p in self.pods],
                unattributed=self.unattributed,
                truncated=self.truncated,
                healthyDevices=sum(d.health == "Healthy" for d in self.devices),
                hostMemory=self.host_memory,
            )
        return self._status


def _pod_usage(p: PodEntry) -> PodUsage:
    return PodUsage(
        uid=p.uid,
        namespace=p.namespace,
        name=p.name,
        qosClass=p.qos_class,
        attribution=p.attribution,
        vramBytes=p.vram_bytes,
        ramWorkingSetBytes=p.ram_working_set_bytes,
        oomKills=p.oom_kills,
        swapBytes=p.swap_bytes,
        memoryPressure=p.memory_pressure,
        vramSource=p.vram_source,
        dmem=p.dmem,
        devices=[
            DeviceUsage(uuid=d.uuid, usedBytes=d.used_bytes, smUtilizationPercent=d.sm_utilization_percent)
            for d in p.devices
        ],
        containers=[
            ContainerUsage(
                name=c.name,
                containerID=c.container_id,
                vramBytes=c.vram_bytes,
                ramWorkingSetBytes=c.ram_working_set_bytes,
                oomKills=c.oom_kills,
            )
            for c in p.containers
        ],
        trend=p.trend,
        ramTrend=p.ram_trend,
        memoryLimits=[e.to_api() for e in p.memory_limits] or None,
        memoryLimitsError=p.memory_limits_error,
    )


def build_report(
    sample: GPUSample | None,
    backend_error: str | None,
    agg: Aggregation,
    inputs: PodInputs,
    agent: AgentInfo,
    now: datetime,
    previous_conditions: Iterable[Condition] | None = None,
    bounds: Bounds = DEFAULT_BOUNDS,
    host_memory: HostMemory | None = None,
) -> NodeReport:
    """The node's report for one sample (see the module docstring); ``host_memory``:
    the node's swap and memory pressure (``hostmem``)."""
    pods, unattributed, devices, truncated = bound(
        build_pods(agg, inputs), list(agg.unattributed), build_devices(sample, agg), bounds
    )
    return NodeReport(
        sample_time=now,
        agent=agent,
        conditions=build_conditions(sample, backend_error, agg, now, previous_conditions),
        devices=devices,
        pods=pods,
        unattributed=unattributed,
        truncated=truncated,
        host_memory=host_memory,
    )

