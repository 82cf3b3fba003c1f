"""Leak detection end to end (issue 5) on the local cluster.

A kwok GPU node of this test's own; on its one time-sliced H100, a leaking
inference pod (8Gi growing 8Gi an hour under a small request sawtooth, limit
24Gi) and a training pod (a 20-28Gi sawtooth), both under budgets with leak
detection on. The real agent (``vramguard-agent run --backend sim``) plays the
node 60 times faster than the clock (``--sim-speed 60``: an hour of history in a
minute; trend features in scenario time) and the operator runs as a subprocess.

The inference pod must be annotated with its projected time to exhaustion
(the LeakDetected Event, and the Leak violation in its annotations) and evicted
before it (``evictBefore: 1h``: when the projected time falls under an hour,
that is 60 scenario minutes before the simulated series reaches 24Gi at
scenario time 2h), while the VRAM it reports is still below the limit; the
training pod is left alone. How long that takes in wall-clock time is printed,
not asserted: a functional test checks outcomes, a benchmark measures time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from vramguard_api.units import parse_duration

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
    get_budget,
    pod_manifest,
    run_pods,
    stop_agent,
    wait_for,
)

SPEED = 60.0
START_GI, RATE_GI_PER_H, LIMIT_GI = 8, 8, 24
EXHAUSTION_SCENARIO_S = (LIMIT_GI - START_GI) / RATE_GI_PER_H * 3600  # 2h: the series reaches the limit
EVICT_BEFORE_S = 3600.0
PROJECTION = re.compile(r"projected to reach 24Gi in (\d+h)?(\d+m)?(\d+s)?")
LEAK_DETECTION = {"enabled": True, "minGrowthPerHour": "200Mi", "minWindow": "30m", "evictBefore": "1h"}


def projected_seconds(message: str) -> float:
    """The projected time to exhaustion an Event message states, seconds."""
    m = PROJECTION.search(message)
    assert m is not None and m.group(0) != "projected to reach 24Gi in ", f"no projection in {message!r}"
    return parse_duration("".join(g for g in m.groups() if g))


def agent_scenario(node: str, namespace: str) -> dict[str, Any]:
    return {"nodes": [{
        "name": node,
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": "81559Mi", "reserved": "579Mi"}],
        "pods": [
            {"namespace": namespace, "name": "embedder-0", "containers": [{
                "name": "main", "ram": "6Gi",
                "processes": [{"gpu": 0, "memory": {"sum": [
                    {"linear": {"start": f"{START_GI}Gi", "perHour": f"{RATE_GI_PER_H}Gi"}},
                    {"sawtooth": {"low": 0, "high": "256Mi", "period": "40s"}},
                ]}}],
            }]},
            {"namespace": namespace, "name": "trainer-0", "containers": [{
                "name": "main", "ram": "12Gi",
                "processes": [{"gpu": 0, "memory": {"sawtooth": {"low": "20Gi", "high": "28Gi", "period": "40s"}}}],
            }]},
        ],
    }]}


def report_pods(custom: client.CustomObjectsApi, node: str) -> dict[str, dict[str, Any]]:
    try:
        rep = custom.get_cluster_custom_object(GROUP, VERSION, "nodegpuusages", node)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise
    return {p.get("name"): p for p in (rep.get("status") or {}).get("pods") or ()}


def vramguard_top(cluster: Any, namespace: str) -> list[dict[str, Any]]:
    """``vramguard top -n NAMESPACE -o json`` against the cluster: its rows."""
    out = subprocess.run(
        [sys.executable, "-m", "vramguard_operator", "top", "-n", namespace, "-o", "json",
         "--kubeconfig", cluster.kubeconfig],
        env={**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "operator", "agent", "sim"))},
        capture_output=True, text=True, timeout=60, check=True,
    )
    return list(json.loads(out.stdout)["rows"])


def test_leaking_pod_annotated_with_projection_and_evicted_before_it_sawtooth_left_alone(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = f"vg-leak-e2e-{uuid.uuid4().hex[:6]}"
    create_gpu_nodes(core, [node])
    operator = OperatorProcess(cluster.kubeconfig, [namespace], [
        "--evaluation-period=1s", "--debounce=50ms", "--eviction-rate-per-minute=60", "--eviction-burst=10",
    ])
    agent: subprocess.Popen[bytes] | None = None
    try:
        for name, app, ladder in (
            ("leak-guard", "embedder", [{"action": "Annotate", "after": "0s"}]),
            ("train", "trainer", [{"action": "Annotate", "after": "0s"}, {"action": "Evict", "after": "5s"}]),
        ):
            body = budget_manifest(name, {"perPod": {"vram": f"{LIMIT_GI}Gi" if app == "embedder" else "40Gi"}},
                                   ladder, selector={"app": app})
            body["spec"]["leakDetection"] = LEAK_DETECTION
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", body)
        pods = run_pods(core, namespace, [pod_manifest("embedder-0", node, {"app": "embedder"}),
                                          pod_manifest("trainer-0", node, {"app": "trainer"})])
        embedder_uid, trainer_uid = pods["embedder-0"].metadata.uid, pods["trainer-0"].metadata.uid
        operator.start(evaluating=True)

        scenario = tmp_path / "scenario.yaml"
        scenario.write_text(yaml.safe_dump(agent_scenario(node, namespace)))
        t0 = time.monotonic()
        agent = subprocess.Popen(
            [sys.executable, "-m", "vramguard_agent", "run", "--backend", "sim", "--scenario", str(scenario),
             "--node", node, "--kubeconfig", cluster.kubeconfig, "--sim-speed", f"{SPEED:g}",
             "--sample-interval", "500ms", "--min-report-interval", "1s", "--heartbeat", "10s",
             "--metrics-address", ""],
            env={**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "operator", "agent", "sim"))},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )

        seen: dict[str, Any] = {"vram": None, "annotations": {}, "trainer_trend": None, "top": None}

        def evicted() -> bool:
            """Watch the report and the pod until the pod is gone."""
            if agent.poll() is not None:
                raise AssertionError(f"agent exited with {agent.returncode}")
            reported = report_pods(custom, node)
            if (reported.get("embedder-0") or {}).get("vramBytes") is not None:
                seen["vram"] = reported["embedder-0"]["vramBytes"]
            if (reported.get("trainer-0") or {}).get("trend"):
                seen["trainer_trend"] = reported["trainer-0"]["trend"]
            try:
                pod = core.read_namespaced_pod("embedder-0", namespace)
            except ApiException as err:
                if err.status == 404:
                    return True
                raise
            if pod.metadata.deletion_timestamp is not None:
                return True
            seen["annotations"] = dict(pod.metadata.annotations or {})
            if seen["top"] is None and "Leak" in seen["annotations"].get("vramguard.io/violations", ""):
                seen["top"] = vramguard_top(cluster, namespace)
            return False

        # A guard against a hang only: the series reaches the limit 120 s after the agent starts (at 60x).
        wait_for(evicted, EXHAUSTION_SCENARIO_S / SPEED + 30, "the leaking pod evicted", interval=0.5)
        evicted_after_s = time.monotonic() - t0

        # Annotated with its projected time to exhaustion.
        detected = wait_for(lambda: events_about(core, namespace, embedder_uid, "LeakDetected"), 10, "LeakDetected")
        message = detected[0].message
        assert "embedder-0 leaks: VRAM grows" in message and "Annotated." in message, message
        assert projected_seconds(message) > EVICT_BEFORE_S  # found well before the eviction was due
        leaks = [v for v in json.loads(seen["annotations"]["vramguard.io/violations"]) if v["kind"] == "Leak"]
        assert [(v["budget"], v["step"]) for v in leaks] == [("leak-guard", "Annotate")]
        assert "Leak" in seen["annotations"]["vramguard.io/violation"]

        # Evicted before the projected exhaustion: evictBefore ahead of it, in scenario time ...
        evicting = wait_for(lambda: events_about(core, namespace, embedder_uid, "Evicting"), 10, "Evicting")
        left = projected_seconds(evicting[0].message)
        assert 0 < left <= EVICT_BEFORE_S, evicting[0].message
        # ... and before the series really reached the limit: the last VRAM the agent reported for the
        # pod is below it. (No wall-clock bound here: the wait above is a guard against a hang only.)
        assert seen["vram"] is not None and seen["vram"] < LIMIT_GI * GI

        # `vramguard top` showed both, the leaking pod first, while the leak was annotated.
        rows = seen["top"]
        assert rows is not None and [r["pod"] for r in rows] == ["embedder-0", "trainer-0"], rows
        leak_row, train_row = rows
        assert leak_row["state"] == "leak" and leak_row["growth_bytes_per_hour"] > 4 * GI
        assert [(x["name"], x["limit_bytes"], x["source"]) for x in leak_row["limits"]] == [
            ("pod", LIMIT_GI * GI, "gmb/leak-guard")]
        assert train_row["state"] == "ok" and train_row["trend_leak"] is False
        assert train_row["devices"][0]["uuid"] == leak_row["devices"][0]["uuid"]  # the same GPU

        # The sawtooth on the same GPU is left alone: no Event, no annotation, no Leak violation.
        trainer = core.read_namespaced_pod("trainer-0", namespace)
        assert trainer.metadata.deletion_timestamp is None
        assert not [k for k in (trainer.metadata.annotations or {}) if k.startswith("vramguard.io/")]
        assert not [e.reason for e in events_about(core, namespace, trainer_uid) if e.source.component == "vramguard"]
        status = get_budget(custom, namespace, "train")["status"]
        assert not status.get("violations") and status["matchedPods"] == 1
        trend = seen["trainer_trend"]
        assert trend is not None and trend["leak"] is False and trend["windowSeconds"] >= 1800, trend
        print(f"evicted after {evicted_after_s:.0f}s ({evicted_after_s * SPEED / 60:.0f} scenario minutes); "
              f"LeakDetected: {message}\nEvicting: {evicting[0].message}\ntrainer trend: {trend}")
    finally:
        if agent is not None:
            stop_agent(agent, 3000)
        operator.stop()
        print(f"--- operator log ({operator.log}) ---\n{operator.tail(40)}")
        delete_nodes(core, custom, [node])
