"""The real node (docs/real-node.md): a real kubelet and containerd run the pods.

Each fact is read from a source that vramguard's code does not touch: host PIDs
from containerd's task list, cgroup membership, CFS quotas and CPU time from the
kernel's files. Against them the tests check the production code paths: the
agent's attribution (``vramguard-agent attribute``, the PodWatcher's index) and
the operator's own ``pods/resize`` and Eviction requests (``KubeActions``).
Skipped, saying why, where the machine cannot run a kubelet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from vramguard_agent.pods import PodWatcher
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.engine.inputs import PodFacts
from vramguard_operator.engine.throttle import plan_restore, plan_throttle
from vramguard_operator.engine.types import PodRef

from .conftest import Cluster
from .realnode import ROOT, TAINT, RealNode, cgroup_dir, cpu_quota_us, cpu_usage_s, pod

pytestmark = pytest.mark.e2e
T = TypeVar("T")
PERIOD_US = 100_000  # the kubelet's CFS period (cpuCFSQuotaPeriod default 100ms)
# sh's trap runs between commands; `wait` returns at once on a trapped signal.
SLEEP_TRAPPED = "trap 'echo SIGTERM > /host/term; exit 0' TERM; sleep 3600 & wait"
BURN_TRAPPED = "trap 'exit 0' TERM; while :; do :; done"


def until(what: str, fn: Callable[[], T | None], timeout: float = 60.0, every: float = 0.1) -> T:
    """Poll ``fn`` until it returns something truthy; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def attribute(pid: int) -> dict[str, Any]:
    """``vramguard-agent attribute PID``: the agent's own command, as a subprocess."""
    out = subprocess.run(
        [sys.executable, "-m", "vramguard_agent", "attribute", str(pid)],
        capture_output=True, text=True, check=True, timeout=30,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "agent", "sim"))},
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def run_pod(cluster: Cluster, node: RealNode, namespace: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Create the pod, wait until its container runs; returns the Pod and the container's host PID."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    name = manifest["metadata"]["name"]
    cluster.wait("-n", namespace, f"pod/{name}", "--for=condition=Ready", timeout_s=90)
    obj = json.loads(cluster.kubectl("get", "pod", "-n", namespace, name, "-o", "json").stdout)
    assert obj["spec"]["nodeName"] == node.name
    container_id = obj["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    pid = until(f"containerd task of {name}", lambda: node.host_pid(container_id), timeout=10)
    return obj, pid


def _cores(pid: int, seconds: float) -> float:
    """CPU cores used by ``pid``'s cgroup over the next ``seconds``."""
    used0, t0 = cpu_usage_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_usage_s(pid) - used0) / (time.monotonic() - t0)


def test_the_node_is_a_real_kubelet_tainted_and_labelled(cluster: Cluster, real_node: RealNode) -> None:
    node = json.loads(cluster.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == real_node.kubelet_version
    assert info["containerRuntimeVersion"] == "containerd://" + real_node.containerd_version.removeprefix("v")
    # kwok plays only the nodes annotated as fake; this one is not, so nothing else writes its status.
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    assert {"key": TAINT, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


def test_a_real_process_is_attributed_to_its_pod_and_container(
    cluster: Cluster, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    obj, pid = run_pod(cluster, real_node, namespace, pod(real_node, "sleeper", SLEEP_TRAPPED, host_dir=tmp_path))
    uid = obj["metadata"]["uid"]
    container_id = obj["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    # The kernel's view: the process is in the container's cgroup below the pod's (cgroupfs layout).
    directory = cgroup_dir(pid, "cpu")
    assert directory.parts[-3:] == ("burstable", f"pod{uid}", container_id)
    assert pid in {int(p) for p in (directory / "cgroup.procs").read_text().split()}

    # The agent's view, through its command line: the same pod and container.
    found = attribute(pid)
    assert (found["pod_uid"], found["container_id"], found["qos"]) == (uid, container_id, "burstable")

    # ... and its pod index (the agent's watch of its node's pods) names them.
    watcher = PodWatcher(client.CoreV1Api(cluster.api_client()), real_node.name)
    watcher.list_once()
    meta = watcher.index.snapshot()[uid]
    assert (meta.namespace, meta.name, meta.qos_class) == (namespace, "sleeper", "burstable")
    assert meta.containers[container_id] == "main"

    # A host process outside any pod is not attributed (this test's own).
    assert attribute(os.getpid())["pod_uid"] is None


def test_throttle_lowers_the_real_cfs_quota_and_recovery_restores_it(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    obj, pid = run_pod(cluster, real_node, namespace, pod(real_node, "burner", BURN_TRAPPED, cpu=("100m", "500m")))
    assert cpu_quota_us(pid) == 500 * PERIOD_US // 1000
    before = _cores(pid, 1.0)

    # The Throttle step as the operator plans and requests it (engine.throttle, KubeActions: pods/resize).
    ref = PodRef(namespace, "burner", obj["metadata"]["uid"])
    actions = KubeActions(cluster.api_client())
    plan = plan_throttle(PodFacts.from_api(obj), "100m", None)
    assert [c.name for c in plan.resize] == ["main"], plan.reason
    started = time.monotonic()
    actions.resize_pod(ref, plan.resize)
    until("cpu.cfs_quota_us at 100m", lambda: cpu_quota_us(pid) == 100 * PERIOD_US // 1000, timeout=30)
    took = time.monotonic() - started

    # The kernel now caps the busy loop at a tenth of a core (a little slack for accounting).
    after = _cores(pid, 2.0)
    print(f"\nresize 500m -> 100m: quota changed after {took:.2f} s; busy loop {before:.3f} -> {after:.3f} cores")
    assert after <= 0.13
    until("containerStatuses[].resources.limits.cpu == 100m", lambda: _reported_cpu(cluster, namespace) == "100m",
          timeout=30, every=0.5)

    # Recovery: the operator's restore puts the recorded limit back, and the kernel lets the loop run again.
    current = json.loads(cluster.kubectl("get", "pod", "-n", namespace, "burner", "-o", "json").stdout)
    restore = plan_restore(plan.original, PodFacts.from_api(current), ["100m"])
    assert [(c.name, c.limit) for c in restore] == [("main", "500m")]
    started = time.monotonic()
    actions.resize_pod(ref, restore)
    until("cpu.cfs_quota_us back at 500m", lambda: cpu_quota_us(pid) == 500 * PERIOD_US // 1000, timeout=30)
    took = time.monotonic() - started
    restored = _cores(pid, 2.0)
    print(f"restore 100m -> 500m: quota changed after {took:.2f} s; busy loop {after:.3f} -> {restored:.3f} cores")
    assert restored >= 0.3
    until("containerStatuses[].resources.limits.cpu == 500m", lambda: _reported_cpu(cluster, namespace) == "500m",
          timeout=30, every=0.5)
    cluster.kubectl("delete", "pod", "-n", namespace, "burner", "--wait=false")


def _reported_cpu(cluster: Cluster, namespace: str) -> str | None:
    """The CPU limit the kubelet reports it applied to the burner's container (status.containerStatuses[].resources)."""
    status = json.loads(cluster.kubectl("get", "pod", "-n", namespace, "burner", "-o", "json").stdout)["status"]
    limit: str | None = status["containerStatuses"][0].get("resources", {}).get("limits", {}).get("cpu")
    return limit


def test_an_eviction_terminates_the_process_gracefully(
    cluster: Cluster, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    obj, pid = run_pod(cluster, real_node, namespace, pod(real_node, "evictee", SLEEP_TRAPPED, host_dir=tmp_path))
    started = time.monotonic()
    KubeActions(cluster.api_client()).evict_pod(PodRef(namespace, "evictee", obj["metadata"]["uid"]))

    until("the evicted process to exit", lambda: not Path(f"/proc/{pid}").exists(), timeout=30)
    exited = time.monotonic() - started

    def removed() -> bool:  # the kubelet confirms the termination; then the API server removes the pod
        return cluster.kubectl("get", "pod", "-n", namespace, "evictee", check=False).returncode != 0

    until("the evicted pod to be removed", removed, timeout=60, every=0.5)
    print(f"\neviction: process exited after {exited:.2f} s (grace period 30 s)")
    # The SIGTERM handler ran (a SIGKILL after the grace period would leave no file), well before the grace period.
    assert (tmp_path / "term").read_text().strip() == "SIGTERM"
    assert exited < 15
