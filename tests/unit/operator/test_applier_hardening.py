"""The actions layer's part of issue 17 (items 3 and 4), against an HTTP server
standing in for the API server: a step whose pod write fails is explained
(the pod and the API error) and the budget status is written without it; a
step's Events come after its record and are marked posted after; a recovery's
and an eviction's Events come before the write that would lose them; Events
with a key have a name of their own, so a repeat updates one Event; object
problems are posted once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.controller.applier import Applier, ApplyContext
from vramguard_operator.controller.events import EventRecorder, ObjectRef, keyed_name
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine.types import (
    ANNOTATION_VIOLATIONS,
    Annotate,
    BudgetStatusUpdate,
    ContainerCPU,
    EngineOutput,
    EventSpec,
    Evict,
    ObjectProblem,
    PodPatch,
    Recover,
    Throttle,
)
from vramguard_operator.policy.ratelimit import EvictionLimiter

from ..agent.stubapi import StubAPI, status_body
from .test_applier import BUDGET, KEY, NOW, POD

POD_PATH = r"/namespaces/ml/pods/w0$"
RESIZE = r"/namespaces/ml/pods/w0/resize$"
EVICTION = r"/namespaces/ml/pods/w0/eviction$"
EVENTS = r"/namespaces/ml/events"
STEP = EventSpec("Warning", "Throttled", "budget ml/train: throttled", key="ml|train|uid-train|PodVRAM|w0||t|Throttle")


def common(**extra: Any) -> dict[str, Any]:
    return dict(budget=BUDGET, violation=KEY, pod=POD, time=NOW, observed_bytes=12, limit_bytes=10,
                event=STEP, **extra)


def throttle(**extra: Any) -> Throttle:
    return Throttle(resize=(ContainerCPU("main", "100m", "100m"),), original={}, **common(**extra))


@pytest.fixture()
def stub() -> Iterator[StubAPI]:
    s = StubAPI()
    yield s
    s.close()


def make(api: client.ApiClient, retry: float = 30) -> tuple[Applier, Metrics]:
    metrics = Metrics(CollectorRegistry())
    limiter = EvictionLimiter(EvictionRateLimit(perMinute=60, burst=5), retry_seconds=retry)
    return Applier(KubeActions(api, timeout_seconds=2), EventRecorder(client.CoreV1Api(api)), limiter, metrics), metrics


def ctx() -> ApplyContext:
    return ApplyContext(exempt_namespaces=frozenset(), eviction_scopes=lambda ns: ("",), current_status={})


def calls(stub: StubAPI) -> list[str]:
    """Each request as ``METHOD kind``: pod, resize, eviction, event, status."""
    kinds = [("resize", RESIZE), ("eviction", EVICTION), ("event", EVENTS), ("pod", POD_PATH), ("status", "/status$")]
    out = []
    for r in stub.requests:
        kind = next((k for k, p in kinds if re.search(p, r.path)), r.path)
        out.append(f"{r.method} {kind}")
    return out


def bodies(stub: StubAPI, method: str, pattern: str) -> list[Any]:
    return [r.body for r in stub.requests if r.method == method and re.search(pattern, r.path)]


def test_a_refused_pod_write_is_explained_and_the_status_follows_the_pod(stub):
    too_big = status_body(422, "Invalid") | {
        "message": "Pod \"w0\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes"}
    stub.respond("PATCH", POD_PATH, (422, too_big))
    applier, metrics = make(stub.api_client())
    out = EngineOutput(decisions=(throttle(),), pod_patches=(PodPatch(POD, {ANNOTATION_VIOLATIONS: "[]"}),),
                       statuses=())
    result = applier.apply(out, ctx())
    assert calls(stub) == ["PATCH pod", "POST event", "POST event"]  # no resize; explained on pod and budget
    for event in bodies(stub, "POST", EVENTS):
        assert event["reason"] == "ActionFailed"
        assert "recording it on pod w0 failed (HTTP 422 Invalid" in event["message"] and "Too long" in event["message"]
    assert result.unwritten == {POD.uid}
    fired = GPUMemoryBudgetStatus(matchedPods=1, openViolations=1)
    before = GPUMemoryBudgetStatus(matchedPods=1, openViolations=0)
    upd = BudgetStatusUpdate(BUDGET, fired, unwritten=before, pods=frozenset({POD.uid}))
    (written,) = applier.followed([upd], result)
    assert written.status == before and written.unwritten is None


def test_a_step_is_explained_after_its_record_and_marked_posted_after_its_events(stub):
    applier, _ = make(stub.api_client())
    explained = {ANNOTATION_VIOLATIONS: '[{"posted":true}]'}
    out = EngineOutput(decisions=(throttle(),), statuses=(),
                       pod_patches=(PodPatch(POD, {ANNOTATION_VIOLATIONS: "[]"}, explained),))
    applier.apply(out, ctx())
    assert calls(stub) == ["PATCH pod", "PATCH resize", "POST event", "POST event", "PATCH pod"]
    assert bodies(stub, "PATCH", POD_PATH)[1]["metadata"]["annotations"] == explained


def test_no_mark_when_an_event_is_not_posted(stub):
    stub.respond("POST", EVENTS, (500, status_body(500, "InternalError")))
    applier, _ = make(stub.api_client())
    out = EngineOutput(decisions=(throttle(),), statuses=(),
                       pod_patches=(PodPatch(POD, {ANNOTATION_VIOLATIONS: "[]"}, {ANNOTATION_VIOLATIONS: "x"}),))
    applier.apply(out, ctx())
    assert len(bodies(stub, "PATCH", POD_PATH)) == 1  # the record; no mark: posted again next time


def test_a_recovery_is_explained_before_its_record_goes(stub):
    applier, _ = make(stub.api_client())
    rec = Recover(restore=(ContainerCPU("main", "4", "4"),), **common())
    out = EngineOutput(decisions=(rec,), statuses=(), pod_patches=(PodPatch(POD, {ANNOTATION_VIOLATIONS: None}),))
    applier.apply(out, ctx())
    assert calls(stub) == ["PATCH resize", "POST event", "POST event", "PATCH pod"]


def test_an_eviction_is_explained_before_it_is_sent_and_once_across_retries(stub):
    stub.respond("POST", EVICTION, (429, status_body(429, "TooManyRequests")))
    applier, _ = make(stub.api_client(), retry=0)
    ev = Evict(reason="over", **common())
    applier.apply(EngineOutput(decisions=(ev,), pod_patches=(), statuses=()), ctx())
    assert calls(stub) == ["POST event", "POST event", "POST eviction", "POST event", "POST event"]
    reasons = [b["reason"] for b in bodies(stub, "POST", EVENTS)]
    assert reasons == ["Throttled", "Throttled", "EvictionBlocked", "EvictionBlocked"]
    stub.requests.clear()
    applier.apply(EngineOutput(decisions=(ev,), pod_patches=(), statuses=()), ctx())
    assert calls(stub) == ["POST eviction"]  # its Events are there already


def test_a_keyed_event_posted_before_a_restart_is_updated_not_repeated(stub):
    pod = ObjectRef("v1", "Pod", "ml", "w0", "uid-w0")
    first = EventRecorder(client.CoreV1Api(stub.api_client()))
    assert first.post(pod, STEP)
    (created,) = bodies(stub, "POST", EVENTS)
    assert created["metadata"]["name"] == keyed_name(pod, STEP.key) and created["count"] == 1
    assert first.post(pod, STEP) and len(stub.requests) == 1  # known: nothing to do
    stub.respond("POST", EVENTS, (409, status_body(409, "AlreadyExists")))
    restarted = EventRecorder(client.CoreV1Api(stub.api_client()))
    assert restarted.post(pod, replace(STEP, message="budget ml/train: throttled (again)"))
    (update,) = bodies(stub, "PATCH", EVENTS)
    assert set(update) == {"message", "lastTimestamp"}  # the count stays: the same occurrence
    assert re.search(rf"/events/{re.escape(keyed_name(pod, STEP.key))}$", stub.requests[-1].path)


def test_keyed_names_are_valid_and_differ_by_object_and_key():
    long = ObjectRef("v1", "Pod", "ml", "w" * 253, "uid-1")
    name = keyed_name(long, "k")
    assert len(name) <= 253 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name)
    other = ObjectRef("v1", "Pod", "ml", "w" * 253, "uid-2")
    assert len({name, keyed_name(other, "k"), keyed_name(long, "k2")}) == 3


def test_object_problems_are_posted_once_on_their_object(stub):
    applier, metrics = make(stub.api_client())
    report = ObjectProblem("NodeGPUUsage", "", "node-a", "uid-r", "ReportInvalid", "the report of node-a ...")
    held = ObjectProblem("GPUMemoryBudget", "ml", "train", "uid-train", "InvalidSpec", "spec.limits...: 1e400")
    out = EngineOutput(decisions=(), pod_patches=(), statuses=(), object_problems=(report, held))
    applier.apply(out, ctx())
    applier.apply(out, ctx())  # the next evaluation: already reported
    events = {b["involvedObject"]["kind"]: b for b in bodies(stub, "POST", r"/events$")}
    assert set(events) == {"NodeGPUUsage", "GPUMemoryBudget"} and len(stub.requests) == 2
    assert events["NodeGPUUsage"]["metadata"]["namespace"] == "default"  # a cluster-scoped object's Events
    assert "namespace" not in events["NodeGPUUsage"]["involvedObject"]
    assert events["GPUMemoryBudget"]["reason"] == "InvalidSpec"
    sample = metrics.registry.get_sample_value
    assert sample("vramguard_object_problems_total", {"kind": "NodeGPUUsage", "reason": "ReportInvalid"}) == 1


def test_a_repost_posts_events_and_counts_no_new_action(stub):
    applier, metrics = make(stub.api_client())
    ann = Annotate(**{**common(), "event": EventSpec("Warning", "LimitExceeded", "m", key="k")}, repost=True)
    out = EngineOutput(decisions=(ann,), statuses=(), pod_patches=(PodPatch(POD, {}, {ANNOTATION_VIOLATIONS: "x"}),))
    applier.apply(out, ctx())
    assert calls(stub) == ["POST event", "POST event", "PATCH pod"]
    assert metrics.registry.get_sample_value(
        "vramguard_actions_total", {"action": "Annotate", "result": "success", "namespace": "ml"}) is None
