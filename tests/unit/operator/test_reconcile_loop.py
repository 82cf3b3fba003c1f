"""Evaluations of the reconcile loop end to end (changes -> cache -> engine ->
actions -> status writer) against an HTTP server standing in for the API
server: a group that fails does not stop the others; DryRun and exempt
namespaces get no ``vramguard.io/limits`` writes; a policy that cannot be
evaluated makes every namespace DryRun; statuses are written off the
decision path and their echo marks nothing."""

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
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.policy_handlers import policy_body
from vramguard_operator.controller.reconcile import Reconciler
from vramguard_operator.controller.settings import OperatorConfig
from vramguard_operator.controller.status_writer import StatusWriter
from vramguard_operator.plan.changes import Change
from vramguard_operator.plan.entries import (
    budget_entry,
    namespace_entry,
    node_entry,
    pod_cache_entry,
    report_entry,
)
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
    writer = StatusWriter(applier, metrics=metrics)
    rec = Reconciler(OperatorConfig(), applier, metrics, writer, clock=lambda: NOW)
    writer.on_limits = rec.wrote_limits
    return rec, metrics


def evaluate_once(rec: Reconciler) -> None:
    """One pass, then every queued write (the writer's thread is not running)."""
    rec.step()
    assert rec.writer is not None
    rec.writer.flush()
    rec.drain()


def requests(stub: StubAPI, method: str, pattern: str) -> list[Any]:
    return [r for r in stub.requests if r.method == method and re.search(pattern, r.path)]


def put(rec: Reconciler, kind: str, key: Any, entry: Any) -> None:
    rec.sink(Change(kind, key, None, entry))


def with_budget(rec: Reconciler, ns: str) -> None:
    b = budget(ns=ns, uid=f"uid-{ns}", per_pod={"vram": "10Gi"}).to_api()
    b["metadata"]["resourceVersion"] = "1"
    put(rec, "budgets", (ns, "train"), budget_entry(b))


def with_gpu_pod(rec: Reconciler, ns: str = "ml", **policies: Any) -> None:
    """A GPU pod that no budget selects, on a time-sliced node, with a fresh report."""
    raw = pod("free", ns, node_name=NODE, resources={"nvidia.com/gpu": "1"})
    raw["metadata"]["resourceVersion"] = "1"
    put(rec, "pods", "uid-free", pod_cache_entry(raw))
    put(rec, "nodes", NODE, node_entry(node_obj(NODE)))
    rep = report(NODE, [device("GPU-a", 81559, 529)]).to_api()
    rep["metadata"]["resourceVersion"] = "1"
    put(rec, "reports", NODE, report_entry(rep))
    for name, p in policies.items():
        put(rec, "policies", name, policy_body(p.to_api()))


# --- one group failing ------------------------------------------------------------------


def _two_groups(rec: Reconciler) -> None:
    for ns in ("a", "b"):
        with_budget(rec, ns)
    put(rec, "policies", "audit", policy_body(policy(
        "audit", mode="DryRun", namespaceSelector={"matchLabels": {"audit": "on"}}).to_api()))
    put(rec, "namespaces", "a", namespace_entry({"metadata": {"name": "a", "labels": {"audit": "on"}}}))


def test_a_failing_group_does_not_stop_the_others(stub, monkeypatch, caplog):
    rec, metrics = reconciler(stub)
    real = rec.engine.engine

    def evaluate(inp: Any, progress: Any) -> Any:  # a bug outside any budget's evaluation
        if any(b.metadata.namespace == "a" for b in inp.budgets):
            raise RuntimeError("engine bug")
        return real(inp, progress)

    monkeypatch.setattr(rec.engine, "engine", evaluate)
    _two_groups(rec)  # a: DryRun, b: Enforce -> two groups
    evaluate_once(rec)
    assert requests(stub, "PATCH", r"/namespaces/b/gpumemorybudgets/train/status$")
    assert not requests(stub, "PATCH", r"/namespaces/a/")
    assert metrics.registry.get_sample_value(
        "vramguard_evaluation_errors_total", {"stage": "evaluate"}) == 1
    assert any("namespaces a" in r.getMessage() and r.exc_info for r in caplog.records)
    assert rec.evaluations == 1


def test_a_failing_apply_does_not_stop_the_others(stub, monkeypatch):
    rec, metrics = reconciler(stub)
    _two_groups(rec)
    real = rec.applier.apply

    def apply(out: Any, ctx: Any) -> Any:
        if any(u.budget.namespace == "a" for u in out.statuses):
            raise ValueError("bad body")
        return real(out, ctx)

    monkeypatch.setattr(rec.applier, "apply", apply)
    evaluate_once(rec)
    assert requests(stub, "PATCH", r"/namespaces/b/gpumemorybudgets/train/status$")
    assert metrics.registry.get_sample_value(
        "vramguard_evaluation_errors_total", {"stage": "apply"}) == 1


# --- vramguard.io/limits only where vramguard may change things ------------------------


def test_limits_annotation_is_written_in_enforce_namespaces(stub):
    rec, _ = reconciler(stub)
    with_gpu_pod(rec, team=policy("team", defaults={}))
    evaluate_once(rec)
    (req,) = requests(stub, "PATCH", r"/namespaces/ml/pods/free$")
    assert "vramguard.io/limits" in req.body["metadata"]["annotations"]


@pytest.mark.parametrize("spec", [{"mode": "DryRun"}, {"exemptNamespaces": ["ml"]}],
                         ids=["dry-run", "exempt"])
def test_no_limits_annotation_in_dry_run_or_exempt_namespaces(stub, spec):
    rec, _ = reconciler(stub)
    with_gpu_pod(rec, team=policy("team", defaults={}, **spec))
    evaluate_once(rec)
    assert not requests(stub, "PATCH", r"/namespaces/ml/pods/free$")


# --- a policy that cannot be evaluated ------------------------------------------------


def test_a_broken_policy_is_logged_once_and_holds_enforcement(stub, caplog):
    broken = stale_policy("audit", {"key": "team", "operator": "In", "values": []}, mode="DryRun")
    rec, _ = reconciler(stub)
    with_gpu_pod(rec, team=policy("team", defaults={}))
    rec.sink(Change("policies", "audit", None, policy_body(broken.model_dump(by_alias=True, exclude_none=True))))
    evaluate_once(rec)
    put(rec, "namespaces", "ml", namespace_entry({"metadata": {"name": "ml", "labels": {"x": "y"}}}))
    evaluate_once(rec)  # evaluated again, still broken: logged once
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1
    assert "GPUMemoryPolicy audit: spec.namespaceSelector.matchExpressions" in errors[0]
    assert "DryRun" in errors[0]
    assert not requests(stub, "PATCH", r"/namespaces/ml/pods/free$")  # held: nothing written
    rec.sink(Change("policies", "audit", None, None))  # fixed
    evaluate_once(rec)
    assert requests(stub, "PATCH", r"/namespaces/ml/pods/free$")


# --- what DRA claims booked ---------------------------------------------------------------


def with_claim(rec: Reconciler, ns: str = "ml", consumed: str = "20Gi", device_name: str = "gpu-0",
               **policies: Any) -> None:
    """A pod with one claim (``consumed`` on ``device_name``), the node's slice
    (gpu-0 is GPU-a), its report (30Gi used on GPU-a), all through the informers' entries."""
    from vramguard_operator.plan.allocation_entries import claim_entry, slice_entry

    from ..policy.dra_builders import claim, claim_pod, gpu, resource_slice, result

    raw = claim_pod("free", ["c"], ns=ns, node=NODE)
    raw["metadata"]["resourceVersion"] = "1"
    put(rec, "pods", "uid-free", pod_cache_entry(raw))
    put(rec, "claims", (ns, "c"), claim_entry(claim("c", [result(device_name, NODE, consumed)], ns=ns)))
    put(rec, "slices", "s", slice_entry(resource_slice(NODE, [gpu("gpu-0", "GPU-a")])))
    usage = [{"uid": "uid-free", "namespace": ns, "name": "free", "vramBytes": 30 << 30,
              "devices": [{"uuid": "GPU-a", "usedBytes": 30 << 30}]}]
    rep = report(NODE, [device("GPU-a", 81559, 529)], usage).to_api()
    rep["metadata"]["resourceVersion"] = "1"
    put(rec, "reports", NODE, report_entry(rep))
    for name, p in policies.items():
        put(rec, "policies", name, policy_body(p.to_api()))


def events(stub: StubAPI, reason: str) -> list[Any]:
    return [r for r in requests(stub, "POST", r"/namespaces/ml/events$") if r.body.get("reason") == reason]


def test_a_claims_memory_is_the_pods_limit_on_its_device(stub):
    rec, _ = reconciler(stub)
    with_claim(rec)
    evaluate_once(rec)
    (patch,) = [r for r in requests(stub, "PATCH", r"/namespaces/ml/pods/free$")
                if "vramguard.io/violation" in r.body["metadata"]["annotations"]]
    assert "default:free" in patch.body["metadata"]["annotations"]["vramguard.io/violation"]
    assert [e.body["involvedObject"]["name"] for e in events(stub, "LimitExceeded")] == ["free"]


def test_a_vanished_device_is_one_warning_event_and_no_action(stub):
    rec, _ = reconciler(stub)
    with_claim(rec, device_name="gpu-7")
    evaluate_once(rec)
    with_claim(rec, device_name="gpu-7")  # the same again: evaluated again
    evaluate_once(rec)
    (event,) = events(stub, "AllocatedDeviceMissing")
    assert event.body["type"] == "Warning" and "gpu-7" in event.body["message"]
    assert not requests(stub, "PATCH", r"/events/")  # reported once, not counted up on each evaluation
    assert not events(stub, "LimitExceeded")
    assert not requests(stub, "PATCH", r"/namespaces/ml/pods/free$")


def test_no_problem_events_in_exempt_namespaces(stub):
    rec, _ = reconciler(stub)
    with_claim(rec, device_name="gpu-7", team=policy("team", exemptNamespaces=["ml"]))
    evaluate_once(rec)
    assert not events(stub, "AllocatedDeviceMissing")


# --- a budget held for running out of time comes back without any change ------------------


def test_a_budget_held_for_a_timeout_is_evaluated_again_when_its_hold_ends(stub):
    from datetime import timedelta

    from vramguard_operator.controller.isolation import HOLD_SECONDS, GuardedEngine
    from vramguard_operator.engine.evaluate import evaluate

    from .test_isolation import Clock

    rec, metrics = reconciler(stub)
    bug = {"on": True}

    def engine(inp: Any, progress: Any) -> Any:
        def tell(stage: str) -> None:
            progress(stage)
            while bug["on"] and stage == "budget ml/train" and ("ml", "train") not in inp.held:
                sum(range(1000))

        return evaluate(inp, tell)

    clock, now = Clock(), [NOW]
    rec.engine = GuardedEngine(0.3, metrics, engine, clock)
    rec.clock = lambda: now[0]
    with_budget(rec, "ml")
    evaluate_once(rec)
    (first,) = requests(stub, "PATCH", r"/namespaces/ml/gpumemorybudgets/train/status$")
    assert "EvaluationTimeout" in str(first.body)
    bug["on"] = False  # fixed; nothing about the budget changes
    clock.t += HOLD_SECONDS + 1
    now[0] += timedelta(seconds=rec.config.evaluation_period + 1)
    evaluate_once(rec)
    last = requests(stub, "PATCH", r"/namespaces/ml/gpumemorybudgets/train/status$")[-1]
    assert "EvaluationTimeout" not in str(last.body) and '"Valid"' in str(last.body).replace("'", '"')


# --- a report naming pods that are not on its node: a warning, once per change ------------


def test_a_report_naming_unknown_pods_is_one_warning_event_and_still_believed(stub):
    from datetime import timedelta

    now = [NOW]
    rec, metrics = reconciler(stub)
    rec.clock = lambda: now[0]
    with_gpu_pod(rec)
    rep = report(NODE, [device("GPU-a", 81559, 529)], pods=[
        {"uid": u, "namespace": "ml", "name": n, "attribution": "Measured"}
        for u, n in (("uid-free", "free"), ("uid-ghost", "ghost"))]).to_api()
    rep["metadata"].update(resourceVersion="2", uid="r-1")
    put(rec, "reports", NODE, report_entry(rep))

    def tidy_pass(seconds: float) -> list[Any]:
        now[0] = NOW + timedelta(seconds=seconds)
        rec._tidy_at = 0.0  # the tidy runs every evaluation period; here at each call
        evaluate_once(rec)
        return [r for r in requests(stub, "POST", r"/namespaces/default/events$")
                if r.body.get("reason") == "ReportUnknownPods"]

    assert tidy_pass(0) == []  # within the grace (the agent and the API race)
    (event,) = tidy_pass(61)
    assert event.body["type"] == "Warning" and event.body["involvedObject"]["kind"] == "NodeGPUUsage"
    assert event.body["involvedObject"]["name"] == NODE and "uid-ghost" in event.body["message"]
    assert "uid-free" not in event.body["message"]
    registry = metrics.registry
    assert registry.get_sample_value("vramguard_node_report_unknown_pods", {"node": NODE}) == 1
    assert len(tidy_pass(90)) == 1  # unchanged: no second Event, no repeat counted
    assert not requests(stub, "PATCH", r"/events/")
    assert not [r for r in requests(stub, "POST", r"/events$") if r.body.get("reason") == "ReportInvalid"]
    ghost = pod("ghost", "ml", node_name=NODE)  # its pod reaches the cache: the flag clears
    ghost["metadata"]["resourceVersion"] = "1"
    put(rec, "pods", "uid-ghost", pod_cache_entry(ghost))
    assert len(tidy_pass(100)) == 1
    assert registry.get_sample_value("vramguard_node_report_unknown_pods", {"node": NODE}) is None
