"""A fake ``pynvml`` module object that behaves like nvidia-ml-py 13.x, errors included.

``FakeNVML`` has the attributes of the real module that the agent uses: the
error classes, constants and ``nvml*`` functions. The error classes, the
``NVML_*`` constants, ``nvmlFriendlyObject`` and the ``throwOnVersionMismatch``
decorator are taken from the installed nvidia-ml-py itself, so ``except
pynvml.NVMLError_GpuIsLost`` catches the fake's errors exactly as it catches the
real library's (and ``NVMLLibraryMismatchError`` is, as there, not an
``NVMLError``). Only the C library is replaced, by a state of ``FakeGPU`` objects.

Behaviours reproduced (see docs/agent.md and the NVML notes):
- process lists: ``usedGpuMemory`` None for NOT_AVAILABLE; instance ids
  0xFFFFFFFF when MIG is off; the unversioned functions call ``_v3`` and raise
  ``NVMLLibraryMismatchError`` when the driver lacks it (``FakeNVML.no_v3``);
  MPS clients appear in both the compute and the MPS lists;
- ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` with ``reserved``;
  v1 ``used`` includes reserved, v2 ``used`` excludes it (r510+ drivers);
  ``FunctionNotFound`` when the driver lacks ``_v2`` (``FakeNVML.no_memory_v2``);
- MIG: mode, max device count, handles by index (``NotFound`` for empty slots),
  instance ids, per-instance memory and processes; listing processes on a
  MIG-enabled parent raises ``NoPermission`` unless ``privileged``;
- faults: a lost GPU raises ``GpuIsLost`` from every call, including
  ``nvmlDeviceGetHandleByIndex``; ``hide_processes`` mimics drivers 535.54/535.86
  whose mismatched process struct loses processes while memory stays used;
  ``init_error`` makes ``nvmlInit`` (and every call) fail with that NVML code;
- per-cgroup memory limits (``nvmlDeviceSetMemoryLimits_v1`` /
  ``nvmlDeviceGetMemoryLimits_v1`` with nvidia-ml-py's own structs): limits are
  kept per device UUID and cgroup ``nameSpace`` (so they outlive ``gpus`` being
  replaced, as they outlive a sample on a real node); ``FUNCTION_NOT_FOUND``
  from a driver older than r615 (the symbol is missing, as pynvml's
  ``_nvmlGetFunctionPointer`` reports it), ``NOT_SUPPORTED`` for MIG handles
  and MIG-enabled GPUs and for a GPU whose ``memory_limits_error`` says so,
  ``NO_PERMISSION`` for a set unless ``privileged`` (root), ``INVALID_ARGUMENT``
  for an empty ``nameSpace`` or a soft limit above the hard one, ``NOT_FOUND``
  for a cgroup not in ``cgroups`` (when given); ``softLimit=0`` with
  ``hardLimit=NVML_DEVICE_MEMORY_LIMIT_MAX`` clears, as does ``remove_cgroup``;
  ``currentUsed`` sums the device's processes in the cgroup and below it
  (``pid_cgroups``); ``refuse_max_below_usage`` keeps the old hard limit when
  the new one is below that usage (the kernel's dmem controller, Linux 6.14,
  refuses such a max with EBUSY and its caller ignores it). These are in
  ``fakenvml_limits``;
- utilisation: ``nvmlDeviceGetUtilizationRates`` returns nvidia-ml-py's own
  ``c_nvmlUtilization_t`` (gpu, memory: percent) and ``nvmlDeviceGetProcessUtilization(handle,
  timeStamp)`` a list of its ``c_nvmlProcessUtilizationSample_t`` (pid, timeStamp in
  microseconds, smUtil, memUtil, encUtil, decUtil), one per process, stamped
  ``FakeNVML.time_us``, only when newer than ``timeStamp``: ``NOT_FOUND`` when there is
  no sample newer (the driver's answer), ``NOT_SUPPORTED`` on MIG devices, MIG-enabled
  GPUs and vGPU guests (both calls; the driver cannot split an instance's or a guest's time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

from .fakenvml_limits import FakeMemoryLimits

NO_INSTANCE = 0xFFFFFFFF  # NVML's "no GPU/compute instance" (MIG off)
MIB = 1024 * 1024


@dataclass
class FakeProcess:
    """A process holding ``used_bytes`` (its true usage) on a device.

    ``kind`` is ``compute``, ``graphics`` or ``mps`` (an MPS client, listed in
    both the compute and the MPS lists).
    """

    pid: int
    used_bytes: int
    kind: str = "compute"
    sm_util: int = 0
    mem_util: int = 0


@dataclass
class FakeMigDevice:
    """A MIG device (GPU instance + compute instance) of a ``FakeGPU``."""

    uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    total_bytes: int
    overhead_bytes: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    listing_not_supported: bool = False


@dataclass
class FakeGPU:
    """A GPU's state. ``overhead_bytes`` is used memory that belongs to no process.

    ``mig_devices`` is None when MIG is disabled (or ``mig_capable`` is False).
    """

    uuid: str
    name: str
    total_bytes: int
    reserved_bytes: int = 0
    overhead_bytes: int = 0
    virtualization_mode: int = 0
    mig_capable: bool = False
    max_mig_devices: int = 7
    mig_devices: list[FakeMigDevice] | None = None
    processes: list[FakeProcess] = field(default_factory=list)
    lost: bool = False
    not_available: bool = False
    hide_processes: bool = False
    memory_error: int | None = None
    memory_limits_error: int | None = None
    utilization_gpu: int = 0
    utilization_memory: int = 0

    def process_bytes(self) -> int:
        """True memory held by processes (and MIG devices) on the GPU, bytes."""
        if self.mig_devices is not None:
            return sum(m.overhead_bytes + sum(p.used_bytes for p in m.processes) for m in self.mig_devices)
        return sum(p.used_bytes for p in self.processes)


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGPU
    mig: FakeMigDevice | None = None


class FakeNVML(FakeMemoryLimits):
    """A stand-in for the ``pynvml`` module. Pass it to ``NVMLBackend(nvml=...)``.

    State is plain attributes: ``gpus``, ``driver_version``, ``privileged``,
    ``no_v3``, ``no_memory_v2``, ``init_error`` (an ``NVML_ERROR_*`` code or None);
    for memory limits ``memory_limits`` (GPU UUID -> nameSpace -> (soft, hard)
    bytes), ``cgroups`` (the nameSpaces that exist; None: any), ``pid_cgroups``
    (pid -> nameSpace of its cgroup) and ``refuse_max_below_usage``.
    ``calls`` counts calls per function name (for tests and the benchmark).
    """

    def __init__(
        self,
        gpus: list[FakeGPU] | None = None,
        driver_version: str = "550.90.07",
        privileged: bool = False,
    ) -> None:
        self.gpus: list[FakeGPU] = list(gpus or [])
        self.driver_version = driver_version
        self.privileged = privileged
        self.no_v3 = False
        self.no_memory_v2 = False
        self.init_error: int | None = None
        self.time_us = 1_700_000_000_000_000  # the driver's sample clock, microseconds
        self.init_memory_limits()
        self.calls: dict[str, int] = {}
        self._refcount = 0
        for name in dir(_real):
            if name.startswith(("NVMLError", "NVML_")):
                setattr(self, name, getattr(_real, name))
        self.NVMLLibraryMismatchError = _real.NVMLLibraryMismatchError
        self.nvmlMemory_v2 = _real.nvmlMemory_v2
        self.nvmlFriendlyObject = _real.nvmlFriendlyObject
        for kind in ("Compute", "Graphics", "MPSCompute"):
            self._define_process_functions(kind)

    # --- library -------------------------------------------------------------

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _check_init(self) -> None:
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        if self._refcount <= 0:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise _real.NVMLError(self.init_error)
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        self._check_init()
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._count("nvmlSystemGetDriverVersion")
        self._check_init()
        return self.driver_version

    # --- devices -------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._count("nvmlDeviceGetHandleByIndex")
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        self._check_lost(gpu)
        return _Handle(gpu)

    def _device(self, handle: _Handle) -> FakeGPU:
        self._check_init()
        if not isinstance(handle, _Handle):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        self._check_lost(handle.gpu)
        return handle.gpu

    @staticmethod
    def _check_lost(gpu: FakeGPU) -> None:
        if gpu.lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._count("nvmlDeviceGetUUID")
        gpu = self._device(handle)
        return handle.mig.uuid if handle.mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._count("nvmlDeviceGetName")
        gpu = self._device(handle)
        # A MIG device's name is its parent's followed by "MIG <profile>".
        return f"{gpu.name} MIG {handle.mig.profile}" if handle.mig else gpu.name

    def nvmlDeviceGetVirtualizationMode(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetVirtualizationMode")
        gpu = self._device(handle)
        if handle.mig:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.virtualization_mode

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        self._count("nvmlDeviceGetMemoryInfo")
        gpu = self._device(handle)
        if version and self.no_memory_v2:
            raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if gpu.memory_error is not None:
            raise _real.NVMLError(gpu.memory_error)
        if handle.mig:
            mig = handle.mig
            total, reserved = mig.total_bytes, 0
            used_v1 = mig.overhead_bytes + sum(p.used_bytes for p in mig.processes)
        else:
            total, reserved = gpu.total_bytes, gpu.reserved_bytes
            used_v1 = reserved + gpu.overhead_bytes + gpu.process_bytes()
        free = max(0, total - used_v1)
        if not version:
            memory = _real.c_nvmlMemory_t()
            memory.total, memory.free, memory.used = total, free, total - free
            return memory
        if version != _real.nvmlMemory_v2:
            raise _real.NVMLError(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        memory2 = _real.c_nvmlMemory_v2_t()
        memory2.version = version
        memory2.total, memory2.reserved, memory2.free = total, reserved, free
        memory2.used = max(0, total - reserved - free)
        return memory2

    # --- MIG -----------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._count("nvmlDeviceGetMigMode")
        gpu = self._device(handle)
        if not gpu.mig_capable or handle.mig:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        mode = _real.NVML_DEVICE_MIG_ENABLE if gpu.mig_devices is not None else _real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetMaxMigDeviceCount")
        gpu = self._device(handle)
        if not gpu.mig_capable:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._count("nvmlDeviceGetMigDeviceHandleByIndex")
        gpu = self._device(handle)
        if gpu.mig_devices is None or handle.mig or not 0 <= index < gpu.max_mig_devices:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig_devices):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return _Handle(gpu, gpu.mig_devices[index])

    def nvmlDeviceIsMigDeviceHandle(self, handle: _Handle) -> int:
        self._count("nvmlDeviceIsMigDeviceHandle")
        self._device(handle)
        return 1 if handle.mig else 0

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: _Handle) -> _Handle:
        self._count("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        gpu = self._device(handle)
        if not handle.mig:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(gpu)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetGpuInstanceId")
        self._device(handle)
        if not handle.mig:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._count("nvmlDeviceGetComputeInstanceId")
        self._device(handle)
        if not handle.mig:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.compute_instance_id

    # --- utilisation ---------------------------------------------------------

    def _check_utilization(self, handle: _Handle) -> FakeGPU:
        gpu = self._device(handle)
        if handle.mig or gpu.mig_devices is not None or gpu.virtualization_mode == _real.NVML_GPU_VIRTUALIZATION_MODE_VGPU:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        self._count("nvmlDeviceGetUtilizationRates")
        gpu = self._check_utilization(handle)
        return _real.c_nvmlUtilization_t(gpu=gpu.utilization_gpu, memory=gpu.utilization_memory)

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, timeStamp: int) -> list[Any]:  # noqa: N803 - pynvml's name
        self._count("nvmlDeviceGetProcessUtilization")
        gpu = self._check_utilization(handle)
        if not gpu.processes or self.time_us <= timeStamp:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        sample = _real.c_nvmlProcessUtilizationSample_t
        return [
            sample(pid=p.pid, timeStamp=self.time_us, smUtil=p.sm_util, memUtil=p.mem_util, encUtil=0, decUtil=0)
            for p in gpu.processes
        ]

    # --- processes -----------------------------------------------------------

    def _define_process_functions(self, kind: str) -> None:
        base = f"nvmlDeviceGet{kind}RunningProcesses"

        def v3(handle: _Handle) -> list[Any]:
            self._count(f"{base}_v3")
            if self.no_v3:
                self._check_init()
                raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
            return self._processes(handle, kind)

        def v2(handle: _Handle) -> list[Any]:
            self._count(f"{base}_v2")
            return self._processes(handle, kind)

        # The unversioned name calls _v3 through the real module's decorator, which
        # turns FunctionNotFound into NVMLLibraryMismatchError.
        unversioned: Callable[[_Handle], list[Any]] = _real.throwOnVersionMismatch(v3)
        setattr(self, f"{base}_v3", v3)
        setattr(self, f"{base}_v2", v2)
        setattr(self, base, unversioned)

    def _processes(self, handle: _Handle, kind: str) -> list[Any]:
        gpu = self._device(handle)
        wanted = {"Compute": ("compute", "mps"), "Graphics": ("graphics",), "MPSCompute": ("mps",)}[kind]
        if handle.mig:
            if handle.mig.listing_not_supported:
                raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
            entries: list[tuple[FakeProcess, FakeMigDevice | None]] = [(p, handle.mig) for p in handle.mig.processes]
        elif gpu.mig_devices is not None:
            # Aggregate listing on a MIG-enabled parent needs privileges.
            if not self.privileged:
                raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)
            entries = [(p, m) for m in gpu.mig_devices for p in m.processes]
        else:
            entries = [(p, None) for p in gpu.processes]
        if gpu.hide_processes:
            entries = []
        return [self._process_object(p, m, gpu.not_available) for p, m in entries if p.kind in wanted]

    @staticmethod
    def _process_object(p: FakeProcess, mig: FakeMigDevice | None, not_available: bool) -> Any:
        return _real.nvmlFriendlyObject(
            {
                "pid": p.pid,
                # pynvml turns NVML_VALUE_NOT_AVAILABLE into None.
                "usedGpuMemory": None if not_available else p.used_bytes,
                "gpuInstanceId": mig.gpu_instance_id if mig else NO_INSTANCE,
                "computeInstanceId": mig.compute_instance_id if mig else NO_INSTANCE,
            }
        )
