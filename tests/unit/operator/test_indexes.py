"""Index entries built from API bodies, the snapshot and the overlay of the
operator's own writes."""

from __future__ import annotations

from typing import Any

from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.controller.indexes import (
    Overlay,
    budget_entry,
    has_vramguard_state,
    namespace_entry,
    pod_entry,
    policy_entry,
    report_entry,
    report_node,
    rv_newer,
    snapshot_of,
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


def test_snapshot_copies_index_stores():
    pods = {"ml": [pod_entry(pod_body())]}
    reports = {"n1": [report_entry({"metadata": {"name": "n1", "uid": "r", "resourceVersion": "9"},
                                    "spec": {"nodeName": "n1"}}),
                      report_entry({"metadata": {"name": "n1-old", "uid": "q", "resourceVersion": "10"},
                                    "spec": {"nodeName": "n1"}})]}
    snap = snapshot_of({"ml": [budget_entry(budget_body())]}, pods, reports, {}, {})
    assert [p.value.name for p in snap.pods["ml"]] == ["w0"]
    assert snap.reports["n1"].resource_version == "10"  # two reports for one node: newest
    assert snap.sample_times() == {"n1": None}


def test_overlay_serves_written_objects_until_the_watch_catches_up():
    ov = Overlay()
    stale = {"ml": [pod_entry(pod_body(rv="10"))]}
    ov.record_pod(pod_body(rv="12", annotations={"vramguard.io/violation": "x"}))
    ov.record_pod(pod_body(rv="11"))  # an older response never replaces a newer one
    snap = ov.apply(snapshot_of({}, stale, {}, {}, {}))
    assert snap.pods["ml"][0].resource_version == "12"
    assert snap.pods["ml"][0].value.annotations == {"vramguard.io/violation": "x"}
    caught_up = {"ml": [pod_entry(pod_body(rv="13"))]}
    snap = ov.apply(snapshot_of({}, caught_up, {}, {}, {}))
    assert snap.pods["ml"][0].resource_version == "13"
    assert len(ov) == 0


def test_overlay_never_resurrects_a_deleted_pod_or_budget():
    ov = Overlay()
    ov.record_pod(pod_body(rv="12"))
    ov.record_budget(budget_body(rv="8", status={"matchedPods": 1}))
    snap = ov.apply(snapshot_of({}, {}, {}, {}, {}))
    assert snap.pods == {} and snap.budgets == {}
    assert len(ov) == 0


def test_overlay_budget_status_is_used_while_newer():
    ov = Overlay()
    ov.record_budget(budget_body(rv="8", status={"matchedPods": 1}))
    snap = ov.apply(snapshot_of({"ml": [budget_entry(budget_body(rv="5"))]}, {}, {}, {}, {}))
    assert snap.budgets["ml"][0].value.status_api() == {"matchedPods": 1}


def test_claim_and_slice_entries_keep_what_dra_reads() -> None:
    from vramguard_operator.controller.allocation_entries import claim_entry, slice_entry
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


def test_snapshot_copies_claims_and_slices() -> None:
    snap = snapshot_of({}, {}, {}, {}, {}, claims={("ml", "c"): [{"c": 1}]}, slices={"s1": [{"s": 1}], "s2": [{"s": 2}]})
    assert snap.claims == {("ml", "c"): {"c": 1}}
    assert sorted(x["s"] for x in snap.slices) == [1, 2]
