"""The real node's simulated GPU (docs/real-node.md, "The simulated GPU"): real
processes in real pods use it, and the agent reads it through NVML.

Each pod runs ``simcuda`` (hack/cluster/simcuda), which opens a context on the
simulated driver through the socket the pod mounts from the host and asks for
the device memory its schedule wants. The facts are read from sources that
the agent's code does not touch: host PIDs from containerd's task list, the
driver's own state over its socket (as nvidia-smi reads a real driver), the
kubelet's summary API, pod status and logs. Against them the tests check the
agent as a host process (``vramguard-agent once --backend simdriver --simgpu-socket``:
NVML process list -> /proc/<pid>/cgroup -> pod, the production path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.engine.types import PodRef

from .conftest import Cluster
from .realnode import ROOT, RealNode, driver_state, pod
from .test_real_node_e2e import run_pod, until

pytestmark = pytest.mark.e2e
GIB = 1 << 30
MIB = 1 << 20


def holdings(node: RealNode) -> dict[int, int]:
    """Bytes each host PID holds on device 0, from the driver."""
    return {p["pid"]: p["usedBytes"] for p in driver_state(node)["devices"][0]["processes"]}


def agent_once(cluster: Cluster, node: RealNode) -> dict[str, Any]:
    """``vramguard-agent once`` on the host: one sample of the real node through NVML over the driver."""
    out = subprocess.run(
        [sys.executable, "-m", "vramguard_agent", "once", "--node", node.name, "--kubeconfig", cluster.kubeconfig,
         "--backend", "simdriver", "--simgpu-socket", str(node.simgpu_socket), "--ram-interval", "0s"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "agent", "sim"))},
    )
    assert out.returncode == 0, out.stderr
    status: dict[str, Any] = json.loads(out.stdout)
    return status


def simcuda(*sizes: str, every: str = "200ms", host_bytes: str = "0") -> list[str]:
    """The workload's command: hold ``sizes`` in turn, one every ``every``, then the last until SIGTERM."""
    return ["/bin/simcuda", "--every", every, "--host-bytes", host_bytes, *sizes]


def gpu_pod(node: RealNode, namespace: str, cluster: Cluster, name: str, command: list[str],
            **kw: Any) -> tuple[dict[str, Any], int]:
    """Run a pod with the simulated GPU mounted; returns the Pod and its container's host PID."""
    return run_pod(cluster, node, namespace, pod(node, name, command, gpu=True, **kw))


def test_real_processes_hold_simulated_gpu_memory_and_the_agent_attributes_them(
    cluster: Cluster, gpu_node: RealNode, namespace: str
) -> None:
    trainer, trainer_pid = gpu_pod(gpu_node, namespace, cluster, "trainer", simcuda("512Mi", "1Gi", "2Gi"))
    server, server_pid = gpu_pod(gpu_node, namespace, cluster, "server", simcuda("3Gi"),
                                 cpu=("100m", "100m"), memory=("64Mi", "64Mi"))
    # The driver knows each process by the host PID containerd reports for its container.
    until("the driver to grant both schedules",
          lambda: (h := holdings(gpu_node)).get(trainer_pid) == 2 * GIB and h.get(server_pid) == 3 * GIB, timeout=30)

    status = agent_once(cluster, gpu_node)
    uuid = driver_state(gpu_node)["devices"][0]["uuid"]
    pods = {p["uid"]: p for p in status["pods"]}
    for obj, held, qos in ((trainer, 2 * GIB, "burstable"), (server, 3 * GIB, "guaranteed")):
        found = pods[obj["metadata"]["uid"]]
        container_id = obj["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        assert (found["namespace"], found["name"], found["qosClass"]) == (namespace, obj["metadata"]["name"], qos)
        assert found["vramBytes"] == held
        assert [(d["uuid"], d["usedBytes"]) for d in found["devices"]] == [(uuid, held)]
        # The container holds it all; the pod's other cgroup (the sandbox's pause process) holds none.
        containers = {c["containerID"]: c for c in found["containers"]}
        assert (containers[container_id].get("name"), containers[container_id]["vramBytes"]) == ("main", held)
        assert all(c["vramBytes"] == 0 for cid, c in containers.items() if cid != container_id)
    assert not {trainer_pid, server_pid} & {u["pid"] for u in status.get("unattributed", [])}
    device = status["devices"][0]
    assert device["uuid"] == uuid and device["processesComplete"] is True


def test_an_allocation_that_does_not_fit_ends_the_process_with_cuda_out_of_memory(
    cluster: Cluster, gpu_node: RealNode, namespace: str
) -> None:
    _, hog_pid = gpu_pod(gpu_node, namespace, cluster, "hog", simcuda("60Gi"))
    until("the hog's 60 GiB", lambda: holdings(gpu_node).get(hog_pid) == 60 * GIB, timeout=30)
    # 1 GiB fits; 30 GiB cannot (the H100's 80.4 GiB usable minus the hog's 60 GiB).
    manifest = pod(gpu_node, "victim", simcuda("1Gi", "30Gi", every="2s"), gpu=True, restart_policy="Never")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))

    def terminated() -> dict[str, Any] | None:
        obj = json.loads(cluster.kubectl("get", "pod", "-n", namespace, "victim", "-o", "json").stdout)
        statuses = obj["status"].get("containerStatuses") or [{}]
        state: dict[str, Any] | None = statuses[0].get("state", {}).get("terminated")
        return state

    state = until("the victim's container to terminate", terminated, timeout=90, every=0.5)
    assert state["exitCode"] == 1
    logs = cluster.kubectl("logs", "-n", namespace, "victim").stdout
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 29.00 GiB." in logs
    assert "Process has 1.00 GiB memory in use" in logs
    until("the victim pod to fail (restartPolicy Never)", lambda: json.loads(
        cluster.kubectl("get", "pod", "-n", namespace, "victim", "-o", "json").stdout)["status"]["phase"] == "Failed",
        timeout=30, every=0.5)
    # Its memory was freed; the neighbour keeps all of its own.
    held = holdings(gpu_node)
    assert held.get(hog_pid) == 60 * GIB
    assert sum(held.values()) < 61 * GIB + 8 * GIB  # the victim's 1 GiB is gone (others' tests: a few GiB)


def test_ram_working_set_matches_the_kubelet_summary_api(
    cluster: Cluster, gpu_node: RealNode, namespace: str
) -> None:
    obj, _ = gpu_pod(gpu_node, namespace, cluster, "ramholder", simcuda("1Gi", host_bytes="96Mi"),
                     memory=("160Mi", "256Mi"))
    uid = obj["metadata"]["uid"]

    def kubelet_working_set() -> int | None:  # the kubelet's summary API (cAdvisor's stats of the pod cgroup)
        raw = cluster.kubectl("get", "--raw", f"/api/v1/nodes/{gpu_node.name}/proxy/stats/summary").stdout
        for p in json.loads(raw).get("pods", []):
            if p["podRef"]["uid"] == uid:
                value = p.get("memory", {}).get("workingSetBytes")
                return int(value) if value is not None and int(value) >= 96 * MIB else None
        return None

    kubelet = until("the summary API to show the pod's 96 MiB", kubelet_working_set, timeout=90, every=1.0)
    agent = {p["uid"]: p for p in agent_once(cluster, gpu_node)["pods"]}[uid]["ramWorkingSetBytes"]
    kubelet_after = kubelet_working_set() or kubelet
    print(f"\nRAM working set: agent {agent / MIB:.1f} MiB, kubelet {kubelet / MIB:.1f} / {kubelet_after / MIB:.1f} MiB")
    tolerance = max(4 * MIB, 0.05 * kubelet)
    assert min(abs(agent - kubelet), abs(agent - kubelet_after)) <= tolerance


def test_an_eviction_ends_the_process_gracefully_and_frees_its_gpu_memory(
    cluster: Cluster, gpu_node: RealNode, namespace: str
) -> None:
    obj, pid = gpu_pod(gpu_node, namespace, cluster, "evictee", simcuda("2Gi"))
    until("the evictee's 2 GiB", lambda: holdings(gpu_node).get(pid) == 2 * GIB, timeout=30)
    started = time.monotonic()
    KubeActions(cluster.api_client()).evict_pod(PodRef(namespace, "evictee", obj["metadata"]["uid"]))
    until("the driver to free the evictee's memory", lambda: pid not in holdings(gpu_node), timeout=30, every=0.05)
    freed = time.monotonic() - started
    until("the process to exit", lambda: not Path(f"/proc/{pid}").exists(), timeout=30)
    print(f"\neviction: GPU memory freed {freed:.2f} s after the Eviction request (grace period 30 s)")
    assert freed < 15  # SIGTERM, not the SIGKILL after the grace period
    assert obj["metadata"]["uid"] not in {p["uid"] for p in agent_once(cluster, gpu_node)["pods"]}
