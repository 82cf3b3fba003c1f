"""Prometheus exposition with dcgm-exporter's labels, and the HTTP endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vramguard_agent.metrics import AgentMetrics, ContainerDeviceUsage, Health, Snapshot, serve
from vramguard_api.trend import TrendFeatures
from vramguard_api.usage import (
    ContainerUsage,
    DeviceMemory,
    GPUDevice,
    NodeGPUUsageStatus,
    PodUsage,
    UnattributedProcess,
)

from .builders import GIB

PARENT = "GPU-a100"
MIG = "MIG-1g5gb"


def status() -> NodeGPUUsageStatus:
    memory = DeviceMemory(totalBytes=40 * GIB, reservedBytes=GIB, usedBytes=3 * GIB, usableBytes=39 * GIB)
    return NodeGPUUsageStatus(
        sampleTime=datetime(2025, 1, 1, tzinfo=UTC),
        devices=[
            GPUDevice(uuid=PARENT, index=0, modelName="NVIDIA A100-SXM4-40GB", migEnabled=True, memory=memory),
            GPUDevice(
                uuid=MIG,
                index=0,
                modelName="NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                parentUUID=PARENT,
                migProfile="1g.5gb",
                gpuInstanceId=9,
                computeInstanceId=0,
                memory=DeviceMemory(totalBytes=5 * GIB, usedBytes=2 * GIB, usableBytes=5 * GIB),
                processBytes=2 * GIB,
            ),
        ],
        pods=[
            PodUsage(
                uid="u1",
                namespace="ml",
                name="ocr-0",
                vramBytes=2 * GIB,
                ramWorkingSetBytes=GIB,
                containers=[ContainerUsage(name="ocr", containerID="a" * 64, ramWorkingSetBytes=GIB, oomKills=3)],
                trend=TrendFeatures(windowSeconds=60, samples=6, growthBytesPerHour=1234.0, floorRiseBytes=0.0),
            ),
            PodUsage(uid="u2", namespace="ml", name="unknown-0", attribution="Unknown"),
        ],
        unattributed=[UnattributedProcess(pid=5, device=MIG, usedBytes=GIB, reason="not in a pod")],
    )


def families(metrics: AgentMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}


def samples(family, **labels):
    return [s for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())]


def test_device_series_use_dcgm_exporter_labels():
    m = AgentMetrics("node-a")
    m.update(Snapshot("node-a", status(), lambda: [ContainerDeviceUsage("ml", "ocr-0", "ocr", MIG, 2 * GIB)]))
    f = families(m)
    (mig,) = samples(f["vramguard_gpu_memory_used_bytes"], GPU_I_ID="9")
    assert mig.labels == {
        "gpu": "0",
        "UUID": PARENT,  # dcgm-exporter names MIG series by the parent GPU
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-40GB",
        "Hostname": "node-a",
        "GPU_I_PROFILE": "1g.5gb",
        "GPU_I_ID": "9",
    }
    assert mig.value == 2 * GIB
    (container,) = f["vramguard_container_gpu_memory_used_bytes"].samples
    assert (container.labels["namespace"], container.labels["pod"], container.labels["container"]) == (
        "ml",
        "ocr-0",
        "ocr",
    )
    assert container.labels["GPU_I_ID"] == "9" and container.value == 2 * GIB
    assert samples(f["vramguard_gpu_unattributed_memory_bytes"], GPU_I_ID="9")[0].value == GIB
    assert samples(f["vramguard_gpu_memory_reserved_bytes"], GPU_I_ID="")[0].value == GIB


def test_unknown_values_are_absent_not_zero():
    m = AgentMetrics("node-a")
    m.update(Snapshot("node-a", status()))
    f = families(m)
    pods = {s.labels["pod"] for s in f["vramguard_pod_gpu_memory_used_bytes"].samples}
    assert pods == {"ocr-0"}
    # The parent's per-process sum is unknown here (not set): no series for it.
    assert [s.labels["GPU_I_ID"] for s in f["vramguard_gpu_process_memory_bytes"].samples] == ["9"]


def test_pod_container_and_trend_series():
    m = AgentMetrics("node-a")
    m.update(Snapshot("node-a", status()))
    f = families(m)
    assert samples(f["vramguard_pod_memory_working_set_bytes"], pod="ocr-0")[0].value == GIB
    assert samples(f["vramguard_container_memory_working_set_bytes"], container="ocr")[0].value == GIB
    (oom,) = f["vramguard_container_oom_kills"].samples
    assert oom.name == "vramguard_container_oom_kills_total" and oom.value == 3
    assert samples(f["vramguard_pod_gpu_memory_growth_bytes_per_hour"], pod="ocr-0")[0].value == 1234.0


def test_no_sample_yet_exports_only_agent_metrics():
    f = families(AgentMetrics("node-a"))
    assert "vramguard_gpu_memory_used_bytes" not in f and "vramguard_agent_sample_duration_seconds" in f


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_http_endpoints():
    now = [0.0]
    synced = [False]
    m = AgentMetrics("node-a")
    health = Health(stale_after_s=30, clock=lambda: now[0], pods_synced=lambda: synced[0])
    server = serve("127.0.0.1:0", m, health)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz") == (503, "no sample yet\n")
        health.tick()
        health.sampled = True
        assert _get(base + "/readyz") == (503, "pods not listed yet\n")
        synced[0] = True
        assert _get(base + "/readyz")[0] == 200
        now[0] = 31.0
        assert _get(base + "/healthz")[0] == 503
        code, body = _get(base + "/metrics")
        assert code == 200 and "vramguard_agent_samples" in body
        assert _get(base + "/nope")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("address", "host"), [("127.0.0.1:0", "127.0.0.1"), (":0", "0.0.0.0")])
def test_serve_accepts_host_port_forms(address, host):
    """``host:port`` binds that host; ``:port`` binds every interface; port 0 picks a free port."""
    server = serve(address, AgentMetrics("n"), Health(stale_after_s=1))
    try:
        bound_host, port = server.server_address[:2]
        assert bound_host == host and port > 0
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
