"""Per-cgroup GPU memory limits through NVML: probe, get, set, clear.

NVML (driver r615+, nvidia-ml-py 13.615+) holds a soft and a hard limit per
device and cgroup: ``nvmlDeviceSetMemoryLimits_v1(handle, c_nvmlSetMemoryLimits_v1_t)``
and ``nvmlDeviceGetMemoryLimits_v1(handle, c_nvmlGetMemoryLimits_v1_t)``, whose
``nameSpace`` is the full sysfs path of the cgroup (``/sys/fs/cgroup/...``),
limits in bytes, ``softLimit=0`` with ``hardLimit=NVML_DEVICE_MEMORY_LIMIT_MAX``
for none. Setting needs root; MIG handles are not supported; the feature needs
cgroup v2 at /sys/fs/cgroup (NVML API reference; NVIDIA, "MPS v3 Memory
Partitioning").

The probe asks the driver with a **get** (``nameSpace`` in, limits out): it
reads and changes nothing, on the device or in the cgroup, which a set of the
current values would not guarantee (it needs root and races with a concurrent
change). Before asking, it rules out what NVML would refuse anyway: an
nvidia-ml-py without the functions, MIG devices, a host without cgroup v2.
NVML's answer decides the rest: FUNCTION_NOT_FOUND (the driver lacks the
symbol: older than r615), NOT_SUPPORTED, NO_PERMISSION, any other error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from vramguard_api import memlimits as ML

from .gpu import DeviceSample, MemoryLimitsSupport
from .nvml import describe

log = logging.getLogger(__name__)

# What nvidia-ml-py must provide (13.615 and newer do).
REQUIRED = (
    "nvmlDeviceGetMemoryLimits_v1",
    "nvmlDeviceSetMemoryLimits_v1",
    "c_nvmlGetMemoryLimits_v1_t",
    "c_nvmlSetMemoryLimits_v1_t",
    "NVML_DEVICE_MEMORY_LIMIT_MAX",
)
MIN_DRIVER_MAJOR = 615  # MPS v3 memory partitioning: driver r615 / CUDA 13.4


@dataclass(frozen=True, slots=True)
class HeldLimits:
    """What the driver holds for one cgroup on one device, bytes.

    ``hard`` is NVML's value (``NVML_DEVICE_MEMORY_LIMIT_MAX``: none);
    ``current_used`` is the cgroup's memory on the device as the driver counts it.
    """

    soft: int
    hard: int
    current_used: int | None = None

    @property
    def is_clear(self) -> bool:
        """No limit at all (soft 0, hard MAX)."""
        return self.soft == 0 and self.hard == ML.NVML_DEVICE_MEMORY_LIMIT_MAX

    def holds(self, wanted: ML.DeviceMemoryLimit) -> bool:
        """The driver holds exactly ``wanted``."""
        return (self.soft, self.hard) == (wanted.soft_limit, wanted.nvml_hard_limit)


class LimitsError(Exception):
    """An NVML memory-limit call failed.

    ``reason`` is a ``vramguard_api.memlimits`` reason; ``device_wide`` is True
    when the error says the device (or the driver, or the agent's privileges)
    cannot hold limits at all, rather than this one call failing.
    """

    def __init__(self, reason: str, message: str, device_wide: bool) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.device_wide = device_wide


def driver_major(version: str | None) -> int | None:
    """The driver branch: ``615`` for ``"615.12.03"``; None when unknown or unparsable."""
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def library_version() -> str:
    """The installed nvidia-ml-py's version, or "unknown"."""
    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return "unknown"


class NVMLMemoryLimits:
    """Memory-limit calls over the ``pynvml`` module (or ``FakeNVML``) that the
    backend samples with; NVML must be initialised (the backend's sample does it).

    Every call raises ``LimitsError`` (never an ``NVMLError``). ``driver_version``
    (``nvmlSystemGetDriverVersion``) only words the messages.
    """

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.driver_version: str | None = None

    @property
    def library_supported(self) -> bool:
        """nvidia-ml-py has the functions and structs (13.615 and newer)."""
        return all(hasattr(self._nvml, name) for name in REQUIRED)

    def probe(self, device: DeviceSample, namespace: str, cgroup_v2: bool) -> MemoryLimitsSupport:
        """Whether ``device`` holds limits: the static rules, then a get on ``namespace``."""
        if not self.library_supported:
            return MemoryLimitsSupport(
                False,
                ML.REASON_LIBRARY_TOO_OLD,
                f"nvidia-ml-py {library_version()} has no nvmlDeviceSetMemoryLimits_v1 (13.615 or newer has)",
            )
        if device.parent_uuid is not None:
            return MemoryLimitsSupport(False, ML.REASON_MIG_DEVICE, "NVML does not support limits on MIG devices")
        if device.mig_enabled:
            return MemoryLimitsSupport(False, ML.REASON_MIG_ENABLED, "MIG mode is on: limits need a non-MIG device")
        if not cgroup_v2:
            return MemoryLimitsSupport(
                False, ML.REASON_CGROUP_V2_REQUIRED, "limits need cgroup v2 (the unified hierarchy) at /sys/fs/cgroup"
            )
        try:
            self.get(device.index, namespace)
        except LimitsError as err:
            reason = err.reason if err.device_wide else ML.REASON_PROBE_FAILED
            return MemoryLimitsSupport(False, reason, err.message)
        return MemoryLimitsSupport(
            True, ML.REASON_PROBE_SUCCEEDED, f"nvmlDeviceGetMemoryLimits_v1 answered for {namespace}"
        )

    def get(self, index: int, namespace: str) -> HeldLimits:
        """The limits the driver holds for cgroup ``namespace`` on GPU ``index``."""
        self._require("nvmlDeviceGetMemoryLimits_v1")
        limits = self._nvml.c_nvmlGetMemoryLimits_v1_t()
        limits.nameSpace = namespace
        self._call("nvmlDeviceGetMemoryLimits_v1", index, limits)
        return HeldLimits(int(limits.softLimit), int(limits.hardLimit), int(limits.currentUsed))

    def set(self, index: int, namespace: str, soft: int, hard: int) -> None:
        """Set the soft and hard limits (bytes; hard ``NVML_DEVICE_MEMORY_LIMIT_MAX``: none)."""
        self._require("nvmlDeviceSetMemoryLimits_v1")
        limits = self._nvml.c_nvmlSetMemoryLimits_v1_t()
        limits.nameSpace, limits.softLimit, limits.hardLimit = namespace, soft, hard
        self._call("nvmlDeviceSetMemoryLimits_v1", index, limits)

    def clear(self, index: int, namespace: str) -> None:
        """Remove both limits (NVML: soft 0, hard ``NVML_DEVICE_MEMORY_LIMIT_MAX``)."""
        self.set(index, namespace, 0, ML.NVML_DEVICE_MEMORY_LIMIT_MAX)

    def _require(self, name: str) -> None:
        if not self.library_supported:
            raise LimitsError(ML.REASON_LIBRARY_TOO_OLD, f"nvidia-ml-py {library_version()} has no {name}", True)

    def _call(self, name: str, index: int, limits: Any) -> None:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            getattr(nvml, name)(handle, limits)
        except nvml.NVMLError as err:
            raise self._classify(name, err) from err

    def _classify(self, name: str, err: Any) -> LimitsError:
        nvml, text = self._nvml, f"{name}: {describe(err)}"
        if isinstance(err, nvml.NVMLError_FunctionNotFound):
            major = driver_major(self.driver_version)
            if major is not None and major < MIN_DRIVER_MAJOR:
                return LimitsError(
                    ML.REASON_DRIVER_TOO_OLD, f"{text} (driver {self.driver_version} is older than r615)", True
                )
            return LimitsError(ML.REASON_FUNCTION_NOT_FOUND, text, True)
        if isinstance(err, nvml.NVMLError_NotSupported):
            return LimitsError(ML.REASON_NOT_SUPPORTED, text, True)
        if isinstance(err, nvml.NVMLError_NoPermission):
            return LimitsError(ML.REASON_NO_PERMISSION, f"{text} (setting limits needs root)", True)
        return LimitsError(ML.REASON_PROBE_FAILED, text, False)
