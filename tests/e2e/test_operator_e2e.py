"""The operator end to end on the local cluster: a real kube-apiserver, kwok
running the pods on a GPU node of these tests' own, the operator as a real
subprocess, and node reports written as the agent writes them (``publish``;
``test_op_simulated_agent_feeds_the_operator`` runs the real agent instead).

Escalation delays are seconds and the operator evaluates every second, so the
whole file runs in about two minutes. Test names start with ``test_op_`` so that
their namespaces (``t-test-op-...``) are the only ones this operator watches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .operator_harness import (
    GI,
    GROUP,
    ROOT,
    VERSION,
    Kube,
    OperatorProcess,
    Usage,
    budget_manifest,
    condition,
    create_gpu_nodes,
    delete_nodes,
    events_about,
    get_budget,
    pod_manifest,
    publish,
    run_pods,
    stop_agent,
    wait_for,
)

FRESHNESS_S = 20
EVICTION_RETRY_S = 2
ANN_VIOLATIONS = "vramguard.io/violations"
ANN_MESSAGE = "vramguard.io/violation"
ANN_ORIGINAL = "vramguard.io/original-cpu"

LADDER_FULL = [
    {"action": "Annotate", "after": "0s"},
    {"action": "Throttle", "after": "3s", "cpuLimit": "100m"},
    {"action": "Evict", "after": "6s"},
]


@pytest.fixture(scope="module")
def kube(cluster: Any) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture(scope="module")
def node(kube: Kube) -> Iterator[str]:
    """A kwok GPU node of this module's own (reports for it are ours alone)."""
    name = f"vg-op-e2e-{uuid.uuid4().hex[:6]}"
    create_gpu_nodes(kube.core, [name])
    yield name
    delete_nodes(kube.core, kube.custom, [name])


@pytest.fixture(scope="module")
def operator(cluster: Any, node: str) -> Iterator[OperatorProcess]:
    """The operator, watching only this file's namespaces, with test settings."""
    op = OperatorProcess(
        cluster.kubeconfig,
        ["t-test-op-*"],
        [
            "--evaluation-period=1s",
            "--debounce=10ms",
            f"--freshness={FRESHNESS_S}s",
            f"--eviction-retry={EVICTION_RETRY_S}s",
            "--eviction-rate-per-minute=120",
            "--eviction-burst=20",
            "--watch-timeout=60s",
        ],
    )
    op.start()
    yield op
    op.stop()
    print(f"--- operator log ({op.log}) ---\n{op.tail(80)}")


def annotations(pod: client.V1Pod | None) -> dict[str, str]:
    return dict((pod.metadata.annotations or {}) if pod is not None else {})


def cpu(pod: client.V1Pod) -> tuple[str, str]:
    r = pod.spec.containers[0].resources
    return r.limits["cpu"], r.requests["cpu"]


def steps_on_pod(pod: client.V1Pod | None) -> list[str | None]:
    text = annotations(pod).get(ANN_VIOLATIONS)
    return [r.get("step") for r in json.loads(text)] if text else []


def violations(budget: dict[str, Any]) -> list[dict[str, Any]]:
    return list((budget.get("status") or {}).get("violations") or ())


def reasons(kube: Kube, namespace: str, uid: str) -> list[str]:
    return [e.reason for e in events_about(kube.core, namespace, uid)]


def no_framework_marks(pod: client.V1Pod) -> None:
    """kopf wrote nothing of its own on the pod and added no finalizer."""
    assert not pod.metadata.finalizers
    assert not [k for k in annotations(pod) if "kopf" in k]


# --- the ladder -------------------------------------------------------------------------


def test_op_escalation_annotate_throttle_evict(kube: Kube, operator: OperatorProcess, node: str,
                                               namespace: str) -> None:
    budget = kube.create_budget(namespace, budget_manifest("train", {"perPod": {"vram": "10Gi"}},
                                                           LADDER_FULL))
    pods = run_pods(kube.core, namespace, [pod_manifest("w0", node, {"app": "train"}),
                                           pod_manifest("w1", node, {"app": "train"})])
    w0, w1 = pods["w0"], pods["w1"]
    publish(kube.custom, node, [Usage(w0, 12 * GI), Usage(w1, 4 * GI)])

    annotated = wait_for(lambda: "Annotate" in steps_on_pod(kube.pod(namespace, "w0")) and
                         kube.pod(namespace, "w0"), 10, "w0 annotated")
    assert "budget train: PodVRAM 12Gi > 10Gi" in annotations(annotated)[ANN_MESSAGE]
    assert "next Throttle at" in annotations(annotated)[ANN_MESSAGE]
    no_framework_marks(annotated)
    ev = wait_for(lambda: events_about(kube.core, namespace, w0.metadata.uid, "LimitExceeded"), 5,
                  "LimitExceeded Event")
    assert ev[0].type == "Warning" and ev[0].source.component == "vramguard"
    assert "12Gi, above its PodVRAM limit 10Gi" in ev[0].message and "Next: Throttle at" in ev[0].message
    wait_for(lambda: events_about(kube.core, namespace, budget["metadata"]["uid"], "LimitExceeded"), 5,
             "LimitExceeded on the budget")

    throttled = wait_for(lambda: (p := kube.pod(namespace, "w0")) and cpu(p) == ("100m", "100m") and p,
                         10, "w0 resized to 100m")
    assert json.loads(annotations(throttled)[ANN_ORIGINAL]) == {"main": {"limit": "2", "request": "2"}}
    for uid in (w0.metadata.uid, budget["metadata"]["uid"]):
        wait_for(lambda u=uid: "Throttled" in reasons(kube, namespace, u), 5, "Throttled Events")

    wait_for(lambda: kube.pod(namespace, "w0") is None, 15, "w0 evicted")
    for uid in (w0.metadata.uid, budget["metadata"]["uid"]):  # posted once the Eviction is accepted
        wait_for(lambda u=uid: "Evicting" in reasons(kube, namespace, u), 5, "Evicting Events")
    assert operator.metric("vramguard_actions_total", action="Evict", result="success",
                           namespace=namespace) == 1
    # w1 stayed within its limit: untouched
    survivor = kube.pod(namespace, "w1")
    assert survivor is not None and not annotations(survivor) and cpu(survivor) == ("2", "2")
    status = wait_for(lambda: (st := get_budget(kube.custom, namespace, "train")["status"])
                      and st["matchedPods"] == 1 and st, 5, "matchedPods 1 after the eviction")
    assert status["observedGeneration"] == 1
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "Violating", "DataStale"}


def test_op_pdb_blocks_eviction_until_it_allows(kube: Kube, operator: OperatorProcess, node: str,
                                                namespace: str) -> None:
    ladder = [{"action": "Annotate", "after": "0s"}, {"action": "Evict", "after": "1s"}]
    kube.create_budget(namespace, budget_manifest("serve", {"perPod": {"vram": "10Gi"}}, ladder))
    kube.policy.create_namespaced_pod_disruption_budget(namespace, {
        "metadata": {"name": "keep-one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serve"}}},
    })
    pods = run_pods(kube.core, namespace, [pod_manifest("s0", node, {"app": "serve"})], resize_support=False)
    s0 = pods["s0"]
    publish(kube.custom, node, [Usage(s0, 12 * GI)])

    blocked = wait_for(lambda: events_about(kube.core, namespace, s0.metadata.uid, "EvictionBlocked"),
                       15, "EvictionBlocked Event")
    assert "disruption budget" in blocked[0].message and "retrying in 2s" in blocked[0].message
    # retried later, never deleted: the same Event counts the retries
    wait_for(lambda: (events_about(kube.core, namespace, s0.metadata.uid, "EvictionBlocked")[0].count or 0) >= 2,
             10, "a retried eviction")
    assert kube.pod(namespace, "s0") is not None
    assert steps_on_pod(kube.pod(namespace, "s0")) == ["Annotate"]
    assert operator.metric("vramguard_actions_total", action="Evict", result="blocked",
                           namespace=namespace) >= 2

    kube.policy.delete_namespaced_pod_disruption_budget("keep-one", namespace)
    publish(kube.custom, node, [Usage(s0, 12 * GI)])
    wait_for(lambda: kube.pod(namespace, "s0") is None, 15, "s0 evicted once the PDB is gone")
    wait_for(lambda: "Evicting" in reasons(kube, namespace, s0.metadata.uid), 5, "Evicting Event")


def test_op_dry_run_changes_nothing_but_status_and_events(kube: Kube, operator: OperatorProcess,
                                                          node: str, namespace: str) -> None:
    ladder = [
        {"action": "Annotate", "after": "0s"},
        {"action": "Throttle", "after": "1s"},
        {"action": "Evict", "after": "2s"},
    ]
    budget = kube.create_budget(namespace, budget_manifest("audit", {"perPod": {"vram": "10Gi"}}, ladder,
                                                           mode="DryRun"))
    pods = run_pods(kube.core, namespace, [pod_manifest("a0", node, {"app": "audit"})])
    a0 = pods["a0"]
    before = kube.pod(namespace, "a0")
    publish(kube.custom, node, [Usage(a0, 12 * GI)])

    def would_evict() -> bool:
        return any(e.message.startswith("dry run: would evict")
                   for e in events_about(kube.core, namespace, a0.metadata.uid, "DryRun"))

    wait_for(would_evict, 15, "the dry-run Evict Event")
    messages = [e.message for e in events_about(kube.core, namespace, budget["metadata"]["uid"], "DryRun")]
    assert any(m.startswith("dry run: would annotate") for m in messages)
    assert any(m.startswith("dry run: would throttle") for m in messages)
    time.sleep(1.5)  # give any wrong action time to happen
    pod = kube.pod(namespace, "a0")
    assert pod is not None and pod.metadata.resource_version == before.metadata.resource_version
    assert not [k for k in annotations(pod) if k.startswith("vramguard.io/")]
    assert cpu(pod) == ("2", "2")
    status = get_budget(kube.custom, namespace, "audit")["status"]
    assert status["effectiveMode"] == "DryRun"
    assert [v["step"] for v in violations({"status": status})] == ["Evict"]
    assert condition({"status": status}, "Violating")["status"] == "True"


def test_op_policy_dry_run_overrides_enforce(kube: Kube, operator: OperatorProcess, node: str,
                                             namespace: str) -> None:
    kube.core.patch_namespace(namespace, {"metadata": {"labels": {"vramguard-e2e-audit": namespace}}})
    name = f"e2e-audit-{namespace[-6:]}"
    kube.custom.create_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryPolicy", "metadata": {"name": name},
        "spec": {"mode": "DryRun", "exemptNamespaces": [],
                 "namespaceSelector": {"matchLabels": {"vramguard-e2e-audit": namespace}}},
    })
    try:
        kube.create_budget(namespace, budget_manifest("train", {"perPod": {"vram": "10Gi"}},
                                                      [{"action": "Annotate", "after": "0s"}]))
        p0 = run_pods(kube.core, namespace, [pod_manifest("p0", node, {"app": "train"})])["p0"]
        publish(kube.custom, node, [Usage(p0, 12 * GI)])
        wait_for(lambda: events_about(kube.core, namespace, p0.metadata.uid, "DryRun"), 10, "DryRun Event")
        wait_for(lambda: get_budget(kube.custom, namespace, "train")["status"]["effectiveMode"] == "DryRun",
                 5, "effectiveMode DryRun")
        assert not annotations(kube.pod(namespace, "p0"))
    finally:
        kube.custom.delete_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", name)


def test_op_recovery_restores_the_cpu_limit(kube: Kube, operator: OperatorProcess, node: str,
                                            namespace: str) -> None:
    ladder = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "2s"}]
    budget = kube.create_budget(namespace, budget_manifest("infer", {"perPod": {"vram": "10Gi"}}, ladder))
    r0 = run_pods(kube.core, namespace, [pod_manifest("r0", node, {"app": "infer"}, cpu="1500m")])["r0"]
    publish(kube.custom, node, [Usage(r0, 11 * GI)])
    wait_for(lambda: (p := kube.pod(namespace, "r0")) and cpu(p) == ("100m", "100m"), 12, "r0 throttled")

    publish(kube.custom, node, [Usage(r0, 4 * GI)])
    restored = wait_for(lambda: (p := kube.pod(namespace, "r0")) and cpu(p) == ("1500m", "1500m") and p,
                        10, "r0's CPU restored")
    wait_for(lambda: not [k for k in annotations(kube.pod(namespace, "r0")) if k.startswith("vramguard.io/")],
             5, "r0's vramguard annotations removed")
    assert restored is not None
    for uid in (r0.metadata.uid, budget["metadata"]["uid"]):
        wait_for(lambda u=uid: "Recovered" in reasons(kube, namespace, u), 5, "Recovered Events")
    b = wait_for(lambda: (b := get_budget(kube.custom, namespace, "infer")) and
                 condition(b, "Violating")["status"] == "False" and b, 5, "Violating=False")
    assert condition(b, "Violating")["reason"] == "NoViolations"
    assert not violations(b)


def test_op_restart_resumes_at_the_right_step(kube: Kube, operator: OperatorProcess, node: str,
                                              namespace: str) -> None:
    ladder = [
        {"action": "Annotate", "after": "0s"},
        {"action": "Throttle", "after": "5s"},
        {"action": "Evict", "after": "10m"},
    ]
    budget = kube.create_budget(namespace, budget_manifest("job", {"perPod": {"vram": "10Gi"}}, ladder))
    j0 = run_pods(kube.core, namespace, [pod_manifest("j0", node, {"app": "job"})])["j0"]
    publish(kube.custom, node, [Usage(j0, 12 * GI)])
    wait_for(lambda: steps_on_pod(kube.pod(namespace, "j0")) == ["Annotate"], 10, "j0 annotated")
    # The step's Events are posted right after its annotation: a kill between the
    # two would lose them (what this test asserts is that a restart never repeats them).
    for uid in (j0.metadata.uid, budget["metadata"]["uid"]):
        wait_for(lambda u=uid: "LimitExceeded" in reasons(kube, namespace, u), 10, "the Annotate step's Events")

    operator.stop(kill=True)  # a crash in the middle of the escalation
    try:
        time.sleep(6)  # the Throttle step falls due while no operator runs
        publish(kube.custom, node, [Usage(j0, 12 * GI)])
        assert cpu(kube.pod(namespace, "j0")) == ("2", "2")
    finally:
        operator.start(evaluating=True)

    wait_for(lambda: cpu(kube.pod(namespace, "j0")) == ("100m", "100m"), 10, "j0 throttled after restart")
    time.sleep(2)  # a few more evaluations: nothing may repeat
    for uid in (j0.metadata.uid, budget["metadata"]["uid"]):
        ev = events_about(kube.core, namespace, uid)
        by_reason = {r: [e for e in ev if e.reason == r] for r in ("LimitExceeded", "Throttled")}
        assert [(len(v), v[0].count) for v in by_reason.values()] == [(1, 1), (1, 1)], ev
    assert steps_on_pod(kube.pod(namespace, "j0")) == ["Throttle"]
    (v,) = violations(get_budget(kube.custom, namespace, "job"))
    assert (v["step"], v["nextStep"]) == ("Throttle", "Evict")


def test_op_job_total_exceeded_across_three_pods(kube: Kube, operator: OperatorProcess, node: str,
                                                 namespace: str) -> None:
    budget = kube.create_budget(namespace, budget_manifest(
        "llama", {"perPod": {"vram": "20Gi"}, "total": {"vram": "30Gi"}},
        [{"action": "Annotate", "after": "0s"}], selector={"job-name": "llama"}))
    pods = run_pods(kube.core, namespace, [pod_manifest(f"llama-{i}", node, {"job-name": "llama"})
                                           for i in range(3)])
    publish(kube.custom, node, [Usage(p, 12 * GI) for p in pods.values()])  # 36Gi > 30Gi, each < 20Gi

    for name, p in pods.items():
        wait_for(lambda n=name: steps_on_pod(kube.pod(namespace, n)) == ["Annotate"], 10, f"{name} annotated")
        assert "TotalVRAM 36Gi > 30Gi" in annotations(kube.pod(namespace, name))[ANN_MESSAGE]
        wait_for(lambda u=p.metadata.uid: "LimitExceeded" in reasons(kube, namespace, u), 5, "Events")
    b = wait_for(lambda: (b := get_budget(kube.custom, namespace, "llama")) and violations(b) and b, 5,
                 "the violation in status")  # written after the pods
    (v,) = violations(b)
    assert (v["kind"], v.get("pod"), v["observedBytes"], v["limitBytes"]) == ("TotalVRAM", None, 36 * GI, 30 * GI)
    assert b["status"]["usage"]["vram"] == "36Gi/30Gi"
    assert b["status"]["matchedPods"] == 3
    wait_for(lambda: "LimitExceeded" in reasons(kube, namespace, budget["metadata"]["uid"]), 5, "Event")


def test_op_stale_reports_block_action(kube: Kube, operator: OperatorProcess, node: str,
                                       namespace: str) -> None:
    kube.create_budget(namespace, budget_manifest("old", {"perPod": {"vram": "10Gi"}},
                                                  [{"action": "Annotate", "after": "0s"}]))
    s0 = run_pods(kube.core, namespace, [pod_manifest("s0", node, {"app": "old"})])["s0"]
    publish(kube.custom, node, [Usage(s0, 40 * GI)], age_seconds=3 * FRESHNESS_S)

    b = wait_for(lambda: (b := get_budget(kube.custom, namespace, "old")) and
                 (condition(b, "DataStale") or {}).get("status") == "True" and b, 10, "DataStale=True")
    assert condition(b, "DataStale")["reason"] == "ReportStale"
    assert node in condition(b, "DataStale")["message"]
    time.sleep(2)
    assert not annotations(kube.pod(namespace, "s0"))
    assert not events_about(kube.core, namespace, s0.metadata.uid)

    publish(kube.custom, node, [Usage(s0, 40 * GI)])  # the same data, fresh: now it acts
    wait_for(lambda: steps_on_pod(kube.pod(namespace, "s0")) == ["Annotate"], 10, "s0 annotated")
    wait_for(lambda: condition(get_budget(kube.custom, namespace, "old"), "DataStale")["reason"]
             == "ReportsFresh", 5, "DataStale=False/ReportsFresh")


def test_op_exempt_namespace_is_never_touched(kube: Kube, operator: OperatorProcess, node: str,
                                              namespace: str) -> None:
    name = f"e2e-exempt-{namespace[-6:]}"
    kube.custom.create_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryPolicy", "metadata": {"name": name},
        "spec": {"exemptNamespaces": [namespace, "kube-system"],
                 "namespaceSelector": {"matchLabels": {"vramguard-e2e": "none"}}},
    })
    try:
        ladder = [
            {"action": "Annotate", "after": "0s"},
            {"action": "Throttle", "after": "1s"},
            {"action": "Evict", "after": "2s"},
        ]
        kube.create_budget(namespace, budget_manifest("sys", {"perPod": {"vram": "10Gi"}}, ladder))
        e0 = run_pods(kube.core, namespace, [pod_manifest("e0", node, {"app": "sys"})])["e0"]
        before = kube.pod(namespace, "e0")
        publish(kube.custom, node, [Usage(e0, 30 * GI)])
        wait_for(lambda: [v.get("step") for v in violations(get_budget(kube.custom, namespace, "sys"))]
                 == ["Evict"], 15, "the ladder run to its end in status")
        time.sleep(1.5)
        after = kube.pod(namespace, "e0")
        assert after is not None
        assert after.metadata.resource_version == before.metadata.resource_version  # not even patched
        assert cpu(after) == ("2", "2")
        assert {e.reason for e in events_about(kube.core, namespace, e0.metadata.uid)} == {"DryRun"}
    finally:
        kube.custom.delete_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", name)


def test_op_throttle_refusals_are_explained(kube: Kube, operator: OperatorProcess, node: str,
                                            namespace: str) -> None:
    ladder = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "1s"}]
    budget = kube.create_budget(namespace, budget_manifest("cpu", {"perPod": {"vram": "10Gi"}}, ladder))
    # n0: no kubelet support for resize (kwok's pod status) -> the API server refuses
    # n1: no CPU limit -> nothing can be throttled in place
    pods = run_pods(kube.core, namespace, [pod_manifest("n0", node, {"app": "cpu"}),
                                           pod_manifest("n1", node, {"app": "cpu"}, cpu=None)],
                    resize_support=False)
    publish(kube.custom, node, [Usage(pods["n0"], 12 * GI), Usage(pods["n1"], 12 * GI)])

    failed = wait_for(lambda: events_about(kube.core, namespace, pods["n0"].metadata.uid, "ThrottleFailed"),
                      10, "ThrottleFailed Event")
    assert "pods/resize failed: HTTP 422" in failed[0].message
    impossible = wait_for(lambda: events_about(kube.core, namespace, pods["n1"].metadata.uid,
                                               "ThrottleImpossible"), 10, "ThrottleImpossible Event")
    assert "no CPU limit" in impossible[0].message
    wait_for(lambda: {"ThrottleFailed", "ThrottleImpossible"} <= set(
        reasons(kube, namespace, budget["metadata"]["uid"])), 5, "the budget's Events")

    def noted() -> dict[str, str] | None:
        msgs = {v["pod"]: v["message"] for v in violations(get_budget(kube.custom, namespace, "cpu"))}
        ok = "resize refused: HTTP 422" in msgs.get("n0", "") and "throttle impossible" in msgs.get("n1", "")
        return msgs if ok else None

    wait_for(noted, 10, "the reasons in status.violations")
    assert cpu(kube.pod(namespace, "n0")) == ("2", "2")


def test_op_simulated_agent_feeds_the_operator(kube: Kube, operator: OperatorProcess, node: str,
                                               namespace: str, cluster: Any, tmp_path: Path) -> None:
    """The real agent (``vramguard-agent run --backend sim``) measures a pod whose
    VRAM steps over its budget; the operator annotates it from the agent's report."""
    budget = kube.create_budget(namespace, budget_manifest(
        "sim", {"perPod": {"vram": "10Gi", "ram": "8Gi"}}, [{"action": "Annotate", "after": "0s"}]))
    pod = run_pods(kube.core, namespace, [pod_manifest("sim-0", node, {"app": "sim"})])["sim-0"]
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"nodes": [{
        "name": node,
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": "81559Mi", "reserved": "579Mi"}],
        "pods": [{"namespace": namespace, "name": "sim-0", "containers": [{
            "name": "main", "ram": "2Gi",
            "processes": [{"gpu": 0, "memory": {"steps": [{"at": "0s", "value": "4Gi"},
                                                           {"at": "4s", "value": "14Gi"}]}}],
        }]}],
    }]}))
    agent = subprocess.Popen(
        [sys.executable, "-m", "vramguard_agent.cli", "run", "--backend", "sim", "--scenario", str(scenario),
         "--node", node, "--kubeconfig", cluster.kubeconfig, "--sample-interval", "1s",
         "--min-report-interval", "1s", "--heartbeat", "5s", "--metrics-address", ""],
        env={**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "operator", "agent", "sim"))},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        def measured() -> bool:
            try:
                rep = kube.custom.get_cluster_custom_object(GROUP, VERSION, "nodegpuusages", node)
            except ApiException as err:
                if err.status == 404:  # not written yet
                    return False
                raise
            pods = {p["uid"]: p for p in (rep.get("status") or {}).get("pods") or ()}
            return (pods.get(pod.metadata.uid) or {}).get("vramBytes", 0) >= 14 * GI

        wait_for(measured, 20, "the agent's report of sim-0 at 14Gi")
        wait_for(lambda: steps_on_pod(kube.pod(namespace, "sim-0")) == ["Annotate"], 10, "sim-0 annotated")
        assert "PodVRAM 14Gi > 10Gi" in annotations(kube.pod(namespace, "sim-0"))[ANN_MESSAGE]
        b = wait_for(lambda: (b := get_budget(kube.custom, namespace, "sim")) and
                     (b.get("status") or {}).get("usage", {}).get("ramBytes") and b, 5, "RAM usage in status")
        assert b["status"]["usage"]["ramBytes"] >= 2 * GI
        assert condition(b, "DataStale")["status"] == "False"
        wait_for(lambda: "LimitExceeded" in reasons(kube, namespace, budget["metadata"]["uid"]), 5, "Event")
    finally:
        stop_agent(agent, 4000)
