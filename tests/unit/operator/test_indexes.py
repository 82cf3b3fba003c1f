"""Entries built from API bodies (what the informers keep)."""

from __future__ import annotations

from typing import Any

from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.plan.entries import (
    budget_entry,
    has_vramguard_state,
    namespace_entry,
    pod_cache_entry,
    pod_entry,
    policy_entry,
    report_entry,
    report_node,
    rv_newer,
)


def pod_body(rv: str = "10", annotations: dict[str, str] | None = None, uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "w0",
            "namespace": "ml",
            "uid": uid,
            "resourceVersion": rv,
            "labels": {"app": "train"},
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": "n1",
            "containers": [
                {
                    "name": "main",
                    "resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}},
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def budget_body(rv: str = "5", limits: dict[str, Any] | None = None, status: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GPUMemoryBudget",
        "metadata": {"name": "train", "namespace": "ml", "uid": "b1", "generation": 3,
                     "resourceVersion": rv, "managedFields": [{"manager": "kubectl"}]},
        "spec": {"selector": {"matchLabels": {"app": "train"}}, "limits": limits or {"perPod": {"vram": "10Gi"}}},
    }
    if status is not None:
        body["status"] = status
    return body


def test_rv_newer_compares_etcd_revisions_as_integers():
    assert rv_newer("100", "99")
    assert not rv_newer("99", "100")
    assert not rv_newer("5", "5")
    assert not rv_newer("abc", "1")  # opaque: trust the watch


def test_pod_entry_reads_facts_and_version():
    e = pod_entry(pod_body())
    assert (e.uid, e.resource_version) == ("u1", "10")
    assert e.value.node_name == "n1" and e.value.phase == "Running"
    assert e.value.containers[0].cpu_limit == "2"
    assert not has_vramguard_state(e.value)
    assert has_vramguard_state(pod_entry(pod_body(annotations={"vramguard.io/violations": "[]"})).value)


def test_budget_entry_parses_and_keeps_only_what_the_model_knows():
    e = budget_entry(budget_body(status={"observedGeneration": 2, "matchedPods": 1}))
    assert e.value.error is None and e.value.budget is not None
    assert e.value.budget.metadata.generation == 3
    assert e.value.status_api() == {"observedGeneration": 2, "matchedPods": 1}


def test_a_budget_that_does_not_parse_says_why_and_keeps_its_raw_status():
    e = budget_entry(budget_body(limits={"perPod": {"vram": "20Gi"}, "total": {"vram": "10Gi"}},
                                 status={"matchedPods": 2}))
    assert e.value.budget is None
    assert "GPUMemoryBudget ml/train" in (e.value.error or "")
    assert "perPod.vram (20Gi) must not be above total.vram (10Gi)" in (e.value.error or "")
    assert e.value.status_api() == {"matchedPods": 2}
    assert e.value.generation == 3


def test_report_policy_and_namespace_entries():
    body = {
        "metadata": {"name": "n1", "uid": "r1", "resourceVersion": "7"},
        "spec": {"nodeName": "n1"},
        "status": {"sampleTime": "2024-05-01T10:00:00Z", "pods": []},
    }
    e = report_entry(body)
    assert isinstance(e.value, NodeGPUUsage) and report_node(body) == "n1"
    bad = report_entry({**body, "status": {"sampleTime": "yesterday"}})
    assert isinstance(bad.value, str) and "status.sampleTime" in bad.value
    pol = policy_entry({"metadata": {"name": "p", "uid": "x", "resourceVersion": "1"},
                        "spec": {"mode": "DryRun"}})
    assert not isinstance(pol.value, str) and pol.value.spec.mode == "DryRun"
    ns = namespace_entry({"metadata": {"name": "ml", "uid": "n", "resourceVersion": "2",
                                       "labels": {"team": "a"}}})
    assert ns.value == {"team": "a"}


def test_pod_cache_entry_keeps_facts_gpu_part_and_the_budgets_its_state_names():
    state = '[{"budget":"train","budgetUID":"b1","kind":"PodVRAM","since":"2024-05-01T10:00:00Z"}]'
    e = pod_cache_entry(pod_body(annotations={"vramguard.io/violations": state}))
    assert e is not None and e.recorded == frozenset({"train"}) and e.gpu is None  # no GPU requested
    gpu = pod_body()
    gpu["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    g = pod_cache_entry(gpu)
    assert g is not None and g.gpu is not None and g.gpu["metadata"]["uid"] == "u1"
    assert pod_cache_entry({"metadata": {"name": "x"}}) is None  # no namespace or uid


def test_a_pod_that_only_changed_version_decides_like_before():
    a, b = pod_cache_entry(pod_body(rv="10")), pod_cache_entry(pod_body(rv="11"))
    assert a is not None and b is not None and a.decides_like(b)
    c = pod_cache_entry(pod_body(rv="12", annotations={"vramguard.io/violation": "x"}))
    assert c is not None and not a.decides_like(c)


def test_claim_and_slice_entries_keep_what_dra_reads() -> None:
    from vramguard_operator.plan.allocation_entries import claim_entry, slice_entry
    from vramguard_operator.policy.dra import claim_grants

    from ..policy.dra_builders import claim, claim_pod, gpu, resource_slice, result

    c = claim("c", [result("gpu-0", "n", "20Gi")], reserved_for=["a", "b"])
    c["metadata"]["managedFields"] = [{"manager": "kube-scheduler"}]
    c["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": []}
    entry = claim_entry(c)
    assert entry["metadata"] == {"name": "c", "namespace": "ml", "uid": "claim-uid-c"}
    assert entry["status"]["allocation"] == {"devices": {"results": c["status"]["allocation"]["devices"]["results"]}}
    assert [r["name"] for r in entry["status"]["reservedFor"]] == ["a", "b"]
    assert claim_entry(claim("pending", None))["status"] == {}
    s = resource_slice("n", [gpu("gpu-0", "GPU-a")])
    s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {"default": "80Gi"}
    trimmed = slice_entry(s)
    assert trimmed["spec"]["devices"][0]["capacity"] == {"memory": {"value": "80Gi"}}
    # what policy.dra reads is the same from the entries as from the objects
    pods = [claim_pod("a", ["c"]), claim_pod("b", ["c"])]
    assert claim_grants(pods, {("ml", "c"): entry}, [trimmed]) == claim_grants(pods, {("ml", "c"): c}, [s])


def test_the_entries_keep_the_dra_config_mig_and_shared_device_fields_dra_reads() -> None:
    from vramguard_operator.plan.allocation_entries import claim_entry, slice_entry
    from vramguard_operator.policy.dra import claim_grants

    from ..policy.dra_builders import claim, claim_pod, gpu, resource_slice, result
    from ..policy.test_dra_mps import mps, with_config

    s = resource_slice(
        "n",
        [gpu("gpu-0", "GPU-a"), gpu("mig-0", "MIG-b", memory="19968Mi", shared=False, type={"string": "mig"})],
    )
    claims = {
        ("ml", "mps"): with_config(claim("mps", [result("gpu-0", "n", "20Gi")]), mps(defaultPinnedDeviceMemoryLimit="4Gi")),
        ("ml", "spec"): with_config(claim("spec", [result("gpu-0", "n", "20Gi")]), mps(defaultPinnedDeviceMemoryLimit="3Gi"), where="spec"),
        ("ml", "mig"): claim("mig", [result("mig-0", "n")]),
        ("ml", "odd"): claim("odd", [result("gpu-0", "n")]),  # shared device, no consumedCapacity
    }
    pods = [claim_pod(name, [name]) for _, name in claims]
    trimmed = {k: claim_entry(c) for k, c in claims.items()}
    assert claim_grants(pods, trimmed, [slice_entry(s)]) == claim_grants(pods, claims, [s])
    found = claim_grants(pods, trimmed, [slice_entry(s)]).grants
    assert {u: g.bytes for u, g in found["uid-mps"].by_device().items()} == {"GPU-a": 4 * 1024**3}
    assert {u: g.bytes for u, g in found["uid-spec"].by_device().items()} == {"GPU-a": 3 * 1024**3}
    assert {u: g.bytes for u, g in found["uid-mig"].by_device().items()} == {"MIG-b": 19968 * 1024**2}
    assert len(found["uid-odd"].problems) == 1
