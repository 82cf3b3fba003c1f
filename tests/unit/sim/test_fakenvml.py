"""The fake pynvml behaves like nvidia-ml-py 13.x (checked against the installed module)."""

from __future__ import annotations

import pynvml
import pytest

from tests.unit.agent.builders import GIB, MIB, gpu, mig_gpu, nvml
from vramguard_sim.fakenvml import NO_INSTANCE, FakeNVML, FakeProcess


@pytest.fixture
def fake() -> FakeNVML:
    f = nvml(gpu(0, (100, 2 * GIB)), mig_gpu([(200, GIB)], []))
    f.nvmlInit()
    return f


def test_errors_are_the_real_modules_classes(fake):
    assert fake.NVMLError is pynvml.NVMLError
    assert fake.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert issubclass(fake.NVMLError_NoPermission, pynvml.NVMLError)
    # The v3 -> v2 fallback depends on this: the mismatch error is not an NVMLError.
    assert not issubclass(fake.NVMLLibraryMismatchError, pynvml.NVMLError)
    err = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(err) is pynvml.NVMLError_NotSupported and err.value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_calls_before_init_raise_uninitialized():
    f = nvml(gpu(0))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        f.nvmlDeviceGetCount()


def test_init_error_is_raised_by_init():
    f = nvml(gpu(0))
    f.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        f.nvmlInit()


def test_memory_v1_used_includes_reserved_and_v2_excludes_it(fake):
    h = fake.nvmlDeviceGetHandleByIndex(0)
    v1 = fake.nvmlDeviceGetMemoryInfo(h)
    v2 = fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert isinstance(v1, pynvml.c_nvmlMemory_t) and isinstance(v2, pynvml.c_nvmlMemory_v2_t)
    assert v1.used == 579 * MIB + 2 * GIB and v1.total == v1.used + v1.free
    assert v2.reserved == 579 * MIB and v2.used == 2 * GIB and v2.version == pynvml.nvmlMemory_v2


def test_processes_carry_no_instance_ids_without_mig(fake):
    h = fake.nvmlDeviceGetHandleByIndex(0)
    (p,) = fake.nvmlDeviceGetComputeRunningProcesses(h)
    assert (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) == (100, 2 * GIB, NO_INSTANCE, NO_INSTANCE)
    assert fake.nvmlDeviceGetGraphicsRunningProcesses(h) == []


def test_not_available_is_none(fake):
    fake.gpus[0].not_available = True
    (p,) = fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(0))
    assert p.usedGpuMemory is None


def test_missing_v3_raises_library_mismatch_and_v2_works(fake):
    fake.no_v3 = True
    h = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        fake.nvmlDeviceGetComputeRunningProcesses(h)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        fake.nvmlDeviceGetComputeRunningProcesses_v3(h)
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [100]


def test_mps_clients_are_in_both_compute_and_mps_lists():
    f = nvml(gpu(0))
    f.gpus[0].processes = [FakeProcess(7, GIB, kind="mps")]
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in f.nvmlDeviceGetComputeRunningProcesses(h)] == [7]
    assert [p.pid for p in f.nvmlDeviceGetMPSComputeRunningProcesses(h)] == [7]


def test_mig_parent_listing_needs_privileges(fake):
    parent = fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetMigMode(parent) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceGetComputeRunningProcesses(parent)
    fake.privileged = True
    (p,) = fake.nvmlDeviceGetComputeRunningProcesses(parent)
    assert (p.pid, p.gpuInstanceId, p.computeInstanceId) == (200, 9, 0)


def test_mig_handles_and_empty_slots(fake):
    parent = fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert fake.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert fake.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert fake.nvmlDeviceGetGpuInstanceId(mig) == 9
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 5)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)


def test_mig_mode_not_supported_on_gpus_without_mig(fake):
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigMode(fake.nvmlDeviceGetHandleByIndex(0))


def test_lost_gpu_raises_from_every_call_including_the_handle(fake):
    h = fake.nvmlDeviceGetHandleByIndex(0)
    fake.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetMemoryInfo(h)
    # Other GPUs still answer.
    assert fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(1)).startswith("GPU-")


def test_driver_bug_hides_processes_but_memory_stays_used(fake):
    fake.gpus[0].hide_processes = True
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert fake.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used == 2 * GIB
