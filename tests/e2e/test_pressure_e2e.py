"""Device pressure end to end on the local cluster: a real kube-apiserver (and
controller-manager computing PodDisruptionBudgets), kwok running the pods on a
time-sliced H100 node of this file's own, the operator as a real subprocess
and, for the main case, the real agent with its simulated GPUs.

A GPUMemoryPolicy with ``devicePressure`` (minFree 5%) applies to the test's
namespace only (``kubernetes.io/metadata.name``). The pods request one
``nvidia.com/gpu`` replica each, so no budget selects them and their implicit
budgets give each the node's share (usable / 4 = 19.8Gi). Test names start
with ``test_pressure_`` so that their namespaces are the only ones this
operator watches."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from .operator_harness import (
    GI,
    GROUP,
    ROOT,
    VERSION,
    Kube,
    OperatorProcess,
    Usage,
    create_gpu_nodes,
    delete_nodes,
    events_about,
    pod_manifest,
    publish,
    run_pods,
    stop_agent,
    wait_for,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def kube(cluster: Any) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture(scope="module")
def node(kube: Kube) -> Iterator[str]:
    name = f"vg-pressure-e2e-{uuid.uuid4().hex[:6]}"
    create_gpu_nodes(kube.core, [name])
    yield name
    delete_nodes(kube.core, kube.custom, [name])


@pytest.fixture(scope="module")
def operator(cluster: Any, node: str) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        cluster.kubeconfig,
        ["t-test-pressure-*"],
        [
            "--evaluation-period=1s",
            "--debounce=10ms",
            "--freshness=20s",
            "--eviction-retry=2s",
            "--eviction-rate-per-minute=120",
            "--eviction-burst=20",
            "--watch-timeout=60s",
        ],
    )
    op.start()
    yield op
    op.stop()
    print(f"--- operator log ({op.log}) ---\n{op.tail(80)}")


@pytest.fixture
def pressure_policy(kube: Kube, namespace: str) -> Iterator[str]:
    """A GPUMemoryPolicy keeping 5% free on every device of this test's namespace."""
    name = f"pressure-{namespace}"[:63]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUMemoryPolicy",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "devicePressure": {"minFree": "5%"},
            "evictionRateLimit": {"perMinute": 60, "burst": 10},
        },
    }
    kube.custom.create_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", body)
    yield name
    try:
        kube.custom.delete_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", name)
    except ApiException as err:
        if err.status != 404:
            raise


def gpu_pod(name: str, node: str, app: str) -> dict[str, Any]:
    """A pod holding one time-slicing replica of a GPU."""
    m = pod_manifest(name, node, {"app": app})
    for kind in ("limits", "requests"):
        m["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpu"] = "1"
    return m


def reasons(kube: Kube, namespace: str, uid: str) -> list[str]:
    return [e.reason for e in events_about(kube.core, namespace, uid)]


def gone_or_terminating(kube: Kube, namespace: str, name: str, uid: str) -> bool:
    p = kube.pod(namespace, name)
    return p is None or p.metadata.uid != uid or p.metadata.deletion_timestamp is not None


def run_agent(cluster: Any, node: str, scenario: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "vramguard_agent.cli", "run", "--backend", "sim", "--scenario", str(scenario),
         "--node", node, "--kubeconfig", cluster.kubeconfig, "--sample-interval", "1s",
         "--min-report-interval", "1s", "--heartbeat", "5s", "--metrics-address", ""],
        env={**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "operator", "agent", "sim"))},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def test_pressure_evicts_the_over_share_pod_and_spares_its_neighbour(
    kube: Kube, operator: OperatorProcess, node: str, namespace: str, pressure_policy: str, cluster: Any,
    tmp_path: Path,
) -> None:
    """A fine-tune grows to 62Gi on the GPU it time-shares with a chat server
    holding 15Gi, within its 19.8Gi share: when the GPU's free memory falls
    under 5%, the fine-tune is evicted at once (no ladder delay) and the chat
    server keeps running, untouched."""
    pods = run_pods(kube.core, namespace, [gpu_pod("finetune-0", node, "finetune"), gpu_pod("chat", node, "chat")])
    ft, chat = pods["finetune-0"], pods["chat"]
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"nodes": [{
        "name": node,
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": "81559Mi", "reserved": "579Mi",
                  "overhead": "4Mi"}],
        "pods": [
            {"namespace": namespace, "name": "finetune-0", "containers": [{
                "name": "main", "ram": "8Gi",
                "processes": [{"gpu": 0, "memory": {"ramp": {"from": "14Gi", "to": "62Gi", "over": "8s",
                                                             "after": "3s"}}}]}]},
            {"namespace": namespace, "name": "chat", "containers": [{
                "name": "main", "ram": "4Gi", "processes": [{"gpu": 0, "memory": "15Gi"}]}]},
        ],
    }]}))
    agent = run_agent(cluster, node, scenario)
    try:
        wait_for(lambda: gone_or_terminating(kube, namespace, "finetune-0", ft.metadata.uid), 60,
                 "finetune-0 evicted for device pressure")
        # the Event follows the accepted eviction (kwok removes a pod with no grace period at once)
        [event] = wait_for(lambda: events_about(kube.core, namespace, ft.metadata.uid, "DevicePressure"), 10,
                           "the DevicePressure Event")
        assert "evicting pod finetune-0" in event.message and "above its share of 19.8Gi" in event.message
        # chat holds 15Gi of its 19.8Gi share: the device keeps the 4.8Gi it needs to reach it (more than 5%)
        assert "less than the 4.8Gi pod chat needs to reach its share of 19.8Gi" in event.message
        assert "to protect 1 pod within its share" in event.message
        assert event.message.startswith("budget ") and "/default:finetune-0" in event.message
        # the neighbour within its share keeps running, untouched
        c = kube.pod(namespace, "chat")
        assert c is not None and c.metadata.uid == chat.metadata.uid and c.status.phase == "Running"
        assert c.metadata.deletion_timestamp is None
        assert not {"DevicePressure", "Evicting", "DryRun"} & set(reasons(kube, namespace, chat.metadata.uid))
        assert operator.metric("vramguard_device_pressure_events_total", outcome="evicted",
                               namespace=namespace) == 1
        assert operator.metric("vramguard_actions_total", action="Evict", result="success",
                               namespace=namespace) == 1
    finally:
        stop_agent(agent)


def test_pressure_falls_back_when_a_disruption_budget_refuses(
    kube: Kube, operator: OperatorProcess, node: str, namespace: str, pressure_policy: str,
) -> None:
    """The pod most above its share is protected by a PodDisruptionBudget (HTTP
    429): the next pod above its share on the device is evicted instead; the
    pod within its share is never touched."""
    pods = run_pods(kube.core, namespace, [
        gpu_pod("big", node, "big"), gpu_pod("mid", node, "mid"), gpu_pod("small", node, "small")])
    kube.policy.create_namespaced_pod_disruption_budget(namespace, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "big"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "big"}}},
    })
    wait_for(lambda: (kube.policy.read_namespaced_pod_disruption_budget("big", namespace).status
                      .observed_generation or 0) >= 1, 30, "the PDB observed")
    used = {"big": 40 * GI, "mid": 25 * GI, "small": 12 * GI}
    usages = [Usage(pods[n], used[n]) for n in used]

    def evicted_mid() -> bool:
        publish(kube.custom, node, usages, free=2 * GI)
        return gone_or_terminating(kube, namespace, "mid", pods["mid"].metadata.uid)

    wait_for(evicted_mid, 30, "mid evicted after big's eviction was refused", interval=1)
    wait_for(lambda: "EvictionBlocked" in reasons(kube, namespace, pods["big"].metadata.uid), 10, "EvictionBlocked")
    assert kube.pod(namespace, "big") is not None and kube.pod(namespace, "small") is not None
    assert not {"DevicePressure", "EvictionBlocked"} & set(reasons(kube, namespace, pods["small"].metadata.uid))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0%", "0% must be above 0%"),
        ("50.5%", "50.5% is above the maximum of 50%"),
        ("10m", "10m is below the minimum of 1Mi"),
        ("1e400", "1e400 is above the maximum of 8Pi"),
        ("5 %", "spec.devicePressure.minFree"),
    ],
)
def test_pressure_min_free_is_bounded_by_the_api_server(cluster: Any, namespace: str, value: str,
                                                        expected: str) -> None:
    """The API server refuses what the models refuse, naming the field and the
    value; the bounds themselves are accepted (a budget's override too)."""
    from pydantic import ValidationError

    from vramguard_api.budget import GPUMemoryBudget

    def budget(min_free: str) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryBudget",
            "metadata": {"name": "p", "namespace": namespace},
            "spec": {"selector": {}, "limits": {"perDevice": {"fraction": 0.25}},
                     "devicePressure": {"minFree": min_free}},
        }

    out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(budget(value)), check=False)
    assert out.returncode != 0 and expected in out.stderr, out.stderr
    with pytest.raises(ValidationError):
        GPUMemoryBudget.model_validate(budget(value))
    for fine in ("50%", "0.001%", "1Mi", "8Pi"):
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(budget(fine)))
