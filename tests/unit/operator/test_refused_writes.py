"""A step counts only when it is on the pod (issue 17, item 3), through the whole
loop against a stand-in API server that refuses every write of the pod's
annotations (a pod whose annotations are near their 256 KiB limit): nothing is
resized, restored or evicted, each evaluation explains the refusal on the pod
and the budget (one Event, counted up), and the budget's status never shows a
step the pod does not have. The throttle/restore oscillation of the issue (a
status holding Throttle while the pod had no record of it: the CPU flipped
between 2 and 100m every second, with dozens of Recovered Events) cannot start."""

from __future__ import annotations

import json
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
from vramguard_operator.controller.indexes import Snapshot, Versioned, budget_entry, report_entry
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.reconcile import Reconciler
from vramguard_operator.controller.settings import OperatorConfig
from vramguard_operator.policy.ratelimit import EvictionLimiter

from ..agent.stubapi import StubAPI, status_body
from ..engine.builders import at, budget, pod, report, vram

NOW = at(400)
TOO_LONG = status_body(422, "Invalid") | {
    "message": 'Pod "w0" is invalid: metadata.annotations: Too long: must have at most 262144 bytes'}


@pytest.fixture()
def stub() -> Iterator[StubAPI]:
    s = StubAPI()
    s.respond("PATCH", r"/namespaces/ml/pods/w0$", *[(422, TOO_LONG)] * 50)
    yield s
    s.close()


def reconciler(stub: StubAPI) -> Reconciler:
    api = stub.api_client()
    metrics = Metrics(CollectorRegistry())
    applier = Applier(KubeActions(api), EventRecorder(client.CoreV1Api(api)),
                      EvictionLimiter(EvictionRateLimit(), retry_seconds=30), metrics)
    return Reconciler(OperatorConfig(), applier, metrics, clock=lambda: NOW)


def snapshot(status: dict[str, Any] | None) -> Snapshot:
    snap = Snapshot()
    body = budget(per_pod={"vram": "10Gi"}).to_api()
    if status is not None:
        body["status"] = status
    snap.budgets["ml"] = [Versioned("uid-train", "1", budget_entry(body).value)]
    snap.pods["ml"] = [Versioned("uid-w0", "1", pod("w0"))]
    rep = report("node-a", NOW, {"w0": vram(12)})
    snap.reports["node-a"] = report_entry(rep.to_api() | {"metadata": {"name": "node-a", "uid": "r"}})
    return snap


def calls(stub: StubAPI, method: str, pattern: str) -> list[Any]:
    return [r for r in stub.requests if r.method == method and re.search(pattern, r.path)]


LEADING = {"violations": [{"kind": "PodVRAM", "pod": "w0", "observedBytes": 12 << 30, "limitBytes": 10 << 30,
                           "since": at(0).isoformat(), "openedAt": at(0).isoformat(), "step": "Throttle",
                           "stepTime": at(300).isoformat(), "message": "over"}]}


@pytest.mark.parametrize("status", [None, LEADING], ids=["a new violation", "a status that leads the pod"])
def test_a_refused_record_stops_everything_for_the_pod_and_is_explained(stub, status):
    rec = reconciler(stub)
    for _ in range(5):
        rec.evaluate_and_apply(snapshot(status))
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
