"""Per-cgroup memory limits through NVML: the probe and every NVML answer it meets."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from vramguard_agent.nvml import NVMLBackend
from vramguard_agent.nvml_limits import REQUIRED, HeldLimits, LimitsError, NVMLMemoryLimits, driver_major
from vramguard_api import memlimits as ML
from vramguard_sim.fakenvml import FakeNVML

from .builders import GIB, gpu, mig_gpu, nvml

NS = "/sys/fs/cgroup/kubepods.slice/kubepods-pod1234.slice"
MAX = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


def setup(driver: str = "615.12.03", privileged: bool = True) -> tuple[FakeNVML, NVMLMemoryLimits, list[Any]]:
    fake = nvml(gpu(0, (100, GIB)), mig_gpu([(200, GIB)]), privileged=privileged)
    fake.driver_version = driver
    sample = NVMLBackend(fake).sample()
    limits = NVMLMemoryLimits(fake)
    limits.driver_version = sample.driver_version
    return fake, limits, sample.devices


def old_driver(fake: FakeNVML, limits: NVMLMemoryLimits, version: str) -> None:
    fake.driver_version = limits.driver_version = version


class OldLibrary:
    """pynvml as nvidia-ml-py < 13.615 ships it: no memory-limit functions or structs."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if name in REQUIRED:
            raise AttributeError(name)
        return getattr(self._module, name)


def test_probe_supported_reads_and_changes_nothing():
    fake, limits, devices = setup()
    fake.memory_limits = {devices[0].uuid: {NS: (GIB, 20 * GIB)}}
    support = limits.probe(devices[0], NS, cgroup_v2=True)
    assert (support.supported, support.reason) == (True, ML.REASON_PROBE_SUCCEEDED) and NS in support.message
    assert fake.calls.get("nvmlDeviceSetMemoryLimits_v1", 0) == 0
    assert fake.memory_limits == {devices[0].uuid: {NS: (GIB, 20 * GIB)}}


@pytest.mark.parametrize(
    ("arrange", "reason", "words"),
    [
        (lambda f, lim: setattr(lim, "_nvml", OldLibrary(f)), ML.REASON_LIBRARY_TOO_OLD, "13.615"),
        (lambda f, lim: old_driver(f, lim, "550.90.07"), ML.REASON_DRIVER_TOO_OLD, "550.90.07 is older than r615"),
        (lambda f, lim: setattr(lim, "driver_version", None), None, "FunctionNotFound"),
        (lambda f, lim: setattr(f.gpus[0], "memory_limits_error", pynvml.NVML_ERROR_NOT_SUPPORTED),
         ML.REASON_NOT_SUPPORTED, "NotSupported"),
        (lambda f, lim: setattr(f.gpus[0], "memory_limits_error", pynvml.NVML_ERROR_NO_PERMISSION),
         ML.REASON_NO_PERMISSION, "needs root"),
        (lambda f, lim: setattr(f, "cgroups", set()), ML.REASON_PROBE_FAILED, "NotFound"),
        (lambda f, lim: setattr(f.gpus[0], "memory_limits_error", pynvml.NVML_ERROR_UNKNOWN),
         ML.REASON_PROBE_FAILED, "Unknown"),
        (lambda f, lim: setattr(f.gpus[0], "lost", True), ML.REASON_PROBE_FAILED, "GpuIsLost"),
        (lambda f, lim: setattr(f, "init_error", pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
         ML.REASON_PROBE_FAILED, "DriverNotLoaded"),
    ],
)  # fmt: skip
def test_probe_reports_each_nvml_answer_as_unsupported_with_its_reason(arrange, reason, words):
    fake, limits, devices = setup()
    arrange(fake, limits)
    if reason is None:  # FunctionNotFound from a driver whose version is unknown
        fake.driver_version, reason = "550.90.07", ML.REASON_FUNCTION_NOT_FOUND
    support = limits.probe(devices[0], NS, cgroup_v2=True)
    assert (support.supported, support.reason) == (False, reason)
    assert words in support.message


def test_probe_rules_out_mig_and_cgroup_v1_without_asking_nvml():
    fake, limits, devices = setup()
    parent, mig = devices[1], devices[2]
    assert parent.mig_enabled and mig.parent_uuid == parent.uuid
    assert limits.probe(parent, NS, cgroup_v2=True).reason == ML.REASON_MIG_ENABLED
    assert limits.probe(mig, NS, cgroup_v2=True).reason == ML.REASON_MIG_DEVICE
    assert limits.probe(devices[0], NS, cgroup_v2=False).reason == ML.REASON_CGROUP_V2_REQUIRED
    assert fake.calls.get("nvmlDeviceGetMemoryLimits_v1", 0) == 0


def test_set_get_clear():
    fake, limits, devices = setup()
    limits.set(0, NS, GIB, 20 * GIB)
    assert limits.get(0, NS) == HeldLimits(GIB, 20 * GIB, 0)
    limits.clear(0, NS)
    held = limits.get(0, NS)
    assert held.is_clear and (held.soft, held.hard) == (0, MAX)


def test_held_limits_compare_with_wanted():
    held = HeldLimits(0, 20 * GIB)
    assert held.holds(ML.DeviceMemoryLimit(hard_limit=20 * GIB))
    assert not held.holds(ML.DeviceMemoryLimit(hard_limit=20 * GIB, soft_limit=GIB))
    assert HeldLimits(GIB, MAX).holds(ML.DeviceMemoryLimit(soft_limit=GIB))


@pytest.mark.parametrize(
    ("arrange", "reason", "device_wide"),
    [
        (lambda f, lim: setattr(f, "privileged", False), ML.REASON_NO_PERMISSION, True),
        (lambda f, lim: old_driver(f, lim, "535.54.03"), ML.REASON_DRIVER_TOO_OLD, True),
        (lambda f, lim: setattr(f.gpus[0], "memory_limits_error", pynvml.NVML_ERROR_NOT_SUPPORTED),
         ML.REASON_NOT_SUPPORTED, True),
        (lambda f, lim: setattr(lim, "_nvml", OldLibrary(f)), ML.REASON_LIBRARY_TOO_OLD, True),
        (lambda f, lim: setattr(f, "cgroups", set()), ML.REASON_PROBE_FAILED, False),
        (lambda f, lim: setattr(f.gpus[0], "lost", True), ML.REASON_PROBE_FAILED, False),
    ],
)  # fmt: skip
def test_set_errors_are_limits_errors(arrange, reason, device_wide):
    fake, limits, _ = setup()
    arrange(fake, limits)
    with pytest.raises(LimitsError) as err:
        limits.set(0, NS, 0, 20 * GIB)
    assert (err.value.reason, err.value.device_wide) == (reason, device_wide)
    assert "nvmlDeviceSetMemoryLimits_v1" in err.value.message


def test_set_with_soft_above_hard_is_an_invalid_argument_of_this_call_only():
    _, limits, _ = setup()
    with pytest.raises(LimitsError) as err:
        limits.set(0, NS, 2 * GIB, GIB)
    assert not err.value.device_wide and "InvalidArgument" in err.value.message


@pytest.mark.parametrize(("version", "major"), [("615.12.03", 615), ("550.90.07", 550), (None, None), ("r615", None)])
def test_driver_major(version, major):
    assert driver_major(version) == major
