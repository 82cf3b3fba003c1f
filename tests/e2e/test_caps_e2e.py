"""Driver-enforced caps end to end (issue 14) on the local cluster.

A kwok GPU node of this test's own with one time-sliced H100 (driver r615 in
the scenario, so per-cgroup memory limits are supported); on it a pod that
grows past its budget (16Gi, then 24Gi, then 26Gi; limit 20Gi) and a
neighbour that holds a steady 20Gi. The budget's ladder is Annotate, then Cap.
The real agent (``vramguard-agent run --backend sim --enforce-caps``, with a
driver-state file so that its simulated driver outlives it) and the operator
run as subprocesses.

The Cap step must reach the agent (the pod's ``vramguard.io/memory-limits``
applied and reported, ``vramguard top -o wide`` showing it); a restarted agent
must find the cap the driver kept and reconcile it without setting it again
(and a crashed operator must neither lose the cap nor step it again);
the over-limit pod's next allocation must fail in the simulation — its own,
at its hard limit, with memory free on the device — while its neighbour keeps
its memory; and on recovery (the pod's memory freed) the cap must be cleared.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .operator_harness import (
    GI,
    GROUP,
    ROOT,
    VERSION,
    OperatorProcess,
    budget_manifest,
    create_gpu_nodes,
    delete_nodes,
    events_about,
    free_port,
    pod_manifest,
    run_pods,
    wait_for,
)

SPEED = 2.0  # scenario seconds per second
GROW_AT_S, OVER_AT_S = 20, 200  # scenario time: 24Gi (over the limit), then 26Gi (over the cap)
ANNOTATION = "vramguard.io/memory-limits"
PYTHONPATH = os.pathsep.join(str(ROOT / p) for p in ("api", "operator", "agent", "sim"))


def agent_scenario(node: str, namespace: str) -> dict[str, Any]:
    grows = {"steps": [{"at": "0s", "value": "16Gi"}, {"at": f"{GROW_AT_S}s", "value": "24Gi"},
                       {"at": f"{OVER_AT_S}s", "value": "26Gi"}]}
    return {"nodes": [{
        "name": node,
        "driverVersion": "615.12.03",
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": "81559Mi", "reserved": "579Mi"}],
        "pods": [
            # restartPolicy Never: once killed it stays down, so the recovery is not raced by a regrowth
            {"namespace": namespace, "name": "grower", "restartPolicy": "Never",
             "containers": [{"name": "main", "processes": [{"gpu": 0, "memory": grows}]}]},
            {"namespace": namespace, "name": "neighbour",
             "containers": [{"name": "main", "processes": [{"gpu": 0, "memory": "20Gi"}]}]},
        ],
    }]}


class Agent:
    """The node agent as a subprocess; its log kept in a file."""

    def __init__(self, cluster: Any, node: str, scenario: Path, state: Path, log: Path) -> None:
        self.cluster, self.node, self.scenario, self.state, self.log = cluster, node, scenario, state, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.started = 0.0

    def start(self, offset_s: float = 0.0) -> None:
        self.port = free_port()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vramguard_agent", "run", "--backend", "sim", "--scenario", str(self.scenario),
                 "--node", self.node, "--kubeconfig", self.cluster.kubeconfig, "--sim-speed", f"{SPEED:g}",
                 "--sim-offset", f"{offset_s:.0f}s", "--sim-driver-state", str(self.state), "--enforce-caps",
                 "--sample-interval", "500ms", "--min-report-interval", "1s", "--heartbeat", "10s",
                 "--metrics-address", f"127.0.0.1:{self.port}"],
                env={**self.cluster.env(), "PYTHONPATH": PYTHONPATH}, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.started = time.monotonic()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"agent exited:\n{self.log.read_text()[-3000:]}")
        return True

    def calls(self, operation: str) -> float:
        """Successful memory-limit calls of this agent process (0 before it serves metrics)."""
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        except OSError:
            return 0.0
        line = f'vramguard_agent_memory_limit_calls_total{{operation="{operation}",result="ok"}}'
        return next((float(x.split()[-1]) for x in body.splitlines() if x.startswith(line)), 0.0)


def report_pods(custom: client.CustomObjectsApi, node: str) -> dict[str, dict[str, Any]]:
    try:
        rep = custom.get_cluster_custom_object(GROUP, VERSION, "nodegpuusages", node)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise
    return {p.get("name"): p for p in (rep.get("status") or {}).get("pods") or ()}


def vramguard_top(cluster: Any, namespace: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "vramguard_operator", "top", "-n", namespace, "-o", "json",
         "--kubeconfig", cluster.kubeconfig],
        env={**cluster.env(), "PYTHONPATH": PYTHONPATH}, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return list(json.loads(out.stdout)["rows"])


def test_a_cap_reaches_the_agent_fails_the_pods_own_allocation_survives_a_restart_and_is_cleared(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = f"vg-caps-e2e-{uuid.uuid4().hex[:6]}"
    create_gpu_nodes(core, [node])
    operator = OperatorProcess(cluster.kubeconfig, [namespace], ["--evaluation-period=1s", "--debounce=50ms"])
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(agent_scenario(node, namespace)))
    agent = Agent(cluster, node, scenario, tmp_path / "driver.json", tmp_path / "agent.log")
    try:
        ladder = [{"action": "Annotate", "after": "0s"}, {"action": "Cap", "after": "3s"}]
        body = budget_manifest("cap-guard", {"perPod": {"vram": "20Gi"}}, ladder, selector={"app": "grower"})
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", body)
        pods = run_pods(core, namespace, [pod_manifest("grower", node, {"app": "grower"}),
                                          pod_manifest("neighbour", node, {"app": "neighbour"})])
        grower_uid = pods["grower"].metadata.uid
        operator.start(evaluating=True)
        agent.start()
        first_start = agent.started

        # 1. The Cap step reaches the agent: the annotation, the Event, the driver's limit reported.
        capped = wait_for(lambda: events_about(core, namespace, grower_uid, "Capped"), 90, "the Capped Event")
        assert "Capped: GPU memory hard limit 24Gi on GPU-" in capped[0].message, capped[0].message
        ann = json.loads(core.read_namespaced_pod("grower", namespace).metadata.annotations[ANNOTATION])
        ((gpu, limits),) = ann.items()
        assert limits == {"hardLimit": 24 * GI}
        held = wait_for(
            lambda: agent.alive() and [e for e in report_pods(custom, node).get("grower", {}).get("memoryLimits") or ()
                                       if e["state"] == "Applied"],
            30, "the cap applied by the agent",
        )  # fmt: skip
        assert (held[0]["uuid"], held[0]["hardLimitBytes"]) == (gpu, 24 * GI) and agent.calls("set") == 1
        assert not report_pods(custom, node)["neighbour"].get("memoryLimits")
        rows = {r["pod"]: r for r in vramguard_top(cluster, namespace)}
        assert rows["grower"]["state"] == "capped"
        assert [(c["hard_bytes"], c["state"]) for c in rows["grower"]["caps"]] == [(24 * GI, "Applied")]
        assert operator.metric("vramguard_pod_memory_limits", namespace=namespace, limit="hard") == 1

        # 2. The operator crashes and restarts: the cap is neither lost nor stepped again.
        operator.stop(kill=True)
        operator.start(evaluating=True)
        time.sleep(3)  # a few evaluations
        assert [(e.reason, e.count) for e in events_about(core, namespace, grower_uid, "Capped")] == [("Capped", 1)]
        ann = core.read_namespaced_pod("grower", namespace).metadata.annotations
        assert json.loads(ann[ANNOTATION]) == {gpu: {"hardLimit": 24 * GI}}

        # 3. The agent restarts: its driver kept the cap; the new agent reads it back and sets nothing.
        agent.stop()
        saved = json.loads((tmp_path / "driver.json").read_text())
        assert [list(v.values()) for v in saved.values()] == [[[0, 24 * GI]]]
        agent.start(offset_s=(time.monotonic() - first_start) * SPEED)
        wait_for(lambda: agent.alive() and agent.calls("get") > 1 and
                 [e for e in report_pods(custom, node).get("grower", {}).get("memoryLimits") or ()
                  if e["state"] == "Applied" and e["hardLimitBytes"] == 24 * GI],
                 30, "the restarted agent reporting the cap held")  # fmt: skip
        assert agent.calls("set") == 0 and agent.calls("clear") == 0

        # 4. The pod asks for 26Gi: its own allocation fails at its hard limit, with 33Gi free on the GPU;
        #    the neighbour keeps its 20Gi.
        def killed() -> str | None:
            agent.alive()
            found = re.search(rf"pod {namespace}/grower container main .* at its pod's hard limit.*", agent.log.read_text())
            return found.group(0) if found else None

        line = wait_for(killed, (OVER_AT_S - GROW_AT_S) / SPEED + 60, "the grower's allocation to fail")
        assert "an allocation of 2Gi failed" in line, line
        assert f"pod {namespace}/neighbour" not in agent.log.read_text()  # never killed
        after = report_pods(custom, node)
        assert after["neighbour"]["vramBytes"] == 20 * GI

        # 5. Recovery: the pod's memory is freed, the violation closes and the cap is cleared.
        wait_for(lambda: events_about(core, namespace, grower_uid, "Recovered"), 30, "the Recovered Event")
        wait_for(lambda: ANNOTATION not in (core.read_namespaced_pod("grower", namespace).metadata.annotations or {}),
                 30, "the annotation removed")  # fmt: skip
        wait_for(lambda: agent.alive() and not report_pods(custom, node).get("grower", {}).get("memoryLimits"),
                 30, "the cap cleared by the agent")  # fmt: skip
        assert agent.calls("clear") == 1
        assert wait_for(lambda: json.loads((tmp_path / "driver.json").read_text()) in ({}, {gpu: {}}) or None,
                        10, "the driver holding no limit")  # fmt: skip
    finally:
        agent.stop()
        operator.stop()
        delete_nodes(core, custom, [node])
        print(agent.log.read_text()[-3000:] if agent.log.exists() else "")
