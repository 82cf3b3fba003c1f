"""A step counts only when it is on the pod (issue 17, item 3), through the whole
loop against a stand-in API server that refuses every write of the pod's
annotations (a pod whose annotations are near their 256 KiB limit): nothing is
resized, restored or evicted, each evaluation explains the refusal on the pod
and the budget (one Event, counted up), and the budget's status never shows a
step the pod does not have. The throttle/restore oscillation of the issue (a
status holding Throttle while the pod had no record of it: the CPU flipped
between 2 and 100m every second, with dozens of Recovered Events) cannot start."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.controller.applier import Applier
from vramguard_operator.controller.events import EventRecorder
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.reconcile import Reconciler
from vramguard_operator.controller.settings import OperatorConfig
from vramguard_operator.controller.status_writer import StatusWriter
from vramguard_operator.plan.changes import Change
from vramguard_operator.plan.entries import budget_entry, pod_cache_entry, report_entry
from vramguard_operator.policy.ratelimit import EvictionLimiter

from ..agent.stubapi import StubAPI, status_body
from ..engine.builders import at, budget, report, vram
from ..policy.builders import pod as pod_body

NOW = at(400)
PERIOD = 5.0
TOO_LONG = status_body(422, "Invalid") | {
    "message": 'Pod "w0" is invalid: metadata.annotations: Too long: must have at most 262144 bytes'}


@pytest.fixture()
def stub() -> Iterator[StubAPI]:
    s = StubAPI()
    s.respond("PATCH", r"/namespaces/ml/pods/w0$", *[(422, TOO_LONG)] * 50)
    yield s
    s.close()


def reconciler(stub: StubAPI, status: dict[str, Any] | None) -> Reconciler:
    """The loop with its status writer (flushed by ``evaluate_once``), fed one
    budget (``status``: its status), one pod over its limit and its report."""
    api = stub.api_client()
    metrics = Metrics(CollectorRegistry())
    applier = Applier(KubeActions(api), EventRecorder(client.CoreV1Api(api)),
                      EvictionLimiter(EvictionRateLimit(), retry_seconds=30), metrics)
    writer = StatusWriter(applier, metrics=metrics)
    ticks = (NOW + timedelta(seconds=PERIOD * i) for i in itertools.count())  # an evaluation period a pass
    rec = Reconciler(OperatorConfig(evaluation_period=PERIOD), applier, metrics, writer, clock=lambda: next(ticks))
    writer.on_limits = rec.wrote_limits
    body = budget(per_pod={"vram": "10Gi"}).to_api()
    body["metadata"].update(uid="uid-train", resourceVersion="1")
    if status is not None:
        body["status"] = status
    rec.sink(Change("budgets", ("ml", "train"), None, budget_entry(body)))
    raw = pod_body("w0", "ml", containers=[{"name": "main", "image": "x", "resources": {
        "limits": {"cpu": "4"}, "requests": {"cpu": "4"}}}], labels={"app": "train"}, node_name="node-a")
    raw["metadata"]["resourceVersion"] = "1"
    rec.sink(Change("pods", "uid-w0", None, pod_cache_entry(raw)))
    rep = report("node-a", NOW, {"w0": vram(12)})
    rec.sink(Change("reports", "node-a", None,
                    report_entry(rep.to_api() | {"metadata": {"name": "node-a", "uid": "r", "resourceVersion": "1"}})))
    return rec


def evaluate_once(rec: Reconciler) -> None:
    """One pass, then every queued write (the writer's thread is not running)."""
    rec.step()
    assert rec.writer is not None
    rec.writer.flush()
    rec.drain()


def calls(stub: StubAPI, method: str, pattern: str) -> list[Any]:
    return [r for r in stub.requests if r.method == method and re.search(pattern, r.path)]


LEADING = {"violations": [{"kind": "PodVRAM", "pod": "w0", "observedBytes": 12 << 30, "limitBytes": 10 << 30,
                           "since": at(0).isoformat(), "openedAt": at(0).isoformat(), "step": "Throttle",
                           "stepTime": at(300).isoformat(), "message": "over"}]}


@pytest.mark.parametrize("status", [None, LEADING], ids=["a new violation", "a status that leads the pod"])
def test_a_refused_record_stops_everything_for_the_pod_and_is_explained(stub, status):
    rec = reconciler(stub, status)
    for _ in range(5):
        evaluate_once(rec)
    assert len(calls(stub, "PATCH", r"/pods/w0$")) == 5  # the record, tried at each evaluation
    assert not calls(stub, "PATCH", r"/pods/w0/resize$") and not calls(stub, "POST", r"/eviction$")
    events = [r.body for r in calls(stub, "POST", r"/namespaces/ml/events$")]
    reasons = {e["reason"] for e in events}
    assert "Recovered" not in reasons and "Throttled" not in reasons and "LimitExceeded" not in reasons
    failed = [e for e in events if e["reason"] == "ActionFailed"]
    assert {e["involvedObject"]["kind"] for e in failed} == {"Pod", "GPUMemoryBudget"}
    assert all("pod w0" in e["message"] and "Too long: must have at most 262144 bytes" in e["message"]
               for e in failed)
    assert len(failed) == 2  # one per object; the repeats count up on them
    assert len(calls(stub, "PATCH", r"/namespaces/ml/events/")) == 8
    written = calls(stub, "PATCH", r"/gpumemorybudgets/train/status$")
    if status is None:  # the violation is open in status, its Annotate not: the pod does not have it
        assert written
        for r in written:
            (v,) = r.body["status"]["violations"]
            assert (v.get("step"), v["nextStep"]) == (None, "Annotate"), json.dumps(r.body)
