"""GPU utilisation: the fake answers as nvidia-ml-py and the driver do, and the
agent turns it into device, process and pod figures."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from vramguard_agent.cgroups import NotInPod, parse_cgroup_path
from vramguard_agent.gpu import DeviceSample, GPUProcess, GPUSample
from vramguard_agent.metrics import AgentMetrics, Snapshot
from vramguard_agent.nvml import NVMLBackend
from vramguard_agent.utilization import mean_sm_util, pod_sm_utilization
from vramguard_api.usage import DeviceUsage, GPUDevice, NodeGPUUsageStatus, PodUsage

from .builders import GIB, gpu, mig_gpu, nvml


def busy_gpu():
    g = gpu(0, (100, GIB), (200, GIB), utilization_gpu=87, utilization_memory=41)
    g.processes[0].sm_util, g.processes[0].mem_util = 60, 30
    g.processes[1].sm_util = 25
    return g


def test_the_fake_returns_nvidia_ml_pys_own_structs():
    fake = nvml(busy_gpu())
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    rates = fake.nvmlDeviceGetUtilizationRates(handle)
    assert isinstance(rates, pynvml.c_nvmlUtilization_t) and (rates.gpu, rates.memory) == (87, 41)
    samples = fake.nvmlDeviceGetProcessUtilization(handle, 0)
    assert all(isinstance(s, pynvml.c_nvmlProcessUtilizationSample_t) for s in samples)
    assert [(s.pid, s.smUtil, s.memUtil, s.timeStamp) for s in samples] == [
        (100, 60, 30, fake.time_us),
        (200, 25, 0, fake.time_us),
    ]


def test_no_sample_newer_than_the_timestamp_is_not_found_as_the_driver_says():
    fake = nvml(busy_gpu(), gpu(1))
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(handle, fake.time_us)
    with pytest.raises(pynvml.NVMLError_NotFound):  # no process at all
        fake.nvmlDeviceGetProcessUtilization(fake.nvmlDeviceGetHandleByIndex(1), 0)


@pytest.mark.parametrize("kind", ["mig-parent", "mig-device", "vgpu-guest"])
def test_mig_and_vgpu_guests_are_not_supported(kind):
    if kind == "vgpu-guest":
        fake = nvml(gpu(0, (1, GIB), virtualization_mode=pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU))
    else:
        fake = nvml(mig_gpu([(1, GIB)]))
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    if kind == "mig-device":
        handle = fake.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    for call in (fake.nvmlDeviceGetUtilizationRates, lambda h: fake.nvmlDeviceGetProcessUtilization(h, 0)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(handle)


def test_mean_sm_util_takes_only_newer_samples_and_averages_per_pid():
    s = [SimpleNamespace(pid=1, timeStamp=t, smUtil=u) for t, u in [(10, 99), (20, 40), (30, 60)]]
    s.append(SimpleNamespace(pid=2, timeStamp=25, smUtil=5))
    assert mean_sm_util(s, 10) == ({1: 50, 2: 5}, 30)
    assert mean_sm_util([], 7) == ({}, 7)


def test_the_backend_reads_since_the_last_timestamp_and_treats_not_found_as_idle():
    fake = nvml(busy_gpu(), mig_gpu([(5, GIB)]))
    backend = NVMLBackend(fake)
    first = backend.sample().devices
    assert (first[0].utilization_gpu, first[0].utilization_memory) == (87, 41)
    assert first[0].process_utilization == {100: 60, 200: 25}
    assert first[1].utilization_gpu is None and first[1].process_utilization is None  # MIG: NotSupported
    second = backend.sample().devices[0]  # no newer sample: NOT_FOUND, nobody computed
    assert second.process_utilization == {}
    fake.time_us += 1_000_000
    fake.gpus[0].processes[1].sm_util = 70
    assert backend.sample().devices[0].process_utilization == {100: 60, 200: 70}


UID = "7fda01c4-0ece-403d-88b4-c371d66d132a"


def test_a_pods_utilisation_is_the_sum_of_its_processes_capped_at_100():
    owner = parse_cgroup_path(f"/kubepods/burstable/pod{UID}")
    assert owner is not None
    device = DeviceSample(
        uuid="GPU-a",
        index=0,
        processes=[GPUProcess(1, GIB), GPUProcess(2, GIB), GPUProcess(3, GIB), GPUProcess(4, GIB)],
        process_utilization={1: 70, 2: 50, 3: 10},
    )
    unknown = DeviceSample(uuid="GPU-b", index=1, processes=[GPUProcess(5, GIB)], process_utilization=None)
    attributions = {1: owner, 2: owner, 3: NotInPod("host"), 4: owner, 5: owner}
    assert pod_sm_utilization(GPUSample([device, unknown]), attributions) == {UID: {"GPU-a": 100}}
    idle = DeviceSample(uuid="GPU-c", index=2, processes=[GPUProcess(4, GIB)], process_utilization={})
    assert pod_sm_utilization(GPUSample([idle]), {4: owner}) == {UID: {"GPU-c": 0}}


def test_metrics_carry_dcgm_exporters_labels():
    status = NodeGPUUsageStatus(
        sampleTime=datetime(2026, 1, 1, tzinfo=UTC),
        devices=[GPUDevice(uuid="GPU-a", index=0, gpuUtilizationPercent=87, memoryUtilizationPercent=41)],
        pods=[
            PodUsage(
                uid="u", namespace="ml", name="train", devices=[DeviceUsage(uuid="GPU-a", smUtilizationPercent=60)]
            )
        ],
    )
    metrics = AgentMetrics("node-a")
    metrics.update(Snapshot("node-a", status))
    found = {
        (s.name, s.labels.get("pod")): (s.value, s.labels["UUID"])
        for f in text_string_to_metric_families(metrics.exposition().decode())
        for s in f.samples
        if "utilization" in s.name
    }
    assert found == {
        ("vramguard_gpu_utilization_percent", None): (87, "GPU-a"),
        ("vramguard_gpu_memory_copy_utilization_percent", None): (41, "GPU-a"),
        ("vramguard_pod_gpu_sm_utilization_percent", "train"): (60, "GPU-a"),
    }


def test_a_utilisation_error_leaves_the_figures_unknown_and_the_memory_read():
    fake = nvml(busy_gpu())
    backend = NVMLBackend(fake)

    def broken(handle, timeStamp):  # noqa: N803 - pynvml's name
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    fake.nvmlDeviceGetProcessUtilization = broken  # type: ignore[method-assign]
    (device,) = backend.sample().devices
    assert device.health == "Healthy" and device.memory is not None and device.processes
    assert device.process_utilization is None
