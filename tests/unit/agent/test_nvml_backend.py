"""NVMLBackend over the fake pynvml: devices, MIG, memory v2, processes, and every
injected fault isolated to the device it hits."""

from __future__ import annotations

import pynvml
import pytest

from vramguard_agent.gpu import BackendUnavailable
from vramguard_agent.nvml import NVMLBackend, mig_profile_from_name
from vramguard_sim.fakenvml import FakeProcess

from .builders import GIB, MIB, gpu, mig_gpu, nvml


def by_uuid(sample):
    return {d.uuid: d for d in sample.devices}


def test_samples_devices_memory_and_processes():
    fake = nvml(gpu(0, (100, 2 * GIB), (101, GIB)), gpu(1))
    sample = NVMLBackend(fake).sample()
    assert sample.driver_version == "550.90.07"
    d0, d1 = sample.devices
    assert (d0.index, d0.model_name, d0.health, d0.virtualization_mode) == (
        0,
        "NVIDIA H100 80GB HBM3",
        "Healthy",
        "None",
    )
    assert d0.memory.total == 81559 * MIB and d0.memory.reserved == 579 * MIB and d0.memory.used == 3 * GIB
    assert d0.memory.usable == (81559 - 579) * MIB
    assert sorted((p.pid, p.used_bytes, p.gpu_instance_id) for p in d0.processes) == [
        (100, 2 * GIB, None),
        (101, GIB, None),
    ]
    assert d1.processes == [] and d1.process_error is None


def test_init_failure_is_backend_unavailable_and_retried():
    fake = nvml(gpu(0))
    fake.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    backend = NVMLBackend(fake)
    with pytest.raises(BackendUnavailable, match="LibraryNotFound"):
        backend.sample()
    fake.init_error = None
    assert len(backend.sample().devices) == 1


def test_driver_unloaded_mid_run_reinitialises_next_time():
    fake = nvml(gpu(0))
    backend = NVMLBackend(fake)
    backend.sample()
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(BackendUnavailable, match="DriverNotLoaded"):
        backend.sample()
    fake.init_error = None
    assert backend.sample().devices[0].health == "Healthy"
    assert fake.calls["nvmlInit"] == 2


def test_lost_gpu_is_reported_and_the_others_sampled():
    fake = nvml(gpu(0, (100, GIB)), gpu(1, (200, GIB)), gpu(2, (300, GIB)))
    backend = NVMLBackend(fake)
    backend.sample()
    fake.gpus[1].lost = True
    d0, d1, d2 = backend.sample().devices
    assert d1.health == "Lost" and "GpuIsLost" in d1.error and d1.processes is None
    # The UUID seen before the loss names the lost device.
    assert d1.uuid == fake.gpus[1].uuid
    assert [p.pid for p in d0.processes] == [100] and [p.pid for p in d2.processes] == [300]


def test_gpu_lost_before_first_sight_gets_a_placeholder_uuid():
    fake = nvml(gpu(0), gpu(1))
    fake.gpus[0].lost = True
    d0, d1 = NVMLBackend(fake).sample().devices
    assert d0.uuid == "GPU-unknown-index-0" and d0.health == "Lost" and d1.health == "Healthy"


def test_memory_error_on_one_device_is_isolated():
    fake = nvml(gpu(0), gpu(1, (5, GIB)))
    fake.gpus[0].memory_error = pynvml.NVML_ERROR_UNKNOWN
    d0, d1 = NVMLBackend(fake).sample().devices
    assert d0.health == "Error" and "Unknown" in d0.error
    assert d1.health == "Healthy" and d1.memory is not None


def test_not_available_memory_stays_unknown():
    fake = nvml(gpu(0, (100, GIB)))
    fake.gpus[0].not_available = True
    (d,) = NVMLBackend(fake).sample().devices
    assert d.processes[0].used_bytes is None


def test_v3_missing_falls_back_to_v2_once_and_remembers():
    fake = nvml(gpu(0, (100, GIB)))
    fake.no_v3 = True
    backend = NVMLBackend(fake)
    (d,) = backend.sample().devices
    assert [p.pid for p in d.processes] == [100]
    backend.sample()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2


def test_memory_v2_missing_falls_back_to_v1_without_reserved():
    fake = nvml(gpu(0, (100, GIB)))
    fake.no_memory_v2 = True
    (d,) = NVMLBackend(fake).sample().devices
    assert d.memory.reserved is None and d.memory.used == 579 * MIB + GIB
    assert d.memory.usable == d.memory.total


def test_pid_in_compute_and_mps_lists_counted_once():
    fake = nvml(gpu(0))
    fake.gpus[0].processes = [FakeProcess(7, GIB, kind="mps"), FakeProcess(8, GIB, kind="graphics")]
    (d,) = NVMLBackend(fake).sample().devices
    assert sorted(p.pid for p in d.processes) == [7, 8]


def test_mig_devices_are_listed_per_instance_without_parent_privileges():
    fake = nvml(mig_gpu([(200, GIB)], [(201, 2 * GIB)]), privileged=False)
    parent, m0, m1 = NVMLBackend(fake).sample().devices
    assert parent.mig_enabled and parent.processes == [] and parent.error is None
    assert (m0.parent_uuid, m0.mig_profile, m0.gpu_instance_id, m0.compute_instance_id) == (parent.uuid, "1g.5gb", 9, 0)
    assert m0.memory.total == 4864 * MIB
    assert [(p.pid, p.gpu_instance_id) for p in m0.processes] == [(200, 9)]
    assert [(p.pid, p.gpu_instance_id) for p in m1.processes] == [(201, 10)]
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in fake.calls


def test_mig_listing_unsupported_falls_back_to_privileged_parent_filtered_by_instance():
    fake = nvml(mig_gpu([(200, GIB)], [(201, 2 * GIB)]), privileged=True)
    for m in fake.gpus[0].mig_devices:
        m.listing_not_supported = True
    _, m0, m1 = NVMLBackend(fake).sample().devices
    assert [p.pid for p in m0.processes] == [200] and m0.process_error is None
    assert [p.pid for p in m1.processes] == [201]


def test_mig_listing_unsupported_and_parent_no_permission_degrades_that_instance_only():
    fake = nvml(mig_gpu([(200, GIB)], [(201, 2 * GIB)]), gpu(1, (300, GIB)), privileged=False)
    fake.gpus[0].mig_devices[0].listing_not_supported = True
    parent, m0, m1, other = NVMLBackend(fake).sample().devices
    assert m0.processes is None and "NoPermission" in m0.process_error and m0.health == "Healthy"
    assert [p.pid for p in m1.processes] == [201]
    assert [p.pid for p in other.processes] == [300]


def test_graphics_list_error_keeps_compute_processes_and_says_so():
    fake = nvml(gpu(0, (100, GIB)))

    def refuse(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    fake.nvmlDeviceGetGraphicsRunningProcesses = refuse
    (d,) = NVMLBackend(fake).sample().devices
    assert [p.pid for p in d.processes] == [100] and "Graphics" in d.process_error


def test_virtualization_mode_is_named():
    fake = nvml(gpu(0, virtualization_mode=2, name="NVIDIA A10"))
    (d,) = NVMLBackend(fake).sample().devices
    assert d.virtualization_mode == "VGPU"


def test_close_shuts_nvml_down():
    fake = nvml(gpu(0))
    backend = NVMLBackend(fake)
    backend.sample()
    backend.close()
    assert fake.calls["nvmlShutdown"] == 1
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("NVIDIA A10", None),
        (None, None),
    ],
)
def test_mig_profile_from_name(name, profile):
    assert mig_profile_from_name(name) == profile
