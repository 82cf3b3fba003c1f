"""The fake pynvml's per-cgroup memory limits, as nvidia-ml-py 13.615 exposes them.

``FakeMemoryLimits`` is a part of ``fakenvml.FakeNVML`` (see its docstring for
the behaviours reproduced). The binding being mimicked, from nvidia-ml-py
13.615.71's ``pynvml.py``::

    def nvmlDeviceSetMemoryLimits_v1(device, limits):
        fn = _nvmlGetFunctionPointer("nvmlDeviceSetMemoryLimits_v1")
        ret = fn(device, byref(limits))
        _nvmlCheckReturn(ret)

and the same for ``nvmlDeviceGetMemoryLimits_v1``; ``limits`` is a
``c_nvmlSetMemoryLimits_v1_t(nameSpace, softLimit, hardLimit)`` or a
``c_nvmlGetMemoryLimits_v1_t(nameSpace, softLimit, hardLimit, currentUsed)``
(``nameSpace`` a ``c_char_p``, the rest bytes as ``c_ulonglong``); both return
None and raise ``NVMLError_<Name>``. What the real driver answers beyond the
NVML reference (get needs no root; a cgroup that does not exist is NOT_FOUND)
is assumed, and said so in docs/agent.md.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import pynvml as _real

if TYPE_CHECKING:
    from .fakenvml import FakeGPU, _Handle

MEMORY_LIMITS_MIN_DRIVER = 615  # MPS v3 memory partitioning: driver r615 / CUDA 13.4
_NO_LIMITS = (0, _real.NVML_DEVICE_MEMORY_LIMIT_MAX)


class FakeMemoryLimits:
    """Memory-limit state and calls of the fake pynvml (mixed into ``FakeNVML``)."""

    driver_version: str
    privileged: bool

    if TYPE_CHECKING:  # provided by FakeNVML

        def _count(self, name: str) -> None: ...

        def _check_init(self) -> None: ...

        def _device(self, handle: _Handle) -> FakeGPU: ...

    def init_memory_limits(self) -> None:
        """Empty state: no limits, every cgroup exists, no pid in a known cgroup."""
        self.memory_limits: dict[str, dict[str, tuple[int, int]]] = {}
        self.cgroups: set[str] | None = None
        self.pid_cgroups: dict[int, str] = {}
        self.refuse_max_below_usage = False
        self.c_nvmlSetMemoryLimits_v1_t = _real.c_nvmlSetMemoryLimits_v1_t
        self.c_nvmlGetMemoryLimits_v1_t = _real.c_nvmlGetMemoryLimits_v1_t

    def nvmlDeviceSetMemoryLimits_v1(self, device: _Handle, limits: Any) -> None:
        """Set ``limits.softLimit`` and ``limits.hardLimit`` (bytes) for cgroup ``limits.nameSpace``."""
        gpu, namespace = self._limits_target("nvmlDeviceSetMemoryLimits_v1", device, limits)
        if not self.privileged:
            raise _real.NVMLError(_real.NVML_ERROR_NO_PERMISSION)
        soft, hard = int(limits.softLimit), int(limits.hardLimit)
        if soft > hard:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        held = self.memory_limits.setdefault(gpu.uuid, {})
        if self.refuse_max_below_usage and hard < self._cgroup_used(gpu, namespace):
            hard = held.get(namespace, _NO_LIMITS)[1]
        if (soft, hard) == _NO_LIMITS:
            held.pop(namespace, None)
        else:
            held[namespace] = (soft, hard)

    def nvmlDeviceGetMemoryLimits_v1(self, device: _Handle, limits: Any) -> None:
        """Fill ``limits.softLimit``, ``hardLimit`` and ``currentUsed`` (bytes) for ``limits.nameSpace``."""
        gpu, namespace = self._limits_target("nvmlDeviceGetMemoryLimits_v1", device, limits)
        limits.softLimit, limits.hardLimit = self.memory_limits.get(gpu.uuid, {}).get(namespace, _NO_LIMITS)
        limits.currentUsed = self._cgroup_used(gpu, namespace)

    def remove_cgroup(self, namespace: str) -> None:
        """The cgroup (and every cgroup below it) is removed: the driver forgets their limits."""

        def inside(ns: str) -> bool:
            return ns == namespace or ns.startswith(namespace + "/")

        for held in self.memory_limits.values():
            for ns in [n for n in held if inside(n)]:
                del held[ns]
        if self.cgroups is not None:
            self.cgroups = {n for n in self.cgroups if not inside(n)}

    def _limits_target(self, name: str, device: _Handle, limits: Any) -> tuple[FakeGPU, str]:
        """The checks both calls make, in the real binding's order: the symbol (at
        lookup), the struct passed by reference, the handle, the device, the cgroup."""
        self._count(name)
        self._check_init()
        if _driver_major(self.driver_version) < MEMORY_LIMITS_MIN_DRIVER:
            raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        ctypes.byref(limits)  # pynvml passes byref(limits): anything but a ctypes object is a TypeError
        gpu = self._device(device)
        if device.mig is not None or gpu.mig_devices is not None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)  # "MIG handles are not supported"
        if gpu.memory_limits_error is not None:
            raise _real.NVMLError(gpu.memory_limits_error)
        namespace = limits.nameSpace
        if not namespace:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        if self.cgroups is not None and namespace not in self.cgroups:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return gpu, str(namespace)

    def _cgroup_used(self, gpu: FakeGPU, namespace: str) -> int:
        """Memory of the device's processes in cgroup ``namespace`` or below it, bytes."""
        total = 0
        for p in gpu.processes:
            ns = self.pid_cgroups.get(p.pid)
            if ns is not None and (ns == namespace or ns.startswith(namespace + "/")):
                total += p.used_bytes
        return total


def _driver_major(version: str) -> int:
    """``615`` for ``"615.12.03"``; 0 when the version does not start with a number."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0
