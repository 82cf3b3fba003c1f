"""The operator publishes end records (controller/oom.py): the real kubernetes client
against a scripted API server: the pod is read, the Event posted, the metric counted,
the records acknowledged on the report; nothing twice, nothing for a normal exit."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from tests.unit.agent.stubapi import StubAPI, status_body
from vramguard_api.ends import ACK_ANNOTATION
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.controller.events import EventRecorder
from vramguard_operator.controller.oom import OOMPublisher, oom_counter
from vramguard_operator.plan.changes import Change
from vramguard_operator.plan.entries import budget_entry, report_entry

GIB = 1 << 30
DEV = "GPU-00000000-0000-0000-0000-000000000000"
CID = "c" * 64
TORCH = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 22 GiB"
NODE = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy":
                                              "time-slicing"}},
        "status": {"allocatable": {"nvidia.com/gpu": "2"}}}


def end(id_: int, name: str, cid: str) -> dict[str, Any]:
    return {"id": id_, "time": "2026-01-01T00:00:00Z", "kind": "ContainerEnd", "podUID": f"uid-{name}",
            "namespace": "ml", "name": name, "containerID": cid, "containerName": "main",
            "devices": [{"uuid": DEV, "podBytes": 4 * GIB, "freeBytes": GIB // 4, "usableBytes": 20 * GIB,
                         "neighbours": [{"uid": "uid-greedy", "namespace": "ml", "name": "greedy",
                                         "usedBytes": 15 * GIB}]}]}


def report_body(ack: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "n1", "uid": "r1", "resourceVersion": "1"}
    if ack is not None:
        meta["annotations"] = {ACK_ANNOTATION: str(ack)}
    return {"apiVersion": "vramguard.io/v1alpha1", "kind": "NodeGPUUsage", "metadata": meta,
            "spec": {"nodeName": "n1"},
            "status": {"sampleTime": "2026-01-01T00:00:10Z",
                       "devices": [{"uuid": DEV, "index": 0, "memory": {"totalBytes": 20 * GIB,
                                                                         "usableBytes": 20 * GIB}}],
                       "ends": [end(10, "victim", CID), end(11, "done", "d" * 64)]}}


def pod(name: str, cid: str, reason: str, code: int, message: str | None) -> dict[str, Any]:
    term = {"reason": reason, "exitCode": code, "containerID": f"containerd://{cid}"}
    if message:
        term["message"] = message
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main"}]},
            "status": {"containerStatuses": [{"name": "main", "image": "x", "imageID": "", "ready": False,
                                              "restartCount": 1, "lastState": {"terminated": term}}]}}


@pytest.fixture
def stub():
    s = StubAPI()
    yield s
    s.close()


def publisher(stub: StubAPI) -> tuple[OOMPublisher, CollectorRegistry]:
    api = stub.api_client()
    registry = CollectorRegistry()
    recorder = EventRecorder(client.CoreV1Api(api), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    return OOMPublisher(api, recorder, oom_counter(registry), lambda: {"n1": NODE}), registry


def model(body: dict[str, Any]) -> NodeGPUUsage:
    entry = report_entry(body).value
    assert isinstance(entry, NodeGPUUsage)
    return entry


def test_publish_reads_the_pod_posts_the_event_counts_and_acknowledges(stub):
    stub.respond("GET", r"/namespaces/ml/pods/victim$", (200, pod("victim", CID, "Error", 1, TORCH)))
    stub.respond("GET", r"/namespaces/ml/pods/done$", (200, pod("done", "d" * 64, "Completed", 0, None)))
    pub, registry = publisher(stub)
    found = pub.publish(model(report_body()))
    assert [(f.verdict.kind, f.verdict.blame) for f in found] == [("GPUOutOfMemory", "Innocent"), ("NotMemory", None)]
    events = [q.body for q in stub.requests if q.method == "POST" and q.path.endswith("/events")]
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [("GPUOutOfMemory", "victim")]
    assert "ml/greedy held 15Gi, 5Gi above its share" in events[0]["message"]  # share: 20Gi / 2 replicas
    assert registry.get_sample_value("vramguard_oom_kills_total", {"namespace": "ml", "kind": "GPUOutOfMemory",
                                                                   "verdict": "Innocent"}) == 1
    (ack,) = [q for q in stub.requests if q.method == "PATCH" and q.path.endswith("/nodegpuusages/n1")]
    assert ack.body == {"metadata": {"annotations": {ACK_ANNOTATION: "11"}}}
    # The same report again (the agent has not yet dropped them): nothing twice.
    before = len(stub.requests)
    assert pub.publish(model(report_body())) == [] and len(stub.requests) == before


def test_an_operator_restart_resumes_after_the_acknowledged_records(stub):
    stub.respond("GET", r"/namespaces/ml/pods/done$", (200, pod("done", "d" * 64, "Completed", 0, None)))
    pub, _ = publisher(stub)  # a fresh publisher: it knows only the annotation
    found = pub.publish(model(report_body(ack=10)))
    assert [f.record.id for f in found] == [11]


def test_a_gone_pod_is_judged_on_the_record_and_a_failed_ack_is_retried(stub):
    stub.respond("GET", r"/pods/", *[(404, status_body(404, "NotFound"))] * 4)
    stub.respond("PATCH", r"/nodegpuusages/n1$", (500, status_body(500, "InternalError")))
    pub, _ = publisher(stub)
    assert len(pub.publish(model(report_body()))) == 2
    assert len(pub.publish(model(report_body()))) == 2  # not acknowledged: published again


def test_observe_queues_only_reports_with_ends():
    pub = OOMPublisher(client.ApiClient(), EventRecorder(client.CoreV1Api(client.ApiClient())),
                       oom_counter(CollectorRegistry()), dict)
    with_ends = report_entry(report_body())
    without = report_entry({**report_body(), "status": {"sampleTime": "2026-01-01T00:00:10Z"}})
    for change in (Change("reports", "n1", None, with_ends), Change("reports", "n1", None, without),
                   Change("pods", "x", None, with_ends), Change("reports", "n1", with_ends, None)):
        pub.observe(change)
    assert pub.queue.qsize() == 1


def test_the_budgets_of_the_victim_and_of_the_neighbour_above_its_share_get_the_event_too(stub):
    victim = pod("victim", CID, "Error", 1, TORCH)
    victim["metadata"]["labels"] = {"app": "victim"}
    greedy = {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "ml", "name": "greedy", "uid": "uid-greedy",
                                                              "labels": {"app": "greedy"}}}
    stub.respond("GET", r"/namespaces/ml/pods/victim$", (200, victim))
    stub.respond("GET", r"/namespaces/ml/pods/greedy$", (200, greedy))
    stub.respond("GET", r"/namespaces/ml/pods/done$", (200, pod("done", "d" * 64, "Completed", 0, None)))
    budgets = {("ml", n): budget_entry({"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryBudget",
                                        "metadata": {"namespace": "ml", "name": n, "uid": f"b-{n}"},
                                        "spec": {"selector": {"matchLabels": {"app": app}},
                                                 "limits": {"perPod": {"vram": "10Gi"}}}})
               for n, app in (("team-victim", "victim"), ("team-greedy", "greedy"), ("other", "nobody"))}
    api = stub.api_client()
    pub = OOMPublisher(api, EventRecorder(client.CoreV1Api(api)), oom_counter(CollectorRegistry()),
                       lambda: {"n1": NODE}, budgets=lambda: budgets)
    pub.publish(model(report_body()))
    events = [q.body for q in stub.requests if q.method == "POST" and q.path.endswith("/events")]
    on = sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events)
    assert on == [("GPUMemoryBudget", "team-greedy"), ("GPUMemoryBudget", "team-victim"), ("Pod", "victim")]
    budget_messages = [e["message"] for e in events if e["involvedObject"]["kind"] == "GPUMemoryBudget"]
    assert all(m.startswith("budget ml/team-") and "pod ml/victim" in m for m in budget_messages)


def test_a_record_waits_for_the_kubelet_to_report_its_container_terminated(stub):
    running = pod("victim", CID, "Error", 1, TORCH)
    running["status"]["containerStatuses"][0].update({"containerID": f"containerd://{CID}", "state": {"running": {}}})
    stub.respond("GET", r"/namespaces/ml/pods/victim$", (200, running), (200, pod("victim", CID, "Error", 1, TORCH)))
    stub.respond("GET", r"/namespaces/ml/pods/done$", (200, pod("done", "d" * 64, "Completed", 0, None)))
    api = stub.api_client()
    now = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)  # 5 s after the agent noticed the ends
    pub = OOMPublisher(api, EventRecorder(client.CoreV1Api(api)), oom_counter(CollectorRegistry()),
                       lambda: {"n1": NODE}, clock=lambda: now)
    report = model(report_body())
    assert pub.publish(report) == []  # still running in the pod's status: nothing published, nothing acknowledged
    assert not [q for q in stub.requests if q.method in ("POST", "PATCH")]
    assert pub.queue.get(timeout=3) is report  # looked at again a second later
    found = pub.publish(report)
    assert [f.verdict.kind for f in found] == ["GPUOutOfMemory", "NotMemory"]


def test_the_victims_budget_counts_the_kill_in_its_status_from_what_it_held(stub):
    victim = pod("victim", CID, "Error", 1, TORCH)
    victim["metadata"]["labels"] = {"app": "victim"}
    stub.respond("GET", r"/namespaces/ml/pods/victim$", (200, victim), (200, victim))
    stub.respond("GET", r"/namespaces/ml/pods/greedy$", (404, status_body(404, "NotFound")))
    stub.respond("GET", r"/namespaces/ml/pods/done$", (200, pod("done", "d" * 64, "Completed", 0, None)))
    stub.respond("PATCH", r"/gpumemorybudgets/team-victim/status$", (200, {}), (200, {}))
    stored = {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryBudget",
              "metadata": {"namespace": "ml", "name": "team-victim", "uid": "b-1"},
              "spec": {"selector": {"matchLabels": {"app": "victim"}}, "limits": {"perPod": {"vram": "10Gi"}}},
              "status": {"oomKills": {"innocent": 2, "host": 1, "lastKillTime": "2025-12-31T00:00:00Z"}}}
    budgets = {("ml", "team-victim"): budget_entry(stored)}
    api = stub.api_client()
    pub = OOMPublisher(api, EventRecorder(client.CoreV1Api(api)), oom_counter(CollectorRegistry()),
                       lambda: {"n1": NODE}, budgets=lambda: budgets)
    pub.publish(model(report_body()))
    again = report_body(ack=11)
    again["status"]["ends"] = [{**end(12, "victim", CID), "time": "2026-01-01T00:01:00Z"}]
    pub.publish(model(again))  # the store still shows the old status: the count goes on from the last write
    writes = [q.body for q in stub.requests if q.method == "PATCH" and q.path.endswith("/team-victim/status")]
    assert writes == [
        {"status": {"oomKills": {"innocent": 3, "own": 0, "unknown": 0, "host": 1, "cap": 0,
                                 "lastKillTime": "2026-01-01T00:00:00Z"}}},
        {"status": {"oomKills": {"innocent": 4, "own": 0, "unknown": 0, "host": 1, "cap": 0,
                                 "lastKillTime": "2026-01-01T00:01:00Z"}}},
    ]  # the normal exit of ml/done is no OOM kill: not counted
