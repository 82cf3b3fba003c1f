"""Device pressure on the real node: the rule saves a real neighbour process.

Two real pods share the simulated H100 (79.1 GiB usable) of the real node,
each requesting one of its four time-slicing replicas (``nvidia.com/gpu: 1``),
so each pod's implicit budget is the node's share, 19.8Gi. A GPUMemoryPolicy
keeps 5% of each device free (``devicePressure``) in this test's namespace.

- ``chat`` holds 15Gi (within its share), and after 75 s needs 19Gi, still
  within its share;
- ``finetune`` holds 14Gi, then grows 3Gi a second to 62Gi and stays there.

Without the rule, 62Gi + 15Gi leaves 2.1Gi free and chat's later allocation of
4Gi fails: chat would die of CUDA out-of-memory although it never left its
share. With it, the operator evicts finetune (through the real kubelet) as
soon as the free memory falls under what chat needs to reach its share, and
chat gets its 19Gi. The agent runs on the host over the simulated driver
(``--backend simdriver --simgpu-socket``), the operator as a subprocess; all in real time. Facts
come from the driver's own state (over its socket), pod status and Events.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .conftest import Cluster
from .operator_harness import GI, GROUP, VERSION, OperatorProcess, events_about, stop_agent, wait_for
from .realnode import ROOT, RealNode, driver_state, pod
from .test_real_node_e2e import run_pod

pytestmark = pytest.mark.e2e
CHAT_GROWS_AFTER_S = 75


def sizes(*steps: tuple[int, int]) -> list[str]:
    """simcuda's sizes, one a second: ``(bytes, seconds)`` pairs."""
    return [str(b) for b, n in steps for _ in range(n)]


def gpu_replica_pod(node: RealNode, name: str, schedule: list[str]) -> dict[str, Any]:
    """A pod on the real node holding one time-slicing replica and running simcuda's ``schedule``."""
    manifest = pod(node, name, ["/bin/simcuda", "--every", "1s", *schedule], gpu=True, labels={"app": name})
    for kind in ("requests", "limits"):
        manifest["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpu"] = "1"
    return manifest


@pytest.fixture
def pressure_policy(cluster: Cluster, namespace: str) -> Iterator[str]:
    custom = client.CustomObjectsApi(cluster.api_client())
    name = f"pressure-{namespace}"[:63]
    custom.create_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryPolicy", "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "devicePressure": {"minFree": "5%"}},
    })
    yield name
    try:
        custom.delete_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", name)
    except ApiException as err:
        if err.status != 404:
            raise


def test_device_pressure_evicts_the_over_share_pod_and_saves_its_real_neighbour(
    cluster: Cluster, gpu_node: RealNode, namespace: str, pressure_policy: str
) -> None:
    core = client.CoreV1Api(cluster.api_client())
    operator = OperatorProcess(cluster.kubeconfig, [namespace], [
        "--evaluation-period=1s", "--debounce=10ms", "--freshness=20s", "--eviction-retry=2s"])
    agent: subprocess.Popen[bytes] | None = None
    try:
        operator.start()
        chat, chat_pid = run_pod(cluster, gpu_node, namespace, gpu_replica_pod(
            gpu_node, "chat", sizes((15 * GI, CHAT_GROWS_AFTER_S), (19 * GI, 1))))
        ft, ft_pid = run_pod(cluster, gpu_node, namespace, gpu_replica_pod(
            gpu_node, "finetune", sizes((14 * GI, 10), *((g * GI, 1) for g in range(17, 62, 3)), (62 * GI, 1))))
        agent = subprocess.Popen(
            [sys.executable, "-m", "vramguard_agent", "run", "--node", gpu_node.name,
             "--kubeconfig", cluster.kubeconfig, "--backend", "simdriver", "--simgpu-socket", str(gpu_node.simgpu_socket),
             "--sample-interval", "1s", "--min-report-interval", "1s", "--heartbeat", "5s", "--metrics-address", ""],
            env={**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "agent", "sim"))},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        t0 = time.monotonic()
        seen = {"finetune": 0}

        def holding() -> dict[int, int]:
            return {p["pid"]: p["usedBytes"] for p in driver_state(gpu_node)["devices"][0]["processes"]}

        def finetune_gone() -> bool:
            held = holding()
            seen["finetune"] = max(seen["finetune"], held.get(ft_pid, 0))
            return ft_pid not in held

        wait_for(finetune_gone, CHAT_GROWS_AFTER_S, "finetune evicted for device pressure", interval=0.25)
        evicted_after = time.monotonic() - t0
        [event] = wait_for(lambda: events_about(core, namespace, ft["metadata"]["uid"], "DevicePressure"), 10,
                           "the DevicePressure Event")
        assert "evicting pod finetune" in event.message and "above its share of 19.8Gi" in event.message
        assert "pod chat needs to reach its share of 19.8Gi" in event.message

        # chat then gets the 19Gi it needs: the same process, never refused, never restarted.
        wait_for(lambda: holding().get(chat_pid) == 19 * GI, CHAT_GROWS_AFTER_S + 30, "chat's 19Gi", interval=0.5)
        status = core.read_namespaced_pod("chat", namespace).status
        assert status.phase == "Running" and status.container_statuses[0].restart_count == 0
        assert not {"DevicePressure", "Evicting"} & {e.reason for e in events_about(core, namespace, chat["metadata"]["uid"])}
        print(f"\ndevice pressure: finetune's memory freed {evicted_after:.1f} s after the agent started, "
              f"at {seen['finetune'] / GI:.0f} GiB; chat then grew to 19 GiB\n{event.message}")
    finally:
        if agent is not None:
            stop_agent(agent, 2000)
        operator.stop()
        print(f"--- operator log ({operator.log}) ---\n{operator.tail(30)}")
