"""One evaluation of the reconcile loop end to end (indexes snapshot -> engine ->
actions) against an HTTP server standing in for the API server: a group that
fails does not stop the others; DryRun and exempt namespaces get no
``vramguard.io/limits`` writes; a policy that cannot be evaluated makes every
namespace DryRun."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.controller.applier import Applier
from vramguard_operator.controller.events import EventRecorder
from vramguard_operator.controller.indexes import Snapshot, Versioned, budget_entry
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.policy_handlers import gpu_pod_entry, node_entry
from vramguard_operator.controller.reconcile import Reconciler
from vramguard_operator.controller.settings import OperatorConfig
from vramguard_operator.engine.types import PodFacts
from vramguard_operator.policy.ratelimit import EvictionLimiter

from ..agent.stubapi import StubAPI
from ..engine.builders import budget
from ..policy.builders import NOW, device, node_obj, pod, policy, report, stale_policy

NODE = "gpu-h100-ts"


@pytest.fixture()
def stub() -> Iterator[StubAPI]:
    s = StubAPI()
    yield s
    s.close()


def reconciler(stub: StubAPI) -> tuple[Reconciler, Metrics]:
    api = stub.api_client()
    metrics = Metrics(CollectorRegistry())
    limiter = EvictionLimiter(EvictionRateLimit(), retry_seconds=30)
    applier = Applier(KubeActions(api), EventRecorder(client.CoreV1Api(api)), limiter, metrics)
    return Reconciler(OperatorConfig(), applier, metrics, clock=lambda: NOW), metrics


def requests(stub: StubAPI, method: str, pattern: str) -> list[Any]:
    return [r for r in stub.requests if r.method == method and re.search(pattern, r.path)]


def budget_versioned(ns: str) -> Versioned[Any]:
    b = budget(ns=ns, uid=f"uid-{ns}", per_pod={"vram": "10Gi"})
    return Versioned(f"uid-{ns}", "1", budget_entry(b.to_api()).value)


def gpu_pod_snapshot(ns: str = "ml", **policies: Any) -> Snapshot:
    """A GPU pod that no budget selects, on a time-sliced node, with a fresh report."""
    snap = Snapshot()
    raw = pod("free", ns, node_name=NODE, resources={"nvidia.com/gpu": "1"})
    snap.pods[ns] = [Versioned("uid-free", "1", PodFacts.from_api(raw))]
    entry = gpu_pod_entry(raw)
    assert entry is not None
    snap.gpu_pods[ns] = [entry]
    node = node_entry(node_obj(NODE))
    assert node is not None
    snap.gpu_nodes[NODE] = node
    snap.reports[NODE] = Versioned("r", "1", report(NODE, [device("GPU-a", 81559, 529)]))
    for name, p in policies.items():
        snap.policies[name] = Versioned(f"uid-{name}", "1", p)
    return snap


# --- one group failing ------------------------------------------------------------------


def test_a_failing_group_does_not_stop_the_others(stub, monkeypatch, caplog):
    snap = Snapshot()
    for ns in ("a", "b"):
        snap.budgets[ns] = [budget_versioned(ns)]
    snap.policies["audit"] = Versioned("p", "1", policy(
        "audit", mode="DryRun", namespaceSelector={"matchLabels": {"audit": "on"}}))
    snap.namespaces["a"] = {"audit": "on"}  # a: DryRun, b: Enforce -> two groups
    rec, metrics = reconciler(stub)
    real = rec.engine.engine

    def evaluate(inp: Any, progress: Any) -> Any:  # a bug outside any budget's evaluation
        if any(b.metadata.namespace == "a" for b in inp.budgets):
            raise RuntimeError("engine bug")
        return real(inp, progress)

    monkeypatch.setattr(rec.engine, "engine", evaluate)
    rec.evaluate_and_apply(snap)
    assert requests(stub, "PATCH", r"/namespaces/b/gpumemorybudgets/train/status$")
    assert not requests(stub, "PATCH", r"/namespaces/a/")
    assert metrics.registry.get_sample_value(
        "vramguard_evaluation_errors_total", {"stage": "evaluate"}) == 1
    assert any("namespaces a" in r.getMessage() and r.exc_info for r in caplog.records)
    assert rec.evaluations == 1


def test_a_failing_apply_does_not_stop_the_others(stub, monkeypatch):
    snap = Snapshot()
    for ns in ("a", "b"):
        snap.budgets[ns] = [budget_versioned(ns)]
    snap.policies["audit"] = Versioned("p", "1", policy(
        "audit", mode="DryRun", namespaceSelector={"matchLabels": {"audit": "on"}}))
    snap.namespaces["a"] = {"audit": "on"}
    rec, metrics = reconciler(stub)
    real = rec.applier.write_statuses

    def write_statuses(statuses: Any, ctx: Any, result: Any) -> None:
        statuses = list(statuses)
        if any(u.budget.namespace == "a" for u in statuses):
            raise ValueError("bad body")
        real(statuses, ctx, result)

    monkeypatch.setattr(rec.applier, "write_statuses", write_statuses)
    rec.evaluate_and_apply(snap)
    assert requests(stub, "PATCH", r"/namespaces/b/gpumemorybudgets/train/status$")
    assert metrics.registry.get_sample_value(
        "vramguard_evaluation_errors_total", {"stage": "apply"}) == 1


# --- vramguard.io/limits only where vramguard may change things ------------------------


def test_limits_annotation_is_written_in_enforce_namespaces(stub):
    rec, _ = reconciler(stub)
    rec.evaluate_and_apply(gpu_pod_snapshot(team=policy("team", defaults={})))
    (req,) = requests(stub, "PATCH", r"/namespaces/ml/pods/free$")
    assert "vramguard.io/limits" in req.body["metadata"]["annotations"]


@pytest.mark.parametrize("spec", [{"mode": "DryRun"}, {"exemptNamespaces": ["ml"]}],
                         ids=["dry-run", "exempt"])
def test_no_limits_annotation_in_dry_run_or_exempt_namespaces(stub, spec):
    rec, _ = reconciler(stub)
    rec.evaluate_and_apply(gpu_pod_snapshot(team=policy("team", defaults={}, **spec)))
    assert not requests(stub, "PATCH", r"/namespaces/ml/pods/free$")


# --- a policy that cannot be evaluated ------------------------------------------------


def test_a_broken_policy_is_logged_once_and_holds_enforcement(stub, caplog):
    broken = stale_policy("audit", {"key": "team", "operator": "In", "values": []}, mode="DryRun")
    snap = gpu_pod_snapshot(team=policy("team", defaults={}), audit=broken)
    rec, _ = reconciler(stub)
    rec.evaluate_and_apply(snap)
    rec.evaluate_and_apply(gpu_pod_snapshot(team=policy("team", defaults={}), audit=broken))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert "GPUMemoryPolicy audit: spec.namespaceSelector.matchExpressions[0]" in errors[0]
    assert "DryRun" in errors[0]
    assert not requests(stub, "PATCH", r"/namespaces/ml/pods/free$")  # held: nothing written
    rec.evaluate_and_apply(gpu_pod_snapshot(team=policy("team", defaults={})))  # fixed
    assert requests(stub, "PATCH", r"/namespaces/ml/pods/free$")


# --- what DRA claims booked ---------------------------------------------------------------


def claim_snapshot(ns: str = "ml", consumed: str = "20Gi", device_name: str = "gpu-0", **policies: Any) -> Snapshot:
    """A pod with one claim (``consumed`` on ``device_name``), the node's slice
    (gpu-0 is GPU-a), its report (30Gi used on GPU-a), all through the index entries."""
    from vramguard_operator.controller.allocation_entries import claim_entry, slice_entry

    from ..policy.dra_builders import claim, claim_pod, gpu, resource_slice, result

    snap = Snapshot()
    raw = claim_pod("free", ["c"], ns=ns, node=NODE)
    snap.pods[ns] = [Versioned("uid-free", "1", PodFacts.from_api(raw))]
    entry = gpu_pod_entry(raw)
    assert entry is not None
    snap.gpu_pods[ns] = [entry]
    snap.claims[(ns, "c")] = claim_entry(claim("c", [result(device_name, NODE, consumed)], ns=ns))
    snap.slices = [slice_entry(resource_slice(NODE, [gpu("gpu-0", "GPU-a")]))]
    usage = [{"uid": "uid-free", "namespace": ns, "name": "free", "vramBytes": 30 << 30,
              "devices": [{"uuid": "GPU-a", "usedBytes": 30 << 30}]}]
    snap.reports[NODE] = Versioned("r", "1", report(NODE, [device("GPU-a", 81559, 529)], usage))
    for name, p in policies.items():
        snap.policies[name] = Versioned(f"uid-{name}", "1", p)
    return snap


def events(stub: StubAPI, reason: str) -> list[Any]:
    return [r for r in requests(stub, "POST", r"/namespaces/ml/events$") if r.body.get("reason") == reason]


def test_a_claims_memory_is_the_pods_limit_on_its_device(stub):
    rec, _ = reconciler(stub)
    rec.evaluate_and_apply(claim_snapshot())
    (patch,) = [r for r in requests(stub, "PATCH", r"/namespaces/ml/pods/free$")
                if "vramguard.io/violation" in r.body["metadata"]["annotations"]]
    assert "default:free" in patch.body["metadata"]["annotations"]["vramguard.io/violation"]
    assert [e.body["involvedObject"]["name"] for e in events(stub, "LimitExceeded")] == ["free"]


def test_a_vanished_device_is_one_warning_event_and_no_action(stub):
    rec, _ = reconciler(stub)
    snap = claim_snapshot(device_name="gpu-7")
    rec.evaluate_and_apply(snap)
    rec.evaluate_and_apply(claim_snapshot(device_name="gpu-7"))
    (event,) = events(stub, "AllocatedDeviceMissing")
    assert event.body["type"] == "Warning" and "gpu-7" in event.body["message"]
    assert not requests(stub, "PATCH", r"/events/")  # reported once, not counted up on each evaluation
    assert not events(stub, "LimitExceeded")
    assert not requests(stub, "PATCH", r"/namespaces/ml/pods/free$")


def test_no_problem_events_in_exempt_namespaces(stub):
    rec, _ = reconciler(stub)
    rec.evaluate_and_apply(claim_snapshot(device_name="gpu-7", team=policy("team", exemptNamespaces=["ml"])))
    assert not events(stub, "AllocatedDeviceMissing")
