"""A MIG device allocated through DRA has its own memory as its limit, read
from its ResourceSlice (the ``memory`` capacity, else the size in the
``profile`` attribute's name), never its parent GPU's: the NVIDIA DRA driver
publishes each MIG device with ``type: mig``, its MIG ``uuid``, ``profile``
and ``memory`` capacity (kubernetes-sigs/dra-driver-nvidia-gpu
cmd/gpu-kubelet-plugin/mig.go, deviceinfo.go)."""

from __future__ import annotations

from typing import Any

from vramguard_operator.policy.dra import claim_grants
from vramguard_operator.policy.implicit import implicit_budget
from vramguard_operator.policy.merge import merge

from .builders import MI, device, node, policy
from .dra_builders import claim, claim_pod, gpu, resource_slice, result

N = "gpu-h100-ts"
PARENT = "GPU-00000000-0000-0000-0000-000000000000"
MIG = "MIG-22222222-2222-2222-2222-222222222222"
FACTS = node(N, [device(PARENT, 97871, 529)])
SHARE_FROM_NODE = merge([policy("cluster-default", defaults={})], "ml", {})


def mig(memory: str | None = "19968Mi", profile: str = "3g.20gb") -> dict[str, Any]:
    return gpu("gpu-0-mig-9-4-4", MIG, memory=memory, shared=False, type={"string": "mig"}, profile={"string": profile})


def grants(slice_devices: list[dict[str, Any]], pod: str = "a") -> Any:
    c = claim("mig", [result("gpu-0-mig-9-4-4", N, request="mig")])
    out = claim_grants([claim_pod(pod, ["mig"])], {("ml", "mig"): c}, [resource_slice(N, slice_devices)])
    return out.grants.get(f"uid-{pod}")


def test_a_whole_mig_device_s_limit_is_its_own_memory_from_the_slice() -> None:
    g = grants([gpu("gpu-0", PARENT, memory="97871Mi", shared=False), mig()])
    limit = g.by_device()[MIG]
    assert (limit.bytes, limit.source) == (19968 * MI, "dra/mig")
    assert "whole MIG device gpu-0-mig-9-4-4" in limit.detail and "ResourceSlice capacity" in limit.detail
    assert PARENT not in g.by_device()


def test_without_a_memory_capacity_the_profile_s_nominal_size() -> None:
    limit = grants([mig(memory=None, profile="1g.12gb")]).by_device()[MIG]
    assert limit.bytes == 12 * 10**9 and "profile 1g.12gb" in limit.detail


def test_the_pod_gets_the_mig_device_s_memory_never_the_parent_s_share() -> None:
    g = grants([mig()])
    found = implicit_budget(claim_pod("a", ["mig"]), FACTS, SHARE_FROM_NODE, g, claims_gpu=True)
    assert found is not None
    assert found.device_limits == {MIG: 19968 * MI}
    assert "perDevice" not in found.limits  # no limit from the parent GPU's share


def test_a_whole_gpu_claim_still_sets_no_limit_of_its_own() -> None:
    assert grants([gpu("gpu-0-mig-9-4-4", PARENT, shared=False)]) is None
