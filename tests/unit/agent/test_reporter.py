"""Writing NodeGPUUsage through the real kubernetes client against a scripted API server:
create, status patch, 404/409 handling, outages with backoff, never raising."""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import pytest
from kubernetes import client

from vramguard_agent.reporter import Reporter, backoff_delay, manifest
from vramguard_api.usage import NodeGPUUsageStatus

from .stubapi import StubAPI, status_body

COLLECTION = r"^/apis/vramguard\.io/v1alpha1/nodegpuusages(\?|$)"
STATUS = r"^/apis/vramguard\.io/v1alpha1/nodegpuusages/node-a/status"


@pytest.fixture
def stub():
    s = StubAPI()
    yield s
    s.close()


def status() -> NodeGPUUsageStatus:
    return NodeGPUUsageStatus(sampleTime=datetime(2025, 1, 1, tzinfo=UTC))


def reporter(api_client, now, core=None) -> Reporter:
    return Reporter(client.CustomObjectsApi(api_client), "node-a", core_v1=core, clock=lambda: now[0], jitter=0.0)


def test_creates_with_owner_reference_then_merge_patches_status(stub):
    stub.respond("GET", r"^/api/v1/nodes/node-a", (200, {"metadata": {"name": "node-a", "uid": "node-uid-1"}}))
    now = [0.0]
    r = reporter(stub.api_client(), now, core=client.CoreV1Api(stub.api_client()))
    assert r.publish(status())
    assert r.publish(status())
    methods = [(q.method, q.path.split("?")[0]) for q in stub.requests]
    assert methods == [
        ("GET", "/api/v1/nodes/node-a"),
        ("POST", "/apis/vramguard.io/v1alpha1/nodegpuusages"),
        ("PATCH", "/apis/vramguard.io/v1alpha1/nodegpuusages/node-a/status"),
        ("PATCH", "/apis/vramguard.io/v1alpha1/nodegpuusages/node-a/status"),
    ]
    created = stub.requests[1].body
    assert created["spec"] == {"nodeName": "node-a"}
    assert created["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"
    patch = stub.requests[2]
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {"status": status().to_api()}


def test_existing_object_409_on_create_is_fine(stub):
    stub.respond("POST", COLLECTION, (409, status_body(409, "AlreadyExists")))
    assert reporter(stub.api_client(), [0.0]).publish(status())
    assert [q.method for q in stub.requests] == ["POST", "PATCH"]


def test_deleted_object_is_recreated_on_404(stub):
    stub.respond("PATCH", STATUS, (200, {}), (404, status_body(404, "NotFound")))
    r = reporter(stub.api_client(), [0.0])
    assert r.publish(status()) and r.publish(status())
    assert [q.method for q in stub.requests] == ["POST", "PATCH", "PATCH", "POST", "PATCH"]


def test_server_errors_back_off_and_recover(stub):
    stub.respond("PATCH", STATUS, (500, status_body(500, "InternalError")), (503, status_body(503, "Unavailable")))
    now = [0.0]
    r = reporter(stub.api_client(), now)
    assert not r.publish(status())
    assert r.failures == 1 and r.retry_at == 1.0 and "500" in r.last_error
    now[0] = 0.5
    assert not r.publish(status())  # waiting out the backoff: no request
    assert len(stub.requests) == 2
    now[0] = 1.0
    assert not r.publish(status())
    assert r.failures == 2 and r.retry_at == 3.0
    now[0] = 3.0
    assert r.publish(status())
    assert r.failures == 0 and r.last_error is None


def test_invalid_status_is_logged_not_raised(stub):
    stub.respond("PATCH", STATUS, (422, status_body(422, "Invalid")))
    assert not reporter(stub.api_client(), [0.0]).publish(status())


def test_api_server_down_never_raises():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    config.retries = 0
    r = reporter(client.ApiClient(config), [0.0])
    assert not r.publish(status())
    assert r.failures == 1 and r.last_error


def test_backoff_delay_doubles_up_to_the_cap():
    assert [backoff_delay(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_manifest_without_node_uid_has_no_owner():
    body = manifest("n1")
    assert body["kind"] == "NodeGPUUsage" and body["apiVersion"] == "vramguard.io/v1alpha1"
    assert "ownerReferences" not in body["metadata"] and body["metadata"]["name"] == "n1"
