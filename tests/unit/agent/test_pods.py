"""Pod names from the API: parsing, the index, and the node-scoped list + watch."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from vramguard_agent.pods import PodIndex, PodMeta, PodWatcher, container_id, pod_meta

from .builders import pod_json
from .stubapi import StubAPI

A, B = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
CA, CB = "a" * 64, "b" * 64
LIST = r"^/api/v1/pods\?(?!.*watch=true)"
WATCH = r"^/api/v1/pods\?.*watch=true"


def test_container_id_strips_the_runtime_scheme():
    assert container_id(f"containerd://{CA}") == CA
    assert container_id(f"cri-o://{CA}") == CA
    assert container_id("") is None and container_id(None) is None


def test_pod_meta_from_api_json():
    meta = pod_meta(pod_json("p", A, "ns", containers={"main": CA, "waiting": None}, qos="Guaranteed"))
    assert meta == PodMeta(A, "ns", "p", "guaranteed", {CA: "main"}, None, gpu=True)
    assert pod_meta(pod_json("q", B, gpu=False)).gpu is False


def test_static_mirror_pod_carries_its_config_hash():
    config_hash = "03671a0313f5acf27bef3683009923f8"
    meta = pod_meta(pod_json("etcd", A, annotations={"kubernetes.io/config.mirror": config_hash}))
    index = PodIndex([meta])
    snapshot = index.snapshot()
    assert snapshot[A] is meta and snapshot[config_hash] is meta


def test_pod_meta_names_a_missing_field():
    body = pod_json("p", A)
    del body["metadata"]["uid"]
    with pytest.raises(KeyError, match="metadata.uid"):
        pod_meta(body)


def test_watcher_fills_the_index_it_was_given_even_when_empty():
    index = PodIndex()
    assert PodWatcher(core_v1=None, node_name="n", index=index).index is index


def _events(*events: tuple[str, dict]) -> bytes:
    return b"".join(json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in events)


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def stub():
    s = StubAPI()
    yield s
    s.close()


def test_lists_and_watches_only_this_nodes_pods(stub):
    stub.respond(
        "GET", LIST, (200, {"kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": [pod_json("a", A)]})
    )
    stub.respond(
        "GET",
        WATCH,
        (
            200,
            _events(
                ("ADDED", pod_json("b", B, containers={"main": CB}, resource_version="11")),
                ("MODIFIED", pod_json("a", A, containers={"main": CA}, resource_version="12")),
                ("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "13"}}),
            ),
        ),
        (200, b"", 0.5),  # a quiet watch
    )
    watcher = PodWatcher(client.CoreV1Api(stub.api_client()), "node-a", backoff_s=0.05)
    watcher.start()
    try:
        assert _wait(lambda: watcher.index.snapshot().get(A) is not None and watcher.index.snapshot()[A].containers)
        assert watcher.index.synced.is_set()
        assert set(watcher.index.snapshot()) == {A, B}
        assert _wait(lambda: sum("watch=true" in q.path for q in stub.requests) >= 2)
    finally:
        watcher.stop()
    paths = [q.path for q in stub.requests]
    assert all("fieldSelector=spec.nodeName%3Dnode-a" in p for p in paths)
    assert "resourceVersion=10" in paths[1]
    assert "resourceVersion=13" in paths[2]  # resumed after the bookmark


def test_deleted_pods_leave_the_index_and_410_relists(stub):
    stub.respond(
        "GET",
        LIST,
        (200, {"metadata": {"resourceVersion": "1"}, "items": [pod_json("a", A), pod_json("b", B)]}),
        (200, {"metadata": {"resourceVersion": "50"}, "items": [pod_json("b", B)]}),
    )
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    stub.respond(
        "GET",
        WATCH,
        (200, _events(("DELETED", pod_json("b", B, resource_version="2")), ("ERROR", gone))),
        (200, b"", 0.5),
    )
    watcher = PodWatcher(client.CoreV1Api(stub.api_client()), "node-a", backoff_s=0.05)
    watcher.start()
    try:
        assert _wait(lambda: sum("watch=true" not in q.path for q in stub.requests) >= 2)
        assert _wait(lambda: set(watcher.index.snapshot()) == {B})
    finally:
        watcher.stop()


def test_api_errors_are_retried_with_backoff(stub):
    stub.respond(
        "GET",
        LIST,
        (500, {"kind": "Status", "code": 500}),
        (200, {"metadata": {"resourceVersion": "3"}, "items": [pod_json("a", A)]}),
    )
    stub.respond("GET", WATCH, (200, b"", 0.5))
    watcher = PodWatcher(client.CoreV1Api(stub.api_client()), "node-a", backoff_s=0.05)
    watcher.start()
    try:
        assert _wait(lambda: watcher.index.synced.is_set())
        assert set(watcher.index.snapshot()) == {A}
    finally:
        watcher.stop()


def test_pod_meta_carries_the_memory_limits_annotation_as_written():
    text = '{"GPU-1":{"hardLimit":21474836480}}'
    meta = pod_meta(pod_json("p", A, annotations={"vramguard.io/memory-limits": text}))
    assert meta.memory_limits == text
    assert pod_meta(pod_json("q", B)).memory_limits is None
