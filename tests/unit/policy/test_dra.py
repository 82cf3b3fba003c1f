"""DRA claims and ResourceSlices as per-device grants."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from vramguard_operator.policy.dra import DRAConfig, claim_grants, device_index, pod_claim_names
from vramguard_operator.policy.grants import EVENT_ALLOCATED_DEVICE_MISSING, EVENT_MALFORMED_ALLOCATION

from .builders import GI
from .dra_builders import claim, claim_pod, gpu, resource_slice, result

N = "gpu-h100-ts"
U0, U1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
MIG = "MIG-22222222-2222-2222-2222-222222222222"
SLICE = resource_slice(N, [gpu("gpu-0", U0), gpu("gpu-1", U1)])


def grants_of(pods: list[dict[str, Any]], claims: list[dict[str, Any]], slices: Sequence[dict[str, Any]] = (SLICE,), **kw: Any) -> Any:
    by_key = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
    return claim_grants(pods, by_key, slices, **kw)


def limits(out: Any, pod: str) -> dict[str, tuple[int, str]]:
    g = out.grants.get(f"uid-{pod}")
    return {} if g is None else {u: (lim.bytes, lim.source) for u, lim in g.by_device().items()}


def test_consumed_memory_is_the_limit_on_the_devices_uuid() -> None:
    out = grants_of([claim_pod("a", templates={"gpu": "a-gpu-x7k"})], [claim("a-gpu-x7k", [result("gpu-0", N, "20Gi")])])
    assert limits(out, "a") == {U0: (20 * GI, "dra/a-gpu-x7k")}
    assert out.devices["uid-a"] == {U0}
    g = out.grants["uid-a"]
    assert not g.problems and g.each_device() is None
    assert "20Gi consumed on gpu-0 (gpu.nvidia.com, pool gpu-h100-ts)" in g.by_device()[U0].detail


EXCLUSIVE = resource_slice(N, [gpu("gpu-0", U0, shared=False), gpu("gpu-1", U1, shared=False)])


@pytest.mark.parametrize(
    ("results", "slices"),
    [
        ([result("gpu-0", N)], [EXCLUSIVE]),  # a whole device: no consumed capacity
        ([result("gpu-0", N, "0")], [SLICE]),  # a share that books no memory (NVIDIA's "unlimited" mode)
    ],
)
def test_no_consumed_memory_sets_no_limit_but_the_device_is_held(results: list[dict[str, Any]], slices: list[dict[str, Any]]) -> None:
    out = grants_of([claim_pod("a", ["whole"])], [claim("whole", results)], slices)
    assert limits(out, "a") == {}
    assert "uid-a" not in out.grants
    assert out.devices["uid-a"] == {U0}


def test_a_shared_device_without_consumed_capacity_is_held_whole_and_said() -> None:
    # The API fills consumedCapacity (every capacity, zero included) for each
    # result on a device with allowMultipleAllocations: its absence is malformed.
    out = grants_of([claim_pod("a", ["odd"])], [claim("odd", [result("gpu-0", N)])])
    assert limits(out, "a") == {}
    assert out.devices["uid-a"] == {U0}
    (problem,) = out.grants["uid-a"].problems
    assert problem.reason == EVENT_MALFORMED_ALLOCATION
    assert "ResourceClaim ml/odd" in problem.message and "device gpu-0" in problem.message
    assert "no consumedCapacity.memory" in problem.message and "allows multiple allocations" in problem.message


def test_a_pod_with_two_claims_on_two_devices() -> None:
    claims = [claim("small", [result("gpu-0", N, "10Gi")]), claim("big", [result("gpu-1", N, "30Gi")])]
    out = grants_of([claim_pod("a", ["small", "big"])], claims)
    assert limits(out, "a") == {U0: (10 * GI, "dra/small"), U1: (30 * GI, "dra/big")}


def test_two_results_of_one_claim_on_one_device_add_up() -> None:
    c = claim("two", [result("gpu-0", N, "10Gi", request="a"), result("gpu-0", N, "6Gi", request="b")])
    assert limits(grants_of([claim_pod("a", ["two"])], [c]), "a") == {U0: (16 * GI, "dra/two")}


def test_shared_claim_is_a_total_over_its_pods() -> None:
    c = claim("shared", [result("gpu-0", N, "20Gi")], reserved_for=["a", "b"])
    out = grants_of([claim_pod("a", ["shared"]), claim_pod("b", ["shared"]), claim_pod("c", [])], [c])
    for p in ("a", "b"):
        assert limits(out, p) == {U0: (20 * GI, "dra/shared")}
        assert "shared by 2 consumers" in out.grants[f"uid-{p}"].by_device()[U0].detail
    (s,) = out.shared
    assert (s.name, s.uid, s.bytes, s.pod_uids, s.devices) == ("shared", "claim-uid-shared", 20 * GI, ("uid-a", "uid-b"), (U0,))


def test_a_claim_reserved_for_one_pod_is_not_shared() -> None:
    c = claim("own", [result("gpu-0", N, "20Gi")], reserved_for=["a"])
    assert grants_of([claim_pod("a", ["own"])], [c]).shared == ()


def test_mig_device_maps_to_its_mig_uuid() -> None:
    mig = gpu("gpu-0-mig-1g10gb-19-0", MIG, memory="9856Mi", parentUUID={"string": U0}, profile={"string": "1g.10gb"})
    slices = [resource_slice(N, [gpu("gpu-0", U0), mig])]
    out = grants_of([claim_pod("a", ["m"])], [claim("m", [result("gpu-0-mig-1g10gb-19-0", N, "5Gi")])], slices)
    assert limits(out, "a") == {MIG: (5 * GI, "dra/m")}


def test_vanished_device_is_reported_and_sets_no_limit() -> None:
    c = claim("gone", [result("gpu-7", N, "20Gi"), result("gpu-1", N, "8Gi", request="other")])
    out = grants_of([claim_pod("a", ["gone"])], [c])
    assert limits(out, "a") == {U1: (8 * GI, "dra/gone")}  # the device still published keeps its limit
    (p,) = out.grants["uid-a"].problems
    assert p.reason == EVENT_ALLOCATED_DEVICE_MISSING
    assert "ResourceClaim ml/gone" in p.message and "gpu-7" in p.message and "20Gi" in p.message


def test_a_pools_older_generation_does_not_count() -> None:
    old = resource_slice(N, [gpu("gpu-0", U0), gpu("gpu-9", "GPU-old")], generation=1)
    new = resource_slice(N, [gpu("gpu-0", U0)], generation=2)
    out = grants_of([claim_pod("a", ["c"])], [claim("c", [result("gpu-9", N, "1Gi")])], [old, new])
    assert limits(out, "a") == {}
    assert [p.reason for p in out.grants["uid-a"].problems] == [EVENT_ALLOCATED_DEVICE_MISSING]


def test_malformed_consumed_memory_drops_the_whole_claim() -> None:
    c = claim("bad", [result("gpu-1", N, "8Gi"), result("gpu-0", N, "lots")])
    out = grants_of([claim_pod("a", ["bad"])], [c])
    assert limits(out, "a") == {}
    (p,) = out.grants["uid-a"].problems
    assert p.reason == EVENT_MALFORMED_ALLOCATION and "consumedCapacity.memory='lots'" in p.message


def test_devices_without_the_uuid_attribute_are_not_gpus() -> None:
    nic = {"name": "eth-0", "attributes": {"ifName": {"string": "eth0"}}, "capacity": {"memory": {"value": "1Gi"}}}
    slices = [SLICE, resource_slice(N, [nic], driver="net.example.com")]
    c = claim("net", [result("eth-0", N, "1Gi", driver="net.example.com")])
    out = grants_of([claim_pod("a", ["net"])], [c], slices)
    assert "uid-a" not in out.grants and out.devices["uid-a"] == frozenset()


def test_uuid_attribute_qualified_by_driver_and_configurable() -> None:
    qualified = resource_slice(N, [gpu("gpu-0", None, **{"gpu.nvidia.com/uuid": {"string": U0}})])
    c = claim("q", [result("gpu-0", N, "4Gi")])
    assert limits(grants_of([claim_pod("a", ["q"])], [c], [qualified]), "a") == {U0: (4 * GI, "dra/q")}
    other = resource_slice(N, [gpu("gpu-0", None, gpuUUID={"string": U1})])
    assert limits(grants_of([claim_pod("a", ["q"])], [c], [other]), "a") == {}
    assert limits(grants_of([claim_pod("a", ["q"])], [c], [other], config=DRAConfig(uuid_attribute="gpuUUID")), "a") == {
        U1: (4 * GI, "dra/q")
    }


def test_unallocated_or_missing_claims_grant_nothing() -> None:
    out = grants_of([claim_pod("a", ["pending", "absent"])], [claim("pending", None)])
    assert out.grants == {} and out.devices["uid-a"] == frozenset()


def test_claims_are_namespaced() -> None:
    c = claim("c", [result("gpu-0", N, "4Gi")], ns="other")
    assert grants_of([claim_pod("a", ["c"])], [c]).grants == {}


def test_device_index_reads_memory_and_node() -> None:
    idx = device_index([SLICE])
    assert idx[("gpu.nvidia.com", N, "gpu-1")].uuid == U1
    assert idx[("gpu.nvidia.com", N, "gpu-1")].memory == 80 * GI
    assert idx[("gpu.nvidia.com", N, "gpu-1")].node == N


def test_pod_claim_names_direct_template_and_extended() -> None:
    p = claim_pod("a", ["direct"], templates={"gpu": "a-gpu-abc", "pending": ""})
    p["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "a-extended-res-xyz", "requestMappings": []}
    assert pod_claim_names(p) == ["direct", "a-gpu-abc", "a-extended-res-xyz"]
