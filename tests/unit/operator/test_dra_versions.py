"""DRA at whichever of v1, v1beta2 and v1beta1 the cluster serves: the choice,
the startup log line, and a v1beta1 ResourceSlice (device fields under
``basic``) read as a v1 one."""

from __future__ import annotations

import copy

import pytest

from vramguard_operator.controller.dra_versions import describe, pick_version
from vramguard_operator.plan.allocation_entries import slice_entry
from vramguard_operator.policy.dra import claim_grants

from ..policy.dra_builders import claim, claim_pod, gpu, resource_slice, result


@pytest.mark.parametrize(
    ("served", "picked"),
    [
        (["v1", "v1beta2", "v1beta1"], "v1"),  # 1.34+
        (["v1beta2", "v1beta1"], "v1beta2"),  # 1.33
        (["v1beta1"], "v1beta1"),  # 1.32
        (["v1alpha3"], None),  # 1.31: not read
        ([], None),
    ],
)
def test_the_most_preferred_served_version_is_read(served: list[str], picked: str | None) -> None:
    assert pick_version(served) == picked


def test_the_startup_log_names_the_version_or_says_claims_are_not_read() -> None:
    assert describe("v1beta2") == "DRA: reading ResourceClaims and ResourceSlices at resource.k8s.io/v1beta2"
    assert "DRA claims are not read" in describe(None) and "v1, v1beta2, v1beta1" in describe(None)


def test_a_v1beta1_slice_reads_as_the_same_v1_slice() -> None:
    v1 = resource_slice("n", [gpu("gpu-0", "GPU-a", memory="80Gi"), gpu("mig-0", "MIG-b", memory="19968Mi", shared=False, type={"string": "mig"})])
    v1beta1 = copy.deepcopy(v1)
    v1beta1["apiVersion"] = "resource.k8s.io/v1beta1"
    v1beta1["spec"]["devices"] = [
        {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}} for d in v1["spec"]["devices"]
    ]
    assert slice_entry(v1beta1) == slice_entry(v1)
    claims = {("ml", "c"): claim("c", [result("mig-0", "n")])}
    pods = [claim_pod("a", ["c"])]
    found = claim_grants(pods, claims, [slice_entry(v1beta1)])
    assert {u: g.bytes for u, g in found.grants["uid-a"].by_device().items()} == {"MIG-b": 19968 * 1024**2}
