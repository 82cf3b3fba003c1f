"""The fake pynvml's per-cgroup memory limits behave like nvidia-ml-py 13.615's binding."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from tests.unit.agent.builders import GIB, gpu, mig_gpu, nvml
from vramguard_sim.fakenvml import FakeNVML, FakeProcess

NS = "/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice"
MAX = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


@pytest.fixture
def fake() -> FakeNVML:
    f = nvml(gpu(0, (100, 3 * GIB)), mig_gpu([(200, GIB)]), privileged=True)
    f.driver_version = "615.12.03"
    f.nvmlInit()
    return f


def set_limits(f: FakeNVML, index: int, namespace: str | None, soft: int, hard: int) -> None:
    limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
    limits.nameSpace, limits.softLimit, limits.hardLimit = namespace, soft, hard
    assert f.nvmlDeviceSetMemoryLimits_v1(f.nvmlDeviceGetHandleByIndex(index), limits) is None


def get_limits(f: FakeNVML, index: int, namespace: str) -> pynvml.c_nvmlGetMemoryLimits_v1_t:
    limits = pynvml.c_nvmlGetMemoryLimits_v1_t()
    limits.nameSpace = namespace
    assert f.nvmlDeviceGetMemoryLimits_v1(f.nvmlDeviceGetHandleByIndex(index), limits) is None
    return limits


@pytest.mark.parametrize("name", ["nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"])
def test_signatures_are_the_real_bindings(fake, name):
    assert list(inspect.signature(getattr(fake, name)).parameters) == list(
        inspect.signature(getattr(pynvml, name)).parameters
    )


def test_structs_and_sentinel_are_the_real_modules(fake):
    assert fake.c_nvmlSetMemoryLimits_v1_t is pynvml.c_nvmlSetMemoryLimits_v1_t
    assert fake.c_nvmlGetMemoryLimits_v1_t is pynvml.c_nvmlGetMemoryLimits_v1_t
    assert fake.NVML_DEVICE_MEMORY_LIMIT_MAX == MAX == 0xFFFFFFFFFFFFFFFF


def test_unset_cgroup_reads_no_limits(fake):
    got = get_limits(fake, 0, NS)
    assert (got.nameSpace, got.softLimit, got.hardLimit, got.currentUsed) == (NS, 0, MAX, 0)


def test_set_then_get_and_clear(fake):
    set_limits(fake, 0, NS, GIB, 20 * GIB)
    got = get_limits(fake, 0, NS)
    assert (got.softLimit, got.hardLimit) == (GIB, 20 * GIB)
    assert (get_limits(fake, 0, NS + "/other").hardLimit) == MAX  # per cgroup
    set_limits(fake, 0, NS, 0, MAX)
    assert (get_limits(fake, 0, NS).softLimit, get_limits(fake, 0, NS).hardLimit) == (0, MAX)
    assert fake.memory_limits[fake.gpus[0].uuid] == {}


def test_limits_outlive_the_device_objects(fake):
    """The simulated backend replaces ``gpus`` every sample; the driver's state stays."""
    set_limits(fake, 0, NS, 0, 20 * GIB)
    fake.gpus = [gpu(0), fake.gpus[1]]
    assert get_limits(fake, 0, NS).hardLimit == 20 * GIB


def test_current_used_counts_the_cgroup_and_below(fake):
    fake.gpus[0].processes.append(FakeProcess(101, GIB))
    fake.pid_cgroups = {100: NS + "/cri-containerd-aa.scope", 101: "/sys/fs/cgroup/elsewhere"}
    assert get_limits(fake, 0, NS).currentUsed == 3 * GIB


def test_removing_the_cgroup_clears_its_limits(fake):
    set_limits(fake, 0, NS, 0, 20 * GIB)
    set_limits(fake, 0, NS + "/child", 0, 10 * GIB)
    fake.remove_cgroup(NS)
    assert get_limits(fake, 0, NS).hardLimit == MAX and get_limits(fake, 0, NS + "/child").hardLimit == MAX


@pytest.mark.parametrize("call", [set_limits, get_limits])
def test_driver_older_than_r615_has_no_such_function(fake, call):
    fake.driver_version = "550.90.07"
    args = (fake, 0, NS, 0, GIB) if call is set_limits else (fake, 0, NS)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound) as err:
        call(*args)
    assert err.value.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND


def test_before_init_is_uninitialized():
    f = nvml(gpu(0))
    f.driver_version = "615.12.03"
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        f.nvmlDeviceGetMemoryLimits_v1(None, pynvml.c_nvmlGetMemoryLimits_v1_t())


def test_mig_handles_and_mig_enabled_gpus_are_not_supported(fake):
    parent = fake.nvmlDeviceGetHandleByIndex(1)
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    for handle in (parent, mig):
        limits = pynvml.c_nvmlGetMemoryLimits_v1_t()
        limits.nameSpace = NS
        with pytest.raises(pynvml.NVMLError_NotSupported):
            fake.nvmlDeviceGetMemoryLimits_v1(handle, limits)


def test_set_without_root_is_no_permission_and_get_is_allowed(fake):
    fake.privileged = False
    with pytest.raises(pynvml.NVMLError_NoPermission):
        set_limits(fake, 0, NS, 0, GIB)
    assert get_limits(fake, 0, NS).hardLimit == MAX


def test_a_device_that_says_not_supported(fake):
    fake.gpus[0].memory_limits_error = pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        get_limits(fake, 0, NS)


@pytest.mark.parametrize(("namespace", "soft", "hard"), [(None, 0, GIB), ("", 0, GIB), (NS, 2 * GIB, GIB)])
def test_invalid_arguments(fake, namespace, soft, hard):
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        set_limits(fake, 0, namespace, soft, hard)


def test_unknown_cgroup_is_not_found_when_cgroups_are_known(fake):
    fake.cgroups = {NS}
    with pytest.raises(pynvml.NVMLError_NotFound):
        get_limits(fake, 0, NS + "-gone")
    assert get_limits(fake, 0, NS).hardLimit == MAX


def test_a_lost_gpu(fake):
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetMemoryLimits_v1(handle, pynvml.c_nvmlGetMemoryLimits_v1_t())


def test_limits_must_be_a_ctypes_struct_as_for_byref(fake):
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(TypeError):
        fake.nvmlDeviceGetMemoryLimits_v1(handle, {"nameSpace": NS})


def test_a_hard_limit_below_use_is_refused_like_dmem(fake):
    fake.refuse_max_below_usage = True
    fake.pid_cgroups = {100: NS}  # 3 GiB in the cgroup
    set_limits(fake, 0, NS, 0, 20 * GIB)
    set_limits(fake, 0, NS, GIB, 2 * GIB)  # below use: the old hard limit stays, the soft one is set
    got = get_limits(fake, 0, NS)
    assert (got.softLimit, got.hardLimit, got.currentUsed) == (GIB, 20 * GIB, 3 * GIB)


def test_calls_are_counted(fake):
    get_limits(fake, 0, NS)
    set_limits(fake, 0, NS, 0, GIB)
    assert fake.calls["nvmlDeviceGetMemoryLimits_v1"] == 1 and fake.calls["nvmlDeviceSetMemoryLimits_v1"] == 1
