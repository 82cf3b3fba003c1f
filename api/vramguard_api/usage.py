"""NodeGPUUsage: one node's measured GPU and host memory, written only by that node's agent.

All memory figures are integers in bytes, at most ``MAX_BYTES`` (2^53, held
exactly by every client). A figure that could not be measured is absent
(None), never zero: unknown is not zero.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from .ends import MAX_END_RECORDS, EndRecord
from .meta import APIModel, Condition, ObjectMeta
from .trend import MAX_REPORT_SECONDS, TrendFeatures
from .units import MAX_BYTES

VirtualizationMode = Literal["None", "Passthrough", "VGPU", "HostVGPU", "HostVSGA"]
Attribution = Literal["Measured", "Unknown"]
DeviceHealth = Literal["Healthy", "Lost", "Error"]
# Per-cgroup memory limits (vramguard_api.memlimits): a device's support, a pod's limit state.
MemoryLimitsSupport = Literal["Supported", "Unsupported"]
MemoryLimitState = Literal["Applied", "Pending", "Failed", "Unsupported", "Disabled"]

VRAMSource = Literal["NVML", "Dmem"]

MAX_PODS = 256
MAX_UNATTRIBUTED = 64
MAX_DEVICES = 64


class DeviceMemory(APIModel):
    """A device's framebuffer memory as NVML reports it (nvmlMemory_v2).

    ``usableBytes = totalBytes - reservedBytes``. Whether ``usedBytes`` includes
    ``reservedBytes`` differs between driver generations, so both are stored as read.
    """

    total_bytes: int = Field(
        alias="totalBytes", ge=0, le=MAX_BYTES, description="Total framebuffer memory, bytes; at most 2^53."
    )
    reserved_bytes: int | None = Field(
        default=None,
        alias="reservedBytes",
        ge=0,
        le=MAX_BYTES,
        description="Memory reserved by the driver, firmware or hypervisor, bytes; at most 2^53.",
    )
    used_bytes: int | None = Field(
        default=None,
        alias="usedBytes",
        ge=0,
        le=MAX_BYTES,
        description="Used memory as NVML reports it, bytes; at most 2^53.",
    )
    free_bytes: int | None = Field(
        default=None, alias="freeBytes", ge=0, le=MAX_BYTES, description="Free memory, bytes; at most 2^53."
    )
    usable_bytes: int = Field(
        alias="usableBytes", ge=0, le=MAX_BYTES, description="Usable memory: total minus reserved, bytes; at most 2^53."
    )


class GPUDevice(APIModel):
    """One GPU or MIG device on the node."""

    uuid: str = Field(max_length=128, description="NVML UUID (GPU-... or MIG-...).")
    index: int = Field(ge=0, description="NVML index of the GPU (of the parent GPU for a MIG device).")
    model_name: str | None = Field(
        default=None, alias="modelName", max_length=128, description="Product name, e.g. NVIDIA H100 80GB HBM3."
    )
    parent_uuid: str | None = Field(
        default=None, alias="parentUUID", max_length=128, description="For a MIG device: its parent GPU's UUID."
    )
    mig_profile: str | None = Field(
        default=None, alias="migProfile", max_length=32, description="For a MIG device: its profile, e.g. 1g.5gb."
    )
    gpu_instance_id: int | None = Field(
        default=None, alias="gpuInstanceId", ge=0, description="For a MIG device: GPU instance id."
    )
    compute_instance_id: int | None = Field(
        default=None, alias="computeInstanceId", ge=0, description="For a MIG device: compute instance id."
    )
    mig_enabled: bool = Field(default=False, alias="migEnabled", description="For a GPU: whether MIG mode is enabled.")
    virtualization_mode: VirtualizationMode = Field(
        default="None",
        alias="virtualizationMode",
        description="NVML virtualization mode: None, Passthrough, VGPU (guest), HostVGPU, HostVSGA.",
    )
    memory: DeviceMemory | None = Field(
        default=None, description="Framebuffer memory; absent when it could not be read."
    )
    process_bytes: int | None = Field(
        default=None,
        alias="processBytes",
        ge=0,
        le=MAX_BYTES,
        description="Sum of the known per-process usage on this device, bytes; at most 2^53.",
    )
    processes_complete: bool = Field(
        default=True,
        alias="processesComplete",
        description="False when per-process usage is unknown or missing (the process sum is far below used minus reserved).",
    )
    health: DeviceHealth = Field(default="Healthy", description="Healthy, Lost (fell off the bus) or Error.")
    error: str | None = Field(default=None, max_length=1024, description="The NVML error when health is not Healthy.")
    gpu_utilization_percent: int | None = Field(
        default=None,
        alias="gpuUtilizationPercent",
        ge=0,
        le=100,
        description="Percent of the last sample period in which a kernel ran (nvmlDeviceGetUtilizationRates "
        "gpu; dcgm-exporter's DCGM_FI_DEV_GPU_UTIL); absent where NVML gives none (MIG, vGPU guests).",
    )
    memory_utilization_percent: int | None = Field(
        default=None,
        alias="memoryUtilizationPercent",
        ge=0,
        le=100,
        description="Percent of the last sample period in which device memory was read or written "
        "(nvmlDeviceGetUtilizationRates memory; DCGM_FI_DEV_MEM_COPY_UTIL).",
    )
    memory_limits: MemoryLimitsSupport | None = Field(
        default=None,
        alias="memoryLimits",
        description="Whether the driver enforces per-cgroup memory limits on this device (NVML "
        "nvmlDeviceSetMemoryLimits_v1: driver r615+, cgroup v2, not MIG); absent when not probed.",
    )
    memory_limits_reason: str | None = Field(
        default=None,
        alias="memoryLimitsReason",
        max_length=64,
        description="Why memoryLimits is what it is (CamelCase, e.g. ProbeSucceeded, DriverTooOld, NoPermission).",
    )
    memory_limits_message: str | None = Field(
        default=None, alias="memoryLimitsMessage", max_length=1024, description="The same, for humans."
    )


class DeviceUsage(APIModel):
    """A pod's or container's VRAM on one device."""

    uuid: str = Field(max_length=128, description="Device UUID.")
    used_bytes: int | None = Field(
        default=None,
        alias="usedBytes",
        ge=0,
        le=MAX_BYTES,
        description="VRAM used on the device, bytes; absent when unknown; at most 2^53.",
    )
    sm_utilization_percent: int | None = Field(
        default=None,
        alias="smUtilizationPercent",
        ge=0,
        le=100,
        description="SM utilisation of the pod's processes on the device since the previous sample "
        "(nvmlDeviceGetProcessUtilization smUtil, summed, at most 100); absent where NVML gives none.",
    )


class PodMemoryLimit(APIModel):
    """A pod's driver-enforced memory limits on one device: what the driver holds, and
    whether that is what the pod's ``vramguard.io/memory-limits`` annotation wants."""

    uuid: str = Field(max_length=128, description="Device UUID.")
    state: MemoryLimitState = Field(
        description="Applied (the driver holds the wanted limits), Pending, Failed, Unsupported "
        "(the device cannot hold limits) or Disabled (the agent does not apply limits)."
    )
    reason: str = Field(max_length=64, description="Why, CamelCase (e.g. Applied, NotHeld, SetFailed).")
    message: str | None = Field(default=None, max_length=1024, description="The same, for humans.")
    hard_limit_bytes: int | None = Field(
        default=None,
        alias="hardLimitBytes",
        ge=0,
        le=MAX_BYTES,
        description="Hard limit the driver holds, bytes; absent: none (or above 2^53, which no device has).",
    )
    soft_limit_bytes: int | None = Field(
        default=None,
        alias="softLimitBytes",
        ge=0,
        le=MAX_BYTES,
        description="Soft limit the driver holds, bytes; absent: none (or above 2^53).",
    )
    current_used_bytes: int | None = Field(
        default=None,
        alias="currentUsedBytes",
        ge=0,
        le=MAX_BYTES,
        description="The cgroup's memory on the device as the driver counts it against the limits, bytes; at most 2^53.",
    )


class ContainerUsage(APIModel):
    """One container's usage."""

    name: str | None = Field(default=None, max_length=253, description="Container name, from the API.")
    container_id: str = Field(alias="containerID", max_length=128, description="Runtime container id (64 hex).")
    vram_bytes: int | None = Field(
        default=None, alias="vramBytes", ge=0, le=MAX_BYTES, description="VRAM over all devices, bytes; at most 2^53."
    )
    ram_working_set_bytes: int | None = Field(
        default=None,
        alias="ramWorkingSetBytes",
        ge=0,
        le=MAX_BYTES,
        description="RAM working set (usage minus inactive file), bytes; at most 2^53.",
    )
    oom_kills: int | None = Field(default=None, alias="oomKills", ge=0, description="OOM kills counted by the cgroup.")


class DmemRegion(APIModel):
    """A pod cgroup's charge on one device memory region of the kernel's dmem controller
    (cgroup v2, Linux 6.14+, NVIDIA driver r615+; Documentation/admin-guide/cgroup-v2.rst)."""

    region: str = Field(max_length=128, description="Region name from dmem.capacity, e.g. nvidia/0000:3b:00.0/vidmem.")
    current_bytes: int | None = Field(
        default=None, alias="currentBytes", ge=0, le=MAX_BYTES, description="dmem.current, bytes; at most 2^53."
    )
    min_bytes: int | None = Field(
        default=None,
        alias="minBytes",
        ge=0,
        le=MAX_BYTES,
        description="dmem.min (protected memory), bytes; absent: max or unreadable.",
    )
    max_bytes: int | None = Field(
        default=None,
        alias="maxBytes",
        ge=0,
        le=MAX_BYTES,
        description="dmem.max (hard limit), bytes; absent: no limit (max) or unreadable.",
    )


class PressureFigures(APIModel):
    """One line of a PSI file (``Documentation/accounting/psi.rst``): the share of
    time tasks stalled on memory, as percentages over 10, 60 and 300 seconds, and
    the total stall time."""

    avg10: float = Field(ge=0, le=100, allow_inf_nan=False, description="Percent of the last 10 seconds.")
    avg60: float = Field(ge=0, le=100, allow_inf_nan=False, description="Percent of the last 60 seconds.")
    avg300: float = Field(ge=0, le=100, allow_inf_nan=False, description="Percent of the last 300 seconds.")
    total_microseconds: int = Field(
        alias="totalMicroseconds", ge=0, description="Total stall time since the cgroup or the boot, microseconds."
    )


class MemoryPressure(APIModel):
    """Memory pressure stall information (PSI): ``/proc/pressure/memory`` for the node,
    a cgroup v2 ``memory.pressure`` for a pod."""

    some: PressureFigures | None = Field(
        default=None, description="Time at least one task stalled waiting for memory."
    )
    full: PressureFigures | None = Field(default=None, description="Time all non-idle tasks stalled at once.")


class HostMemory(APIModel):
    """The node's swap activity and memory pressure, read only (the kubelet owns swap and eviction)."""

    swap_in_bytes_per_second: float | None = Field(
        default=None,
        alias="swapInBytesPerSecond",
        ge=0,
        allow_inf_nan=False,
        description="Swap-in rate since the previous sample (pswpin of /proc/vmstat times the page size), bytes/s.",
    )
    swap_out_bytes_per_second: float | None = Field(
        default=None,
        alias="swapOutBytesPerSecond",
        ge=0,
        allow_inf_nan=False,
        description="Swap-out rate since the previous sample (pswpout of /proc/vmstat), bytes/s.",
    )
    pressure: MemoryPressure | None = Field(
        default=None, description="Memory pressure of the node (/proc/pressure/memory); absent without PSI."
    )


class PodUsage(APIModel):
    """One pod's usage on the node."""

    uid: str = Field(max_length=64, description="Pod UID (or a static pod's config hash).")
    namespace: str | None = Field(default=None, max_length=63, description="Pod namespace, from the API.")
    name: str | None = Field(default=None, max_length=253, description="Pod name, from the API.")
    qos_class: str | None = Field(
        default=None, alias="qosClass", max_length=16, description="guaranteed, burstable or besteffort."
    )
    attribution: Attribution = Field(
        default="Measured", description="Measured, or Unknown when NVML could not report per-process memory."
    )
    vram_bytes: int | None = Field(
        default=None,
        alias="vramBytes",
        ge=0,
        le=MAX_BYTES,
        description="VRAM over all devices, bytes; absent when unknown; at most 2^53.",
    )
    ram_working_set_bytes: int | None = Field(
        default=None,
        alias="ramWorkingSetBytes",
        ge=0,
        le=MAX_BYTES,
        description="RAM working set of the pod, bytes; at most 2^53.",
    )
    oom_kills: int | None = Field(default=None, alias="oomKills", ge=0, description="OOM kills in the pod's cgroups.")
    swap_bytes: int | None = Field(
        default=None,
        alias="swapBytes",
        ge=0,
        le=MAX_BYTES,
        description="Swap in use by the pod's cgroup (v2 memory.swap.current; v1 memory.memsw.usage_in_bytes "
        "less memory.usage_in_bytes), bytes; absent without swap accounting; at most 2^53.",
    )
    memory_pressure: MemoryPressure | None = Field(
        default=None, alias="memoryPressure", description="The pod cgroup's memory.pressure (cgroup v2 only)."
    )
    vram_source: VRAMSource | None = Field(
        default=None,
        alias="vramSource",
        description="Where vramBytes came from: NVML (per-process memory) or Dmem (the kernel's dmem.current, "
        "when NVML attributes no process to the pod, e.g. an MPS client); absent when unknown.",
    )
    dmem: list[DmemRegion] | None = Field(
        default=None,
        max_length=MAX_DEVICES,
        description="The pod cgroup's dmem charges per NVIDIA region; absent without the dmem controller.",
    )
    devices: list[DeviceUsage] = Field(default_factory=list, max_length=MAX_DEVICES, description="VRAM per device.")
    containers: list[ContainerUsage] = Field(default_factory=list, max_length=64, description="Usage per container.")
    trend: TrendFeatures | None = Field(default=None, description="VRAM trend features for leak detection.")
    ram_trend: TrendFeatures | None = Field(
        default=None,
        alias="ramTrend",
        description="RAM working-set trend features for leak detection: the same detector as the VRAM trend's, "
        "on the pod's working-set history.",
    )
    memory_limits: list[PodMemoryLimit] | None = Field(
        default=None,
        alias="memoryLimits",
        max_length=MAX_DEVICES,
        description="Driver-enforced memory limits per device, wanted by the annotation or held by the driver; "
        "absent when there are none.",
    )
    memory_limits_error: str | None = Field(
        default=None,
        alias="memoryLimitsError",
        max_length=1024,
        description="Why the pod's vramguard.io/memory-limits annotation was refused (nothing of it is applied).",
    )


class UnattributedProcess(APIModel):
    """A GPU process that belongs to no pod, with the reason."""

    pid: int = Field(ge=0, description="Host PID.")
    device: str = Field(max_length=128, description="Device UUID.")
    used_bytes: int | None = Field(
        default=None,
        alias="usedBytes",
        ge=0,
        le=MAX_BYTES,
        description="VRAM used, bytes; absent when unknown; at most 2^53.",
    )
    reason: str = Field(max_length=256, description="Why the process could not be attributed to a pod.")


class AgentInfo(APIModel):
    """The agent that wrote the report."""

    version: str = Field(max_length=64, description="Agent version.")
    backend: Literal["nvml", "sim"] = Field(description="GPU backend: nvml or sim (simulated).")
    sample_interval_seconds: float = Field(
        alias="sampleIntervalSeconds",
        gt=0,
        le=MAX_REPORT_SECONDS,
        allow_inf_nan=False,
        description="Sampling interval, seconds; at most 9223372036.854775807 (Go's largest duration).",
    )
    driver_version: str | None = Field(
        default=None, alias="driverVersion", max_length=64, description="NVIDIA driver version."
    )
    enforce_caps: bool = Field(
        default=False,
        alias="enforceCaps",
        description="Whether the agent applies pods' memory limits (--enforce-caps); off, it only reports support.",
    )


class NodeGPUUsageSpec(APIModel):
    """Identifies the node; the report itself is in status."""

    node_name: str = Field(alias="nodeName", max_length=253, description="The node this report describes.")


class NodeGPUUsageStatus(APIModel):
    """One sample of the node's devices and pods."""

    sample_time: datetime = Field(alias="sampleTime", description="When the sample was taken (RFC 3339).")
    agent: AgentInfo | None = Field(default=None, description="The agent that wrote it.")
    conditions: list[Condition] | None = Field(
        default=None,
        description="AgentHealthy and ProcessesMissing conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    devices: list[GPUDevice] = Field(default_factory=list, max_length=MAX_DEVICES, description="GPUs and MIG devices.")
    pods: list[PodUsage] = Field(default_factory=list, max_length=MAX_PODS, description="Usage per pod.")
    unattributed: list[UnattributedProcess] = Field(
        default_factory=list, max_length=MAX_UNATTRIBUTED, description="GPU processes in no pod."
    )
    truncated: bool = Field(default=False, description="True when lists were cut to their size bounds.")
    ends: list[EndRecord] = Field(
        default_factory=list,
        max_length=MAX_END_RECORDS,
        description="Ends (GPU processes, containers) not yet acknowledged by the operator (vramguard_api.ends).",
    )
    healthy_devices: int | None = Field(
        default=None, alias="healthyDevices", ge=0, le=MAX_DEVICES,
        description="Devices that answered NVML in this sample (health Healthy); 0 when the agent can read none "
        "(its AgentHealthy condition says why, and its readiness fails).",
    )
    host_memory: HostMemory | None = Field(
        default=None, alias="hostMemory", description="The node's swap activity and memory pressure."
    )


class NodeGPUUsage(APIModel):
    """The measured GPU and host memory of one node, named after the node."""

    api_version: Literal["vramguard.io/v1alpha1"] = Field(default="vramguard.io/v1alpha1", alias="apiVersion")
    kind: Literal["NodeGPUUsage"] = "NodeGPUUsage"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: NodeGPUUsageSpec
    status: NodeGPUUsageStatus | None = None
