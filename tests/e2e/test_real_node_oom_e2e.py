"""OOM records on the real node (docs/oom.md): real processes on the simulated GPU,
the real kubelet, the agent on the host over the simulated driver, the operator
as a subprocess; all in real time.

- ``chat`` holds 15Gi of the simulated H100 (79.1 GiB usable, four
  time-slicing replicas: a share of 19.8Gi each) and after 25 s asks for 19Gi,
  within its share; ``finetune`` grows 3Gi a second to 62Gi. chat's allocation
  is refused (simcuda prints PyTorch's message and exits 1): the Event on chat
  says GPUOutOfMemory, innocent, naming finetune above its share; the latency
  from the container's end to the Event is printed.
- a pod alone growing past its share until the device refuses it: ``Own``.
- a RAM hog past its memory limit (busybox ``tail /dev/zero``) beside a GPU
  process: the kubelet's OOMKilled -> HostOutOfMemory, VRAM named as not the cause.
- a pod deleted (simcuda exits 0 on SIGTERM): no OOM Event.

Containers use ``terminationMessagePolicy: FallbackToLogsOnError``, as the
mutating webhook sets it (the webhook does not run in this test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Cluster
from .operator_harness import GI, OperatorProcess, events_about, stop_agent, wait_for
from .realnode import ROOT, RealNode, pod
from .test_real_node_e2e import run_pod
from .test_real_node_pressure_e2e import gpu_replica_pod, sizes

pytestmark = pytest.mark.e2e
OOM_REASONS = ("GPUOutOfMemory", "HostOutOfMemory", "GPUMemoryCapKill")


def fallback(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    manifest["spec"]["restartPolicy"] = "Never"
    return manifest


@pytest.fixture
def running(cluster: Cluster, gpu_node: RealNode, namespace: str) -> Iterator[OperatorProcess]:
    """The operator for ``namespace`` and the agent on the real node."""
    operator = OperatorProcess(cluster.kubeconfig, [namespace], ["--evaluation-period=1s", "--debounce=10ms"])
    operator.start()
    agent = subprocess.Popen(
        [sys.executable, "-m", "vramguard_agent", "run", "--node", gpu_node.name,
         "--kubeconfig", cluster.kubeconfig, "--backend", "simdriver", "--simgpu-socket", str(gpu_node.simgpu_socket),
         "--sample-interval", "1s", "--min-report-interval", "1s", "--heartbeat", "5s", "--metrics-address", ""],
        env={**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "agent", "sim"))},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        yield operator
    finally:
        stop_agent(agent, 2000)
        operator.stop()
        print(f"--- operator log ({operator.log}) ---\n{operator.tail(30)}")


def oom_event(core: client.CoreV1Api, namespace: str, uid: str, timeout: float) -> Any:
    found = wait_for(lambda: [e for e in events_about(core, namespace, uid) if e.reason in OOM_REASONS], timeout,
                     "an OOM Event", interval=0.25)
    return found[0]


def finished_at(core: client.CoreV1Api, namespace: str, name: str) -> datetime:
    status = core.read_namespaced_pod(name, namespace).status.container_statuses[0]
    term = status.state.terminated or status.last_state.terminated
    assert term is not None
    return term.finished_at


def test_a_pod_refused_because_a_neighbour_grew_is_innocent_and_names_it(
    cluster: Cluster, gpu_node: RealNode, namespace: str, running: OperatorProcess
) -> None:
    core = client.CoreV1Api(cluster.api_client())
    chat, _ = run_pod(cluster, gpu_node, namespace, fallback(gpu_replica_pod(
        gpu_node, "chat", sizes((15 * GI, 25), (19 * GI, 1)))))
    run_pod(cluster, gpu_node, namespace, gpu_replica_pod(
        gpu_node, "finetune", sizes((14 * GI, 5), *((g * GI, 1) for g in range(17, 62, 3)), (62 * GI, 1))))
    event = oom_event(core, namespace, chat["metadata"]["uid"], 90)
    latency = ((event.first_timestamp or event.event_time) - finished_at(core, namespace, "chat")).total_seconds()
    print(f"\ninnocent OOM: Event {latency:.1f} s after chat's container ended\n{event.message}")
    assert event.reason == "GPUOutOfMemory" and "innocent" in event.message
    assert f"{namespace}/finetune held" in event.message and "above its share" in event.message
    assert "PyTorch said" in event.message
    counted = [s.value for family in text_string_to_metric_families(running.metrics()) for s in family.samples
               if s.name == "vramguard_oom_kills_total" and s.labels == {
                   "namespace": namespace, "kind": "GPUOutOfMemory", "verdict": "Innocent"}]
    assert counted == [1.0]


def test_a_pod_growing_past_its_own_share_is_own(
    cluster: Cluster, gpu_node: RealNode, namespace: str, running: OperatorProcess
) -> None:
    core = client.CoreV1Api(cluster.api_client())
    big, _ = run_pod(cluster, gpu_node, namespace, fallback(gpu_replica_pod(
        gpu_node, "big", sizes((10 * GI, 5), *((g * GI, 1) for g in range(20, 90, 10))))))
    event = oom_event(core, namespace, big["metadata"]["uid"], 90)
    print(f"\nown OOM:\n{event.message}")
    assert event.reason == "GPUOutOfMemory" and "its own" in event.message


def test_a_ram_hog_past_its_limit_is_a_host_oom_not_vram(
    cluster: Cluster, gpu_node: RealNode, namespace: str, running: OperatorProcess
) -> None:
    core = client.CoreV1Api(cluster.api_client())
    script = f"/bin/simcuda --every 1s {2 * GI} & sleep 5; tail /dev/zero"
    manifest = fallback(pod(gpu_node, "hog", script, gpu=True, memory=("64Mi", "64Mi"), labels={"app": "hog"}))
    for kind in ("requests", "limits"):
        manifest["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpu"] = "1"
    hog, _ = run_pod(cluster, gpu_node, namespace, manifest)
    event = oom_event(core, namespace, hog["metadata"]["uid"], 90)
    print(f"\nhost OOM:\n{event.message}")
    assert event.reason == "HostOutOfMemory" and "not VRAM" in event.message


def test_a_normal_exit_makes_no_oom_event(
    cluster: Cluster, gpu_node: RealNode, namespace: str, running: OperatorProcess
) -> None:
    core = client.CoreV1Api(cluster.api_client())
    calm, _ = run_pod(cluster, gpu_node, namespace, fallback(gpu_replica_pod(gpu_node, "calm", sizes((GI, 1)))))
    time.sleep(3)
    cluster.kubectl("delete", "pod", "-n", namespace, "calm", "--wait=true", "--timeout=60s")
    time.sleep(8)  # several agent samples and an operator pass
    assert not [e for e in events_about(core, namespace, calm["metadata"]["uid"]) if e.reason in OOM_REASONS]
