"""The NVIDIA DRA driver's MPS pinned device memory limits (a claim's
``GpuConfig``/``MigDeviceConfig`` with ``sharing.strategy: MPS``) as per-device
limits with the source ``dra/<claim>``.

The configs are the driver's published examples: kubernetes-sigs/dra-driver-nvidia-gpu
(formerly NVIDIA/k8s-dra-driver-gpu) site/content/docs/reference/api.md,
"GpuConfig ... With MPS" (``defaultPinnedDeviceMemoryLimit: "4Gi"``,
``defaultPerDevicePinnedMemoryLimit: {"0": "2Gi"}``) and its "MPS on a MIG
slice" (``MigDeviceConfig``, ``defaultPinnedDeviceMemoryLimit: 5Gi``); the
claims' ``status.allocation`` is what the scheduler writes (the class's and
claim's configs copied into ``status.allocation.devices.config``)."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard_operator.policy.dra import claim_grants
from vramguard_operator.policy.grants import EVENT_MALFORMED_ALLOCATION

from .builders import GI, MI
from .dra_builders import claim, claim_pod, gpu, resource_slice, result

N = "gpu-h100-ts"
U0, U1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
MIG = "MIG-22222222-2222-2222-2222-222222222222"
SLICE = resource_slice(
    N,
    [
        gpu("gpu-0", U0, shared=False),
        gpu("gpu-1", U1, shared=False),
        gpu("gpu-0-mig-9-0-4", MIG, memory="19968Mi", shared=False, type={"string": "mig"}),
    ],
)


def mps(kind: str = "GpuConfig", requests: list[str] | None = None, source: str = "FromClaim", **mps_config: Any) -> dict[str, Any]:
    return {
        "source": source,
        "requests": requests if requests is not None else ["gpu"],
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": kind,
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, **mps_config}},
            },
        },
    }


def with_config(c: dict[str, Any], *configs: dict[str, Any], where: str = "status") -> dict[str, Any]:
    if where == "status":
        c["status"]["allocation"]["devices"]["config"] = list(configs)
    else:
        c["spec"]["devices"]["config"] = list(configs)
    return c


def limits(c: dict[str, Any], pods: tuple[str, ...] = ("a",)) -> dict[str, dict[str, tuple[int, str]]]:
    out = claim_grants([claim_pod(p, [c["metadata"]["name"]]) for p in pods], {("ml", c["metadata"]["name"]): c}, [SLICE])
    found = {}
    for p in pods:
        g = out.grants.get(f"uid-{p}")
        found[p] = {} if g is None else {u: (lim.bytes, lim.source) for u, lim in g.by_device().items()}
    return found


@pytest.mark.parametrize("where", ["status", "spec"])
def test_the_default_pinned_limit_is_the_limit_on_each_device(where: str) -> None:
    c = with_config(claim("mps", [result("gpu-0", N), result("gpu-1", N)]), mps(defaultPinnedDeviceMemoryLimit="4Gi"), where=where)
    assert limits(c)["a"] == {U0: (4 * GI, "dra/mps"), U1: (4 * GI, "dra/mps")}


def test_a_per_device_limit_by_index_or_uuid_overrides_the_default() -> None:
    by_index = mps(defaultPinnedDeviceMemoryLimit="4Gi", defaultPerDevicePinnedMemoryLimit={"0": "2Gi"})
    c = with_config(claim("mps", [result("gpu-0", N), result("gpu-1", N)]), by_index)
    assert limits(c)["a"] == {U0: (2 * GI, "dra/mps"), U1: (4 * GI, "dra/mps")}
    by_uuid = mps(defaultPerDevicePinnedMemoryLimit={U1: "3Gi"})
    c = with_config(claim("mps", [result("gpu-0", N), result("gpu-1", N)]), by_uuid)
    assert limits(c)["a"] == {U1: (3 * GI, "dra/mps")}


def test_the_detail_names_the_config_and_the_field() -> None:
    c = with_config(claim("mps", [result("gpu-0", N)]), mps(defaultPinnedDeviceMemoryLimit="4Gi"))
    out = claim_grants([claim_pod("a", ["mps"])], {("ml", "mps"): c}, [SLICE])
    detail = out.grants["uid-a"].by_device()[U0].detail
    assert "MPS pinned limit 4Gi" in detail and "devices.config[0] (GpuConfig) sharing.mpsConfig.defaultPinnedDeviceMemoryLimit" in detail


def test_each_pod_of_a_shared_claim_is_one_mps_client_with_the_whole_limit() -> None:
    c = with_config(claim("mps", [result("gpu-0", N)], reserved_for=("a", "b")), mps(defaultPinnedDeviceMemoryLimit="4Gi"))
    assert limits(c, ("a", "b")) == {"a": {U0: (4 * GI, "dra/mps")}, "b": {U0: (4 * GI, "dra/mps")}}
    out = claim_grants([claim_pod(p, ["mps"]) for p in ("a", "b")], {("ml", "mps"): c}, [SLICE])
    assert out.shared == ()  # no sum: MPS caps each client, not the claim


def test_a_mig_device_config_applies_to_the_mig_device() -> None:
    c = with_config(claim("mig", [result("gpu-0-mig-9-0-4", N, request="mig")]), mps("MigDeviceConfig", ["mig"], defaultPinnedDeviceMemoryLimit="5Gi"))
    assert limits(c)["a"] == {MIG: (5 * GI, "dra/mig")}


def test_the_driver_s_precedence_the_last_naming_the_request_else_the_last_default_of_the_device_s_kind() -> None:
    configs = [
        mps(requests=[], source="FromClass", defaultPinnedDeviceMemoryLimit="8Gi"),
        mps(requests=["gpu"], defaultPinnedDeviceMemoryLimit="6Gi"),
        mps(requests=["other"], defaultPinnedDeviceMemoryLimit="1Gi"),
        mps("MigDeviceConfig", requests=[], defaultPinnedDeviceMemoryLimit="2Gi"),
    ]
    c = with_config(claim("mps", [result("gpu-0", N), result("gpu-1", N, request="spare")]), *configs)
    # gpu-0's request is named (6Gi); gpu-1's is not: the last default for a GPU (8Gi; the MIG one is not its kind)
    assert limits(c)["a"] == {U0: (6 * GI, "dra/mps"), U1: (8 * GI, "dra/mps")}


def test_a_limit_is_whole_mib_rounded_down_and_the_smaller_of_it_and_consumed_memory() -> None:
    c = with_config(claim("mps", [result("gpu-0", N)]), mps(defaultPinnedDeviceMemoryLimit="1500000000"))
    assert limits(c)["a"] == {U0: (1430 * MI, "dra/mps")}
    shared_slice = resource_slice(N, [gpu("gpu-0", U0)])
    c = with_config(claim("mps", [result("gpu-0", N, "2Gi")]), mps(defaultPinnedDeviceMemoryLimit="4Gi"))
    out = claim_grants([claim_pod("a", ["mps"])], {("ml", "mps"): c}, [shared_slice])
    assert out.grants["uid-a"].by_device()[U0].bytes == 2 * GI


def test_time_slicing_and_other_drivers_set_no_limit() -> None:
    ts = mps(defaultPinnedDeviceMemoryLimit="4Gi")
    ts["opaque"]["parameters"]["sharing"] = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    other = mps(defaultPinnedDeviceMemoryLimit="4Gi")
    other["opaque"]["driver"] = "gpu.example.com"
    for config in (ts, other):
        c = with_config(claim("c", [result("gpu-0", N)]), config)
        assert limits(c)["a"] == {}


@pytest.mark.parametrize(
    ("mps_config", "field", "value"),
    [
        ({"defaultPinnedDeviceMemoryLimit": "lots"}, "defaultPinnedDeviceMemoryLimit", "lots"),
        ({"defaultPinnedDeviceMemoryLimit": "512Ki"}, "defaultPinnedDeviceMemoryLimit", "512Ki"),
        ({"defaultPerDevicePinnedMemoryLimit": {"7": "2Gi"}}, "defaultPerDevicePinnedMemoryLimit[7]", "2Gi"),
        ({"defaultPerDevicePinnedMemoryLimit": {"GPU-nope": "2Gi"}}, "defaultPerDevicePinnedMemoryLimit[GPU-nope]", "2Gi"),
        ({"defaultPinnedDeviceMemoryLimit": "4Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "-1Gi"}}, "defaultPerDevicePinnedMemoryLimit[0]", "-1Gi"),
    ],
)
def test_a_config_that_cannot_be_read_is_a_warning_and_sets_none_of_its_limits(mps_config: dict[str, Any], field: str, value: str) -> None:
    c = with_config(claim("bad", [result("gpu-0", N), result("gpu-1", N)]), mps(**mps_config))
    out = claim_grants([claim_pod("a", ["bad"])], {("ml", "bad"): c}, [SLICE])
    g = out.grants["uid-a"]
    assert g.by_device() == {}
    (problem,) = g.problems
    assert problem.reason == EVENT_MALFORMED_ALLOCATION
    assert "ResourceClaim ml/bad" in problem.message and field in problem.message and repr(value) in problem.message
    assert "wanted" in problem.message
