"""The GPU backend interface: what one sample of the node's devices holds.

A backend (``NVMLBackend`` over nvidia-ml-py, or the simulated backend, which
runs the same NVML code over a scenario) returns one ``DeviceSample`` per GPU
and per MIG device. Errors are captured per device, so that one broken device
leaves the rest of the sample intact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

Health = Literal["Healthy", "Lost", "Error"]
VirtualizationMode = Literal["None", "Passthrough", "VGPU", "HostVGPU", "HostVSGA"]

# nvmlDeviceGetVirtualizationMode values (NVML_GPU_VIRTUALIZATION_MODE_*).
VIRTUALIZATION_MODES: dict[int, VirtualizationMode] = {
    0: "None",
    1: "Passthrough",
    2: "VGPU",
    3: "HostVGPU",
    4: "HostVSGA",
}


class BackendUnavailable(RuntimeError):
    """The GPU backend cannot sample at all (libnvidia-ml absent, driver not loaded).

    The agent reports this in its AgentHealthy condition and keeps retrying.
    """


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    """Framebuffer memory of one device, bytes, as NVML reports it.

    ``reserved`` is None when only ``nvmlMemory_v1`` was available.
    """

    total: int
    used: int
    free: int
    reserved: int | None = None

    @property
    def usable(self) -> int:
        """Usable memory: total minus reserved (total when reserved is unknown)."""
        return max(0, self.total - (self.reserved or 0))


class GPUProcess(NamedTuple):
    """One process on one device.

    ``pid`` is a host PID (NVML knows no PID namespaces); ``used_bytes`` is None
    when NVML could not measure it (NOT_AVAILABLE). Instance ids are None when
    MIG is off (NVML reports 0xFFFFFFFF). A tuple: a sample makes one per process.
    """

    pid: int
    used_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryLimitsSupport:
    """Whether a device holds per-cgroup memory limits, and why (``vramguard_api.memlimits``'s
    ``REASON_*``): ``supported`` is True only when NVML answered for this device."""

    supported: bool
    reason: str
    message: str


@dataclass(slots=True)
class DeviceSample:
    """One GPU or MIG device in one sample.

    ``processes`` is None when the per-process listing failed (then
    ``process_error`` says why); an empty list means no process.
    ``memory_limits`` is set by the memory-limit probe (``caps``), None before.
    ``utilization_gpu``/``utilization_memory``: percent (nvmlDeviceGetUtilizationRates);
    ``process_utilization``: pid → mean SM percent since the last read (``utilization``);
    None where NVML gives none (MIG, vGPU guests, errors).
    """

    uuid: str
    index: int
    model_name: str | None = None
    parent_uuid: str | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_enabled: bool = False
    virtualization_mode: VirtualizationMode = "None"
    memory: MemoryInfo | None = None
    processes: list[GPUProcess] | None = field(default_factory=list)
    process_error: str | None = None
    health: Health = "Healthy"
    error: str | None = None
    memory_limits: MemoryLimitsSupport | None = None
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    process_utilization: dict[int, int] | None = None


@dataclass(slots=True)
class GPUSample:
    """Everything a backend saw in one sample."""

    devices: list[DeviceSample]
    driver_version: str | None = None


class GPUBackend(Protocol):
    """A source of GPU samples.

    ``sample()`` returns one ``GPUSample``; it raises ``BackendUnavailable`` only
    when nothing at all can be read, never for a single device's error.
    ``name`` is ``"nvml"`` or ``"sim"``.
    """

    name: Literal["nvml", "sim"]

    def sample(self) -> GPUSample: ...

    def close(self) -> None: ...
