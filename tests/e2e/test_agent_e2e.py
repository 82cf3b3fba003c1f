"""The agent in simulated mode against the local cluster.

A fresh kwok node gets real pods; the agent (``vramguard-agent run --backend
sim``) watches that node's pods, wires their uids and container ids into the
fake /proc and cgroup trees it writes, samples the scenario through the NVML
code, and writes the node's NodeGPUUsage. The test then compares the stored
status with what the scenario and the Pod objects say, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
GIB = 1024 * MIB
TOTAL, RESERVED = 81559 * MIB, 579 * MIB
UUIDS = ["GPU-e2e00000-0000-4000-8000-000000000000", "GPU-e2e00001-0000-4000-8000-000000000001"]
HOST_CGROUP = "/user.slice/user-1000.slice/session-7.scope"


def scenario(node: str, namespace: str) -> dict[str, Any]:
    """Constant figures, so the expected report needs no clock."""
    return {
        "nodes": [
            {
                "name": node,
                "driverVersion": "570.133.20",
                "cgroup": {"version": 2, "driver": "systemd", "runtime": "containerd"},
                "gpus": [
                    {
                        "model": "NVIDIA H100 80GB HBM3",
                        "count": 2,
                        "memory": "81559Mi",
                        "reserved": "579Mi",
                        "uuids": UUIDS,
                    }
                ],
                "pods": [
                    {
                        "namespace": namespace,
                        "name": "llm",
                        "qos": "guaranteed",
                        "containers": [
                            {
                                "name": "server",
                                "ram": "6Gi",
                                "pageCache": "1Gi",
                                "processes": [{"gpu": 0, "memory": "20Gi"}],
                            },
                            {"name": "sidecar", "ram": "100Mi"},
                        ],
                    },
                    {
                        "namespace": namespace,
                        "name": "trainer",
                        "qos": "burstable",
                        "containers": [
                            {
                                "name": "main",
                                "ram": "12Gi",
                                "oomKills": 1,
                                "processes": [{"gpu": 0, "memory": "8Gi"}, {"gpu": 1, "memory": "30Gi"}],
                            }
                        ],
                    },
                    {
                        "namespace": namespace,
                        "name": "idle",
                        "qos": "besteffort",
                        "containers": [{"name": "main", "ram": "1Gi"}],
                    },
                ],
                "hostProcesses": [{"cgroup": HOST_CGROUP, "gpu": 1, "memory": "512Mi", "pid": 4242}],
            }
        ]
    }


def pod_manifest(name: str, node: str, containers: list[str], resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": c, "image": "registry.k8s.io/pause:3.10", "resources": resources} for c in containers
            ],
        },
    }


def node_manifest(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": node, "nvidia.com/gpu.present": "true"},
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "2"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "2"},
        },
    }


def expected_status(pods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the scenario and the Pod objects say the report must hold."""

    def cid(name: str, container: str) -> str:
        # kwok shows no containerID; the simulation derives it (docs/agent.md).
        return hashlib.sha256(f"{pods[name]['metadata']['uid']}/{container}".encode()).hexdigest()

    def device(index: int, used: int) -> dict[str, Any]:
        free = TOTAL - RESERVED - used
        return {
            "uuid": UUIDS[index],
            "index": index,
            "modelName": "NVIDIA H100 80GB HBM3",
            "migEnabled": False,
            "virtualizationMode": "None",
            "memory": {
                "totalBytes": TOTAL,
                "reservedBytes": RESERVED,
                "usedBytes": used,
                "freeBytes": free,
                "usableBytes": TOTAL - RESERVED,
            },
            "processBytes": used,
            "processesComplete": True,
            "health": "Healthy",
            # Driver 570: per-cgroup memory limits need r615 (NVML has no such symbol).
            "memoryLimits": "Unsupported",
            "memoryLimitsReason": "DriverTooOld",
            "memoryLimitsMessage": "nvmlDeviceGetMemoryLimits_v1: NVMLError_FunctionNotFound: Function Not Found "
            "(driver 570.133.20 is older than r615)",
        }

    def pod(name: str, vram: int, ram: int, oom: int, devices: list, containers: list) -> dict[str, Any]:
        meta = pods[name]["metadata"]
        return {
            "uid": meta["uid"],
            "namespace": meta["namespace"],
            "name": name,
            "qosClass": pods[name]["status"]["qosClass"].lower(),
            "attribution": "Measured",
            "vramBytes": vram,
            "vramSource": "NVML",  # NVML attributed it (dmem is the other source: docs/dmem.md)
            "ramWorkingSetBytes": ram,
            "oomKills": oom,
            "devices": devices,
            "containers": containers,
        }

    def container(pod_name: str, name: str, vram: int, ram: int, oom: int = 0) -> dict[str, Any]:
        return {
            "name": name,
            "containerID": cid(pod_name, name),
            "vramBytes": vram,
            "ramWorkingSetBytes": ram,
            "oomKills": oom,
        }

    return {
        "devices": [device(0, 28 * GIB), device(1, 30 * GIB + 512 * MIB)],
        "pods": [
            pod("idle", 0, GIB, 0, [], [container("idle", "main", 0, GIB)]),
            pod(
                "llm",
                20 * GIB,
                6 * GIB + 100 * MIB,
                0,
                [{"uuid": UUIDS[0], "usedBytes": 20 * GIB}],
                [container("llm", "server", 20 * GIB, 6 * GIB), container("llm", "sidecar", 0, 100 * MIB)],
            ),
            pod(
                "trainer",
                38 * GIB,
                12 * GIB,
                1,
                [{"uuid": UUIDS[0], "usedBytes": 8 * GIB}, {"uuid": UUIDS[1], "usedBytes": 30 * GIB}],
                [container("trainer", "main", 38 * GIB, 12 * GIB, oom=1)],
            ),
        ],
        "unattributed": [
            {
                "pid": 4242,
                "device": UUIDS[1],
                "usedBytes": 512 * MIB,
                "reason": f"not in a pod: cgroup {HOST_CGROUP} names no kubelet pod",
            }
        ],
        "truncated": False,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_ngu(cluster, node: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "nodegpuusage", node, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


UTILIZATION = ("gpuUtilizationPercent", "memoryUtilizationPercent", "smUtilizationPercent")


def _no_utilization(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Device entries without GPU utilisation: NVML's samples depend on when they were read."""
    return [{k: v for k, v in e.items() if k not in UTILIZATION} for e in entries]


def comparable(status: dict[str, Any]) -> bytes:
    """The measured part of a status as canonical JSON (trends, VRAM and RAM, and
    utilisation depend on timing)."""
    pods = [
        {k: (_no_utilization(v) if k == "devices" else v) for k, v in p.items() if k not in ("trend", "ramTrend")}
        for p in status.get("pods", [])
    ]
    subset = {
        "devices": _no_utilization(status.get("devices") or []),
        "pods": pods,
        "unattributed": status.get("unattributed", []),
        "truncated": status.get("truncated"),
    }
    return json.dumps(subset, sort_keys=True).encode()


@pytest.fixture
def fake_node(cluster, namespace):
    node = f"agent-{namespace[-6:]}"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node_manifest(node)))
    cluster.wait("--for=condition=Ready", f"node/{node}", timeout_s=60)
    yield node
    cluster.kubectl("delete", "node", node, "--wait=false", check=False)
    cluster.kubectl("delete", "nodegpuusage", node, "--wait=false", check=False)


def create_pods(cluster, namespace: str, node: str) -> dict[str, dict[str, Any]]:
    """The scenario's three pods, one per QoS class, Running on the kwok node."""
    guaranteed = {"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}
    burstable = {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    besteffort = {"limits": {"nvidia.com/gpu": "1"}}
    for manifest in (
        pod_manifest("llm", node, ["server", "sidecar"], guaranteed),
        pod_manifest("trainer", node, ["main"], burstable),
        pod_manifest("idle", node, ["main"], besteffort),
    ):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    cluster.wait("-n", namespace, "--for=condition=Ready", "pod", "--all", timeout_s=90)
    pods = {
        p["metadata"]["name"]: p
        for p in json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    }
    assert {p["status"]["qosClass"] for p in pods.values()} == {"Guaranteed", "Burstable", "BestEffort"}
    return pods


def test_agent_reports_the_scenario_for_real_pods(cluster, namespace, fake_node, tmp_path):
    node = fake_node
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(scenario(node, namespace)))
    port = free_port()
    log = (tmp_path / "agent.log").open("w")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'api'}:{ROOT / 'agent'}:{ROOT / 'sim'}", "KUBECONFIG": cluster.kubeconfig}
    # The agent starts before the pods exist (as on a node that boots): it must pick
    # their uids and names up from the watch.
    agent = subprocess.Popen(
        [
            sys.executable, "-m", "vramguard_agent", "run",
            "--backend", "sim", "--scenario", str(scenario_file), "--node", node,
            "--sample-interval", "1s", "--heartbeat", "3s", "--min-report-interval", "1s",
            "--metrics-address", f"127.0.0.1:{port}", "--log-level", "DEBUG",
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        early = wait_for(lambda: get_ngu(cluster, node), timeout=60, what="the first NodeGPUUsage")
        assert not any(p.get("name") for p in early["status"]["pods"])  # no pods in the API yet
        pods = create_pods(cluster, namespace, node)
        expected = expected_status(pods)
        # The pods' cgroups appear on the next rescan (at most every 5 s): wait for the match.
        deadline, ngu = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            ngu = get_ngu(cluster, node)
            if ngu and comparable(ngu.get("status", {})) == comparable(expected):
                break
            time.sleep(0.5)
        assert ngu is not None
        assert json.loads(comparable(ngu["status"])) == json.loads(comparable(expected))
        assert comparable(ngu["status"]) == comparable(expected)
        assert ngu["spec"] == {"nodeName": node}
        owner = ngu["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Node", node)
        status = ngu["status"]
        assert (status["agent"]["backend"], status["agent"]["driverVersion"]) == ("sim", "570.133.20")
        assert {c["type"]: c["status"] for c in status["conditions"]} == {
            "AgentHealthy": "True",
            "ProcessesMissing": "False",
        }

        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert f'namespace="{namespace}",pod="trainer"' in body and f'UUID="{UUIDS[1]}"' in body
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200

        # A deleted report is re-created on the next write.
        cluster.kubectl("delete", "nodegpuusage", node)
        wait_for(
            lambda: (o := get_ngu(cluster, node)) and comparable(o.get("status", {})) == comparable(expected),
            timeout=30,
            what="the NodeGPUUsage to be re-created",
        )
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            code = agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            code = None
        log.close()
        if code != 0:
            print((tmp_path / "agent.log").read_text()[-5000:])
    assert code == 0


# --- driver-enforced memory limits -------------------------------------------------


def start_agent(node: str, scenario_file: Path, port: int, log: Any, cluster, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'api'}:{ROOT / 'agent'}:{ROOT / 'sim'}", "KUBECONFIG": cluster.kubeconfig}
    return subprocess.Popen(
        [
            sys.executable, "-m", "vramguard_agent", "run",
            "--backend", "sim", "--scenario", str(scenario_file), "--node", node,
            "--sample-interval", "1s", "--heartbeat", "3s", "--min-report-interval", "1s",
            "--metrics-address", f"127.0.0.1:{port}", "--log-level", "DEBUG", *extra,
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def stop(agent: subprocess.Popen) -> int | None:
    agent.send_signal(signal.SIGTERM)
    try:
        return agent.wait(timeout=30)
    except subprocess.TimeoutExpired:
        agent.kill()
        return None


def limits_of(cluster, node: str, pod: str) -> list[dict[str, Any]] | None:
    ngu = get_ngu(cluster, node)
    for p in (ngu or {}).get("status", {}).get("pods", []):
        if p.get("name") == pod:
            return p.get("memoryLimits", [])  # absent: none
    return None


def set_calls(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    line = 'vramguard_agent_memory_limit_calls_total{operation="set",result="ok"}'
    return next((float(x.split()[-1]) for x in body.splitlines() if x.startswith(line)), 0.0)


def test_agent_applies_reports_and_clears_a_pods_memory_limits(cluster, namespace, fake_node, tmp_path):
    """The operator's annotation on a real pod reaches the (simulated) driver through the
    agent, is reported applied, and is cleared when the annotation goes; a bad one is refused."""
    node = fake_node
    spec = scenario(node, namespace)
    spec["nodes"][0]["driverVersion"] = "615.12.03"
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(spec))
    port = free_port()
    log = (tmp_path / "agent.log").open("w")
    agent = start_agent(node, scenario_file, port, log, cluster, "--enforce-caps")
    want = {UUIDS[0]: {"hardLimit": 24 * GIB, "softLimit": 10 * GIB}}
    try:
        create_pods(cluster, namespace, node)
        ngu = wait_for(lambda: get_ngu(cluster, node), timeout=60, what="the first NodeGPUUsage")
        assert {d["memoryLimits"] for d in ngu["status"]["devices"]} == {"Supported"}
        assert ngu["status"]["agent"]["enforceCaps"] is True
        annotation = json.dumps(want, separators=(",", ":"))
        cluster.kubectl("annotate", "pod", "llm", "-n", namespace, f"vramguard.io/memory-limits={annotation}")
        (applied,) = wait_for(
            lambda: (got := limits_of(cluster, node, "llm")) and got[0]["state"] == "Applied" and got,
            timeout=60, what="the llm pod's limits to be applied",
        )  # fmt: skip
        assert (applied["uuid"], applied["hardLimitBytes"], applied["softLimitBytes"]) == (
            UUIDS[0], 24 * GIB, 10 * GIB,
        )  # fmt: skip
        assert limits_of(cluster, node, "trainer") == []  # the neighbour is untouched
        time.sleep(3)  # a few more samples: held, so never set again
        assert set_calls(port) == 1

        cluster.kubectl("annotate", "pod", "trainer", "-n", namespace, "vramguard.io/memory-limits=not json")
        wait_for(
            lambda: any(
                p.get("name") == "trainer" and "not JSON" in p.get("memoryLimitsError", "")
                for p in (get_ngu(cluster, node) or {}).get("status", {}).get("pods", [])
            ),
            timeout=30, what="the refused annotation to be reported",
        )  # fmt: skip

        cluster.kubectl("annotate", "pod", "llm", "-n", namespace, "vramguard.io/memory-limits-")
        wait_for(lambda: limits_of(cluster, node, "llm") == [], timeout=30, what="the limits to be cleared")
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'vramguard_agent_memory_limit_calls_total{operation="clear",result="ok"} 1.0' in body
    finally:
        code = stop(agent)
        log.close()
        if code != 0:
            print((tmp_path / "agent.log").read_text()[-5000:])
    assert code == 0


def test_agent_without_enforce_caps_reports_support_and_applies_nothing(cluster, namespace, fake_node, tmp_path):
    node = fake_node
    spec = scenario(node, namespace)
    spec["nodes"][0]["driverVersion"] = "615.12.03"
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(spec))
    port = free_port()
    log = (tmp_path / "agent.log").open("w")
    agent = start_agent(node, scenario_file, port, log, cluster)
    try:
        create_pods(cluster, namespace, node)
        want = json.dumps({UUIDS[0]: {"hardLimit": 24 * GIB}}, separators=(",", ":"))
        cluster.kubectl("annotate", "pod", "llm", "-n", namespace, f"vramguard.io/memory-limits={want}")
        (entry,) = wait_for(lambda: limits_of(cluster, node, "llm"), timeout=60, what="the llm pod's limits entry")
        assert (entry["state"], entry["reason"]) == ("Disabled", "EnforcementDisabled")
        assert "hardLimitBytes" not in entry and set_calls(port) == 0
    finally:
        code = stop(agent)
        log.close()
    assert code == 0


def test_an_agent_that_can_read_no_gpu_is_not_ready_and_says_so(cluster, namespace, fake_node, tmp_path):
    """NVML unavailable (as with a wrong runtime class): /readyz answers 503 with the reason, the
    report carries AgentHealthy False and 0 devices, `kubectl get ngu` shows both, and a Warning
    Event on the report explains it."""
    doc = scenario(fake_node, namespace)
    doc["nodes"][0]["faults"] = [{"type": "nvml-unavailable", "from": "0s", "until": "10h"}]
    scenario_file = tmp_path / "scenario.yaml"
    scenario_file.write_text(yaml.safe_dump(doc))
    port = free_port()
    with (tmp_path / "agent.log").open("w") as log:
        agent = start_agent(fake_node, scenario_file, port, log, cluster)
        try:
            ngu = wait_for(lambda: (lambda o: o if o and (o.get("status") or {}).get("healthyDevices") == 0
                                    else None)(get_ngu(cluster, fake_node)), 60, "the report with 0 devices")
            healthy = {c["type"]: c for c in ngu["status"]["conditions"]}["AgentHealthy"]
            assert (healthy["status"], healthy["reason"]) == ("False", "NVMLUnavailable")
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
            assert err.value.code == 503
            assert err.value.read().decode().startswith("no GPU device can be read: NVMLUnavailable")
            table = cluster.kubectl("get", "ngu", fake_node, "-o", "wide").stdout.splitlines()
            row = dict(zip(table[0].split(), table[1].split(), strict=False))
            assert (row["HEALTHY"], row["DEVICES"], row["REASON"]) == ("False", "0", "NVMLUnavailable")
            events = wait_for(lambda: [e for e in json.loads(cluster.kubectl(
                "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={fake_node}",
                "-o", "json").stdout)["items"] if e["reason"] == "NoReadableDevice"], 30, "the Warning Event")
            assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["kind"] == "NodeGPUUsage"
        finally:
            stop(agent)
    print((tmp_path / "agent.log").read_text()[-2000:])
