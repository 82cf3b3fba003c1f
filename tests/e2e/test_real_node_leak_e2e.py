"""A leaking real process on the real node, evicted before the simulated GPU runs out.

A pod on the real node runs ``simcuda``: 2 GiB held for 10 s (a model
loaded), then 256 MiB more every second (15 GiB a minute), which would fill
the simulated H100 (80.4 GiB usable) after about 5 minutes. The agent runs on
the host as on a GPU node (``vramguard-agent run`` with the nvml backend over
the simulated driver, ``--backend simdriver``), the operator as a subprocess; both
in real time. The pod's budget limits it to 12Gi and escalates Annotate, then
Evict after 5 s.

Leak *detection* (the trend rule) is not what stops it here: in real time it
needs a 10-minute flat floor before a rise and five 1-minute floor points of
the rise (about 16 minutes), or, for a rise from the process's start, 30
minutes of the process (docs/leak-detection.md): too long for this suite. It
is tested end to end at 60x speed on a simulated node (test_leak_e2e.py).
Here the budget's PodVRAM limit stops the leak.

Checked against the driver's own state (read over its socket during the whole
test): the process leaves the device, ended by the kubelet after the Eviction
(the Evicting Event names the pod), while the device's free memory never fell
below one of the leak's steps, so no allocation was ever refused. How long it
took is printed, not asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .conftest import Cluster
from .operator_harness import GI, GROUP, VERSION, OperatorProcess, budget_manifest, events_about, stop_agent, wait_for
from .realnode import ROOT, RealNode, driver_state, pod
from .test_real_node_e2e import run_pod

pytestmark = pytest.mark.e2e
MIB = 1 << 20
START, STEP, FLAT_S, STEPS = 2 * GI, 256 * MIB, 10, 400
LIMIT = "12Gi"


def schedule() -> list[str]:
    """simcuda's sizes, one a second: flat for FLAT_S seconds, then STEP more each second."""
    return [str(START + max(0, i - FLAT_S) * STEP) for i in range(STEPS)]


def test_a_leaking_real_process_is_evicted_before_the_simulated_gpu_runs_out(
    cluster: Cluster, gpu_node: RealNode, namespace: str
) -> None:
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    body = budget_manifest("leak-guard", {"perPod": {"vram": LIMIT}},
                           [{"action": "Annotate", "after": "0s"}, {"action": "Evict", "after": "5s"}],
                           selector={"app": "leaky"})
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", body)
    operator = OperatorProcess(cluster.kubeconfig, [namespace], ["--evaluation-period=1s", "--debounce=50ms"])
    agent: subprocess.Popen[bytes] | None = None
    try:
        operator.start()
        obj, pid = run_pod(cluster, gpu_node, namespace, pod(
            gpu_node, "leaky", ["/bin/simcuda", "--every", "1s", *schedule()], gpu=True, labels={"app": "leaky"}))
        uid = obj["metadata"]["uid"]
        t0 = time.monotonic()
        agent = subprocess.Popen(
            [sys.executable, "-m", "vramguard_agent", "run", "--node", gpu_node.name,
             "--kubeconfig", cluster.kubeconfig, "--backend", "simdriver", "--simgpu-socket", str(gpu_node.simgpu_socket),
             "--sample-interval", "2s", "--trend-interval", "30s", "--min-report-interval", "2s",
             "--heartbeat", "10s", "--metrics-address", ""],
            env={**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "agent", "sim"))},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        seen: dict[str, Any] = {"min_free": None, "held": 0}

        def freed() -> bool:
            """Watch the driver until the leaking process has left it."""
            if agent is not None and agent.poll() is not None:
                raise AssertionError(f"agent exited with {agent.returncode}")
            device = driver_state(gpu_node)["devices"][0]
            held = {p["pid"]: p["usedBytes"] for p in device["processes"]}
            free = device["totalBytes"] - device["reservedBytes"] - device["overheadBytes"] - sum(held.values())
            seen["min_free"] = free if seen["min_free"] is None else min(seen["min_free"], free)
            if pid in held:
                seen["held"] = held[pid]
                return False
            return True

        # A guard against a hang only: the device would be full after about 5 minutes.
        wait_for(freed, STEPS, "the leaking process to leave the simulated GPU", interval=0.5)
        took = time.monotonic() - t0

        evicting = wait_for(lambda: events_about(core, namespace, uid, "Evicting"), 30, "the Evicting Event")
        assert "leaky" in evicting[0].message and "PodVRAM" in evicting[0].message, evicting[0].message
        # No allocation was refused: one is only when a step does not fit in the free memory.
        assert seen["min_free"] > STEP
        assert not Path(f"/proc/{pid}").exists()

        def gone() -> bool:
            try:
                core.read_namespaced_pod("leaky", namespace)
            except ApiException as err:
                return err.status == 404
            return False

        wait_for(gone, 60, "the evicted pod to be removed", interval=0.5)
        print(f"\nleak: memory freed {took:.0f} s after the agent started, the process holding "
              f"{seen['held'] / GI:.1f} GiB last; the device's free memory never fell below "
              f"{seen['min_free'] / GI:.1f} GiB\nEvicting: {evicting[0].message}")
    finally:
        if agent is not None:
            stop_agent(agent, 2000)
        operator.stop()
        print(f"--- operator log ({operator.log}) ---\n{operator.tail(30)}")
