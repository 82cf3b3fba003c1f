"""The NVML backend over nvidia-ml-py (module ``pynvml``).

Facts this code relies on are in docs/agent.md ("NVML"); the short version:
the unversioned process functions call ``_v3`` and raise
``NVMLLibraryMismatchError`` (not an ``NVMLError``) on drivers without it, so we
fall back to ``_v2``; ``usedGpuMemory is None`` means unknown; instance ids are
0xFFFFFFFF without MIG; listing processes on a MIG-enabled parent needs
privileges, so processes are listed per MIG device and the parent's aggregate
list is only a fallback; each device's errors are caught and recorded on that
device, and a lost GPU never stops the others from being sampled.
"""

from __future__ import annotations

import logging
import re
from types import ModuleType
from typing import Any, Literal

from .gpu import (
    VIRTUALIZATION_MODES,
    BackendUnavailable,
    DeviceSample,
    GPUProcess,
    GPUSample,
    MemoryInfo,
)
from .utilization import mean_sm_util

log = logging.getLogger(__name__)

NO_INSTANCE = 0xFFFFFFFF
PROCESS_LISTS = ("Compute", "Graphics", "MPSCompute")
_MIG_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")


def _text(value: Any) -> str:
    """NVML strings are bytes in old nvidia-ml-py releases, str in current ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(err: BaseException) -> str:
    """``NVMLError_GpuIsLost: GPU is lost`` — the class names the NVML code."""
    return f"{type(err).__name__}: {err}"


def mig_profile_from_name(name: str | None) -> str | None:
    """The MIG profile in a MIG device's name (``... A100-SXM4-40GB MIG 1g.5gb`` → ``1g.5gb``)."""
    match = _MIG_NAME.search(name or "")
    return match.group(1) if match else None


class NVMLBackend:
    """Samples every GPU and MIG device through NVML.

    ``nvml`` is the ``pynvml`` module (the default) or an object that behaves like
    it, such as ``fakenvml.FakeNVML``. ``sample()`` raises ``BackendUnavailable``
    when NVML cannot be initialised or the device count cannot be read; every
    other error is recorded on the device it concerns.
    """

    name: Literal["nvml", "sim"] = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml: Any = nvml
        self._initialized = False
        self._uuids: dict[int, str] = {}
        # Feature probes, remembered once the library says a symbol is missing.
        self._memory_v2 = hasattr(nvml, "nvmlMemory_v2")
        self._process_v3 = dict.fromkeys(PROCESS_LISTS, True)
        self._util_seen: dict[str, int] = {}  # device UUID -> newest process-utilisation timestamp, µs

    @property
    def library(self) -> Any:
        """The ``pynvml`` module (or stand-in) this backend samples with."""
        return self._nvml

    # --- lifecycle -----------------------------------------------------------

    def _ensure_init(self) -> None:
        if self._initialized:
            return
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as err:
            raise BackendUnavailable(f"nvmlInit failed: {describe(err)}") from err
        self._initialized = True

    def close(self) -> None:
        """Shut NVML down; errors are ignored (the process is leaving)."""
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as err:
                log.debug("nvmlShutdown: %s", describe(err))

    # --- sampling ------------------------------------------------------------

    def sample(self) -> GPUSample:
        """One sample of all devices; see the class docstring for errors."""
        self._ensure_init()
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            # Re-initialise on the next sample (driver reloaded, library reset).
            self._initialized = False
            raise BackendUnavailable(f"nvmlDeviceGetCount failed: {describe(err)}") from err
        devices: list[DeviceSample] = []
        for index in range(count):
            devices.extend(self._sample_gpu(index))
        return GPUSample(devices=devices, driver_version=self._driver_version())

    def _driver_version(self) -> str | None:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError as err:
            log.debug("nvmlSystemGetDriverVersion: %s", describe(err))
            return None

    def _sample_gpu(self, index: int) -> list[DeviceSample]:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as err:
            # Without a handle the UUID is the one seen last time, if any.
            uuid = self._uuids.get(index, f"GPU-unknown-index-{index}")
            return [self._failed(DeviceSample(uuid=uuid, index=index), err)]
        self._uuids[index] = uuid
        device = DeviceSample(uuid=uuid, index=index)
        try:
            device.model_name = self._optional(nvml.nvmlDeviceGetName, handle, transform=_text)
            mode = self._optional(nvml.nvmlDeviceGetVirtualizationMode, handle)
            device.virtualization_mode = VIRTUALIZATION_MODES.get(mode, "None") if mode is not None else "None"
            device.mig_enabled = self._mig_enabled(handle)
            device.memory = self._memory(handle)
            if device.mig_enabled:
                device.processes = []  # listed per MIG device
                return [device, *self._mig_devices(handle, device)]
            device.processes, device.process_error = self._processes(handle)
            self._utilization(handle, device)
        except nvml.NVMLError as err:
            return [self._failed(device, err)]
        return [device]

    def _failed(self, device: DeviceSample, err: BaseException) -> DeviceSample:
        lost = isinstance(err, self._nvml.NVMLError_GpuIsLost)
        device.health = "Lost" if lost else "Error"
        device.error = describe(err)
        device.processes = None
        return device

    def _optional(self, fn: Any, *args: Any, transform: Any = None) -> Any:
        """Call an NVML query whose absence is not an error (NotSupported → None).

        GpuIsLost and other errors propagate to the device's handler.
        """
        try:
            value = fn(*args)
        except (self._nvml.NVMLError_NotSupported, self._nvml.NVMLError_FunctionNotFound):
            return None
        return transform(value) if transform else value

    def _utilization(self, handle: Any, device: DeviceSample) -> None:
        """Device and per-process utilisation (``utilization``); NotSupported leaves them None,
        NotFound (no sample since the last read) means no process computed. Any other
        error but a lost GPU leaves them None too: utilisation never fails the device's memory."""
        nvml = self._nvml
        since = self._util_seen.get(device.uuid, 0)
        try:
            rates = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            if rates is not None:
                device.utilization_gpu, device.utilization_memory = int(rates.gpu), int(rates.memory)
            try:
                samples = self._optional(nvml.nvmlDeviceGetProcessUtilization, handle, since)
            except nvml.NVMLError_NotFound:
                samples = []
        except nvml.NVMLError as err:
            if isinstance(err, nvml.NVMLError_GpuIsLost):
                raise
            log.debug("utilisation of %s: %s", device.uuid, describe(err))
            return
        if samples is not None:
            device.process_utilization, self._util_seen[device.uuid] = mean_sm_util(samples, since)

    def _mig_enabled(self, handle: Any) -> bool:
        modes = self._optional(self._nvml.nvmlDeviceGetMigMode, handle)
        return bool(modes) and modes[0] == getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1)

    def _memory(self, handle: Any) -> MemoryInfo:
        nvml = self._nvml
        if self._memory_v2:
            try:
                m = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
                return MemoryInfo(total=int(m.total), used=int(m.used), free=int(m.free), reserved=int(m.reserved))
            except nvml.NVMLError_FunctionNotFound:
                self._memory_v2 = False  # the driver has no _v2 at all
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_ArgumentVersionMismatch):
                pass  # this device only
        m = nvml.nvmlDeviceGetMemoryInfo(handle)
        return MemoryInfo(total=int(m.total), used=int(m.used), free=int(m.free))

    # --- MIG -----------------------------------------------------------------

    def _mig_devices(self, handle: Any, parent: DeviceSample) -> list[DeviceSample]:
        nvml = self._nvml
        parent_listing: list[Any] = []  # lazily filled: [processes or error]
        devices: list[DeviceSample] = []
        slot_errors: list[str] = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue  # empty slot
            except nvml.NVMLError_GpuIsLost:
                raise
            except nvml.NVMLError as err:
                slot_errors.append(f"MIG slot {slot}: {describe(err)}")
                continue
            devices.append(self._mig_device(handle, mig_handle, parent, parent_listing))
        if slot_errors:
            parent.error = "; ".join(slot_errors)
        return devices

    def _mig_device(
        self, handle: Any, mig_handle: Any, parent: DeviceSample, parent_listing: list[Any]
    ) -> DeviceSample:
        nvml = self._nvml
        device = DeviceSample(uuid="", index=parent.index, parent_uuid=parent.uuid)
        device.virtualization_mode = parent.virtualization_mode
        try:
            device.uuid = _text(nvml.nvmlDeviceGetUUID(mig_handle))
            device.model_name = self._optional(nvml.nvmlDeviceGetName, mig_handle, transform=_text)
            device.mig_profile = mig_profile_from_name(device.model_name)
            device.gpu_instance_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig_handle))
            device.compute_instance_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig_handle))
            device.memory = self._memory(mig_handle)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError as err:
            device.uuid = device.uuid or f"{parent.uuid}/mig-unknown"
            return self._failed(device, err)
        device.processes, device.process_error = self._processes(mig_handle)
        if device.processes is None:
            self._fall_back_to_parent(handle, device, parent_listing)
        return device

    def _fall_back_to_parent(self, handle: Any, device: DeviceSample, parent_listing: list[Any]) -> None:
        """Per-instance listing failed: filter the parent's aggregate list by instance ids.

        The aggregate list needs privileges; NoPermission leaves this MIG device's
        processes unknown and the other devices untouched.
        """
        if not parent_listing:
            parent_listing.append(self._processes(handle))
        processes, error = parent_listing[0]
        if processes is None:
            device.process_error = f"{device.process_error}; parent listing: {error}"
            return
        device.processes = [
            p
            for p in processes
            if p.gpu_instance_id == device.gpu_instance_id and p.compute_instance_id == device.compute_instance_id
        ]
        device.process_error = None

    # --- processes -----------------------------------------------------------

    def _processes(self, handle: Any) -> tuple[list[GPUProcess] | None, str | None]:
        """The device's processes, each pid once (the largest known usage wins).

        Returns ``(None, error)`` when the compute list cannot be read, and
        ``(processes, error)`` when only the graphics or MPS list failed.
        GpuIsLost propagates.
        """
        nvml = self._nvml
        merged: dict[int, GPUProcess] = {}
        errors: list[str] = []
        for kind in PROCESS_LISTS:
            try:
                listed = self._list(kind, handle)
            except nvml.NVMLError_GpuIsLost:
                raise
            except nvml.NVMLError_NotSupported:
                if kind == "Compute":
                    return None, f"{kind} processes: NotSupported"
                continue
            except nvml.NVMLError as err:
                if kind == "Compute":
                    return None, f"{kind} processes: {describe(err)}"
                errors.append(f"{kind} processes: {describe(err)}")
                continue
            for raw in listed:
                _merge(merged, _process(raw))
        return list(merged.values()), ("; ".join(errors) or None)

    def _list(self, kind: str, handle: Any) -> list[Any]:
        name = f"nvmlDeviceGet{kind}RunningProcesses"
        if self._process_v3[kind]:
            try:
                return list(getattr(self._nvml, name)(handle))
            except self._nvml.NVMLLibraryMismatchError:
                # Driver older than the _v3 struct: use _v2 from now on.
                log.info("%s: no _v3 in the driver, falling back to _v2", name)
                self._process_v3[kind] = False
        return list(getattr(self._nvml, f"{name}_v2")(handle))


def _process(raw: Any) -> GPUProcess:
    used = getattr(raw, "usedGpuMemory", None)
    gi = getattr(raw, "gpuInstanceId", NO_INSTANCE)
    ci = getattr(raw, "computeInstanceId", NO_INSTANCE)
    # Positional: called once per process per sample, and keywords cost a third more.
    return GPUProcess(
        int(raw.pid),
        None if used is None else int(used),
        None if gi is None or gi == NO_INSTANCE else int(gi),
        None if ci is None or ci == NO_INSTANCE else int(ci),
    )


def _merge(merged: dict[int, GPUProcess], process: GPUProcess) -> None:
    """Count a pid once per device (it may be in the compute and the MPS list)."""
    seen = merged.get(process.pid)
    if seen is None or (
        process.used_bytes is not None and (seen.used_bytes is None or process.used_bytes > seen.used_bytes)
    ):
        merged[process.pid] = process
