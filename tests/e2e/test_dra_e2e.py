"""What the scheduler booked through DRA, enforced end to end on the local cluster.

A kwok node of this module's own gets ResourceSlices from the stand-in DRA
driver (hack/cluster/dra_driver.py: three H100s and an A100 in MIG mode, the
UUIDs the simulated agent reports); pods ask for GPU memory through
ResourceClaimTemplates and a shared ResourceClaim; the real kube-scheduler
allocates them (consumable capacity, on by default in 1.36) and kwok runs the
pods; the simulated agent (``vramguard-agent run --backend sim``) reports their
usage on the devices the scheduler chose; the operator turns the claims into
per-device limits:

- a pod above its claim is warned and annotated, its neighbour on the same GPU
  within its (larger) claim is left alone;
- a claim shared by two pods: each within it, their sum above it;
- a pod with two claims on two GPUs: the one it exceeds is named;
- a claim on a MIG device: the limit is on the MIG device's UUID;
- a claim whose device the driver withdrew: reported by an Event, no action;
- ``vramguard top -A`` shows the ``dra/<claim>`` sources.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from vramguard_sim.scenario import Scenario

from .operator_harness import ROOT, OperatorProcess, events_about, wait_for

pytestmark = pytest.mark.e2e

_spec = importlib.util.spec_from_file_location("dra_driver", ROOT / "hack" / "cluster" / "dra_driver.py")
assert _spec is not None and _spec.loader is not None
driver = importlib.util.module_from_spec(_spec)
sys.modules["dra_driver"] = driver
_spec.loader.exec_module(driver)

GI = 1 << 30
TAINT = {"key": "vramguard.io/e2e", "value": "dra", "effect": "NoSchedule"}
ANN_LIMITS, ANN_MESSAGE = "vramguard.io/limits", "vramguard.io/violation"
GPUS = [
    {"model": "NVIDIA H100 80GB HBM3", "count": 3, "memory": "81559Mi", "reserved": "579Mi"},
    {
        "model": "NVIDIA A100-SXM4-40GB",
        "memory": "40960Mi",
        "reserved": "570Mi",
        "mig": [
            {"profile": "3g.20gb", "memory": "19968Mi", "gpuInstanceId": 2},
            {"profile": "1g.5gb", "memory": "4864Mi", "gpuInstanceId": 9},
        ],
    },
]
# claim templates: name -> (device class, device name in the slice, memory)
TEMPLATES = {
    "t20": ("gpu", "gpu-0", "20Gi"),
    "t40": ("gpu", "gpu-0", "40Gi"),
    "t10": ("gpu", "gpu-0", "10Gi"),
    "t30": ("gpu", "gpu-1", "30Gi"),
    "tmig": ("mig", "gpu-3-mig-1g5gb-1", "2Gi"),
    "tgone": ("gpu", "gpu-2", "10Gi"),
}
# pods: name -> (templates by pod claim name, shared claims, usage in GiB by device name)
PODS: dict[str, tuple[dict[str, str], list[str], dict[str, float]]] = {
    "over": ({"gpu": "t20"}, [], {"gpu-0": 30}),
    "within": ({"gpu": "t40"}, [], {"gpu-0": 30}),
    "share-a": ({}, ["shared"], {"gpu-1": 12}),
    "share-b": ({}, ["shared"], {"gpu-1": 12}),
    "two": ({"small": "t10", "big": "t30"}, [], {"gpu-0": 15, "gpu-1": 20}),
    "mig": ({"gpu": "tmig"}, [], {"gpu-3-mig-1g5gb-1": 3}),
    "gone": ({"gpu": "tgone"}, [], {"gpu-2": 15}),
}


def selector(device: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f"device.attributes['{driver.DRIVER}'].uuid == '{device}'"}}]


def request(klass: str, uuid: str, memory: str) -> dict[str, Any]:
    exactly = {
        "deviceClassName": f"{klass}.vramguard.test",
        "selectors": selector(uuid),
        "capacity": {"requests": {"memory": memory}},
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def pod_manifest(name: str, node: str, templates: dict[str, str], shared: list[str]) -> dict[str, Any]:
    claims = [{"name": k, "resourceClaimTemplateName": v} for k, v in templates.items()]
    claims += [{"name": c, "resourceClaimName": c} for c in shared]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": claims,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/trainer:1",
                    "resources": {"claims": [{"name": c["name"]} for c in claims]},
                }
            ],
        },
    }


def node_manifest(node: str) -> dict[str, Any]:
    labels = {"type": "kwok", "kubernetes.io/hostname": node, "nvidia.com/gpu.present": "true"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "annotations": {"kwok.x-k8s.io/node": "fake"}, "labels": labels},
        "spec": {"taints": [TAINT]},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        },
    }


def agent_scenario(node: str, namespace: str, allocated: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The simulated node: its GPUs, and each pod's processes on the devices the
    scheduler allocated (``allocated``: pod -> device name -> claim), index and MIG
    slot read back from the device's name."""
    pods = []
    for name, (_, _, usage) in PODS.items():
        processes = []
        for device, gib in usage.items():
            assert device in allocated[name], f"{name}: {device} not allocated ({allocated[name]})"
            parts = device.split("-")  # gpu-<i> or gpu-<i>-mig-<profile>-<slot>
            proc: dict[str, Any] = {"gpu": int(parts[1]), "memory": f"{int(gib * 1024)}Mi"}
            if "mig" in parts:
                proc["mig"] = int(parts[-1])
            processes.append(proc)
        pods.append({"namespace": namespace, "name": name, "containers": [{"name": "main", "processes": processes}]})
    return {"nodes": [{"name": node, "gpus": GPUS, "pods": pods}]}


# --- the module's cluster state ---------------------------------------------------------


class Setup:
    """What the module made: the node, its devices by name, and the claims allocated."""

    def __init__(self, node: str, namespace: str, uuids: dict[str, str]) -> None:
        self.node, self.namespace, self.uuids = node, namespace, uuids
        self.claims: dict[str, dict[str, str]] = {}  # pod -> device name -> claim name


@pytest.fixture(scope="module")
def api(cluster: Any) -> client.ApiClient:
    return cluster.api_client()


def _allocations(custom: client.CustomObjectsApi, namespace: str) -> dict[str, dict[str, Any]]:
    items = custom.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims")["items"]
    return {c["metadata"]["name"]: c for c in items if (c.get("status") or {}).get("allocation")}


@pytest.fixture(scope="module")
def dra(cluster: Any, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """Node, slices, claims and pods (allocated by the scheduler, Running), the
    withdrawn device, and the simulated agent reporting; torn down afterwards."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    suffix = os.urandom(3).hex()
    node, namespace = f"dra-{suffix}", f"t-dra-{suffix}"
    scenario = Scenario.model_validate({"nodes": [{"name": node, "gpus": GPUS}]})
    devices = driver.devices_from_scenario(scenario)[node]
    setup = Setup(node, namespace, {d.name: d.uuid for d in devices})
    cluster.kubectl("apply", "-f", str(ROOT / "hack/cluster/dra-deviceclasses.yaml"))
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node_manifest(node)))
    cluster.wait("--for=condition=Ready", f"node/{node}", timeout_s=60)
    driver.publish(api, [driver.resource_slice(node, devices)])
    core.create_namespace({"metadata": {"name": namespace}})
    agent: subprocess.Popen[bytes] | None = None
    try:
        for name, (klass, device, memory) in TEMPLATES.items():
            body = {"metadata": {"name": name}, "spec": {"spec": request(klass, setup.uuids[device], memory)}}
            custom.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaimtemplates", body)
        body = {"metadata": {"name": "shared"}, "spec": request("gpu", setup.uuids["gpu-1"], "20Gi")}
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", body)
        for name, (templates, shared, _) in PODS.items():
            core.create_namespaced_pod(namespace, pod_manifest(name, node, templates, shared))

        def running() -> bool:
            pods = core.list_namespaced_pod(namespace).items
            return len(pods) == len(PODS) and all(p.status.phase == "Running" for p in pods)

        wait_for(running, 90, "the pods allocated and Running")
        claims = _allocations(custom, namespace)
        for p in core.list_namespaced_pod(namespace).items:
            names = [s.resource_claim_name for s in p.status.resource_claim_statuses or ()]
            names += [rc.resource_claim_name for rc in p.spec.resource_claims if rc.resource_claim_name]
            setup.claims[p.metadata.name] = {
                r["device"]: n for n in names for r in claims[n]["status"]["allocation"]["devices"]["results"]
            }
        driver.withdraw(api, node, "gpu-2")
        scenario_file = tmp_path_factory.mktemp("dra") / "scenario.yaml"
        scenario_file.write_text(yaml.safe_dump(agent_scenario(node, namespace, setup.claims)))
        log = (scenario_file.parent / "agent.log").open("w")
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'api'}:{ROOT / 'agent'}:{ROOT / 'sim'}", "KUBECONFIG": cluster.kubeconfig}
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "vramguard_agent", "run", "--backend", "sim", "--scenario", str(scenario_file),
                "--node", node, "--sample-interval", "1s", "--heartbeat", "3s", "--min-report-interval", "1s",
            ],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def reported() -> bool:
            try:
                ngu = custom.get_cluster_custom_object("vramguard.io", "v1alpha1", "nodegpuusages", node)
            except client.ApiException:
                return False
            pods = (ngu.get("status") or {}).get("pods") or []
            return sum(1 for p in pods if p.get("vramBytes")) == len(PODS)

        wait_for(reported, 60, "the agent's report of the pods")
        yield setup
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceslice", f"{node}-{driver.DRIVER}", "--wait=false", check=False)
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        cluster.kubectl("delete", "nodegpuusage", node, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(cluster: Any, dra: Setup) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        cluster.kubeconfig, [dra.namespace], ["--evaluation-period=1s", "--debounce=10ms", "--freshness=60s"]
    )
    op.start(evaluating=False)
    try:
        yield op
    finally:
        op.stop()


# --- helpers -----------------------------------------------------------------------------------


def pod_annotation(core: client.CoreV1Api, setup: Setup, pod: str, key: str) -> str | None:
    return (core.read_namespaced_pod(pod, setup.namespace).metadata.annotations or {}).get(key)


def limits_of(core: client.CoreV1Api, setup: Setup, pod: str) -> dict[str, Any] | None:
    text = pod_annotation(core, setup, pod, ANN_LIMITS)
    return json.loads(text) if text else None


def reasons(core: client.CoreV1Api, setup: Setup, pod: str) -> list[str]:
    uid = core.read_namespaced_pod(pod, setup.namespace).metadata.uid
    return [e.reason for e in events_about(core, setup.namespace, uid)]


# --- the scheduler's side ------------------------------------------------------------------------


def test_dra_scheduler_books_memory_on_the_drivers_devices(api: client.ApiClient, dra: Setup) -> None:
    custom = client.CustomObjectsApi(api)
    claims = _allocations(custom, dra.namespace)
    over = claims[dra.claims["over"]["gpu-0"]]
    (result,) = over["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (driver.DRIVER, dra.node, "gpu-0")
    assert result["consumedCapacity"]["memory"] == "20Gi" and result.get("shareID")
    shared = claims["shared"]
    assert sorted(r["name"] for r in shared["status"]["reservedFor"]) == ["share-a", "share-b"]
    assert dra.claims["two"] == {"gpu-0": dra.claims["two"]["gpu-0"], "gpu-1": dra.claims["two"]["gpu-1"]}
    assert dra.claims["mig"].keys() == {"gpu-3-mig-1g5gb-1"}


# --- the operator's side ------------------------------------------------------------------------


def test_dra_pod_over_its_claim_is_annotated_its_neighbour_within_its_claim_is_not(
    api: client.ApiClient, dra: Setup, operator: OperatorProcess
) -> None:
    core = client.CoreV1Api(api)
    gpu0 = dra.uuids["gpu-0"]
    limits = wait_for(lambda: limits_of(core, dra, "over"), 60, "the pod's limits from its claim")
    assert limits[f"perDevice[{gpu0}]"]["source"] == f"dra/{dra.claims['over']['gpu-0']}"
    assert limits[f"perDevice[{gpu0}]"]["bytes"] == 20 * GI
    message = wait_for(lambda: pod_annotation(core, dra, "over", ANN_MESSAGE), 60, "the pod over its claim annotated")
    assert "default:over" in message and gpu0 in message and "20Gi" in message
    # the Events follow the annotation patch (the applier's order): wait for them
    wait_for(lambda: "LimitExceeded" in reasons(core, dra, "over"), 30, "the LimitExceeded Event on the pod")
    # the neighbour uses the same 30Gi, within its 40Gi claim
    # its limits annotation is written on its own (not with the other pod's): wait for it too
    within = wait_for(lambda: limits_of(core, dra, "within"), 30, "the neighbour's limits from its claim")
    assert within[f"perDevice[{gpu0}]"]["bytes"] == 40 * GI
    assert pod_annotation(core, dra, "within", ANN_MESSAGE) is None
    assert not {"AboveWarningThreshold", "LimitExceeded"} & set(reasons(core, dra, "within"))


def test_dra_shared_claim_is_a_total_over_its_pods(api: client.ApiClient, dra: Setup, operator: OperatorProcess) -> None:
    core = client.CoreV1Api(api)
    for pod in ("share-a", "share-b"):
        message = wait_for(lambda p=pod: pod_annotation(core, dra, p, ANN_MESSAGE), 60, f"{pod} annotated")
        assert "dra:shared" in message and "TotalVRAM 24Gi > 20Gi" in message
        limits = limits_of(core, dra, pod)
        assert limits is not None and limits[f"perDevice[{dra.uuids['gpu-1']}]"]["source"] == "dra/shared"


def test_dra_two_claims_on_two_devices(api: client.ApiClient, dra: Setup, operator: OperatorProcess) -> None:
    core = client.CoreV1Api(api)
    message = wait_for(lambda: pod_annotation(core, dra, "two", ANN_MESSAGE), 60, "the two-claim pod annotated")
    assert dra.uuids["gpu-0"] in message and dra.uuids["gpu-1"] not in message  # 15Gi of 10Gi; 20Gi of 30Gi
    limits = limits_of(core, dra, "two")
    assert limits is not None
    assert limits[f"perDevice[{dra.uuids['gpu-0']}]"]["bytes"] == 10 * GI
    assert limits[f"perDevice[{dra.uuids['gpu-1']}]"]["bytes"] == 30 * GI


def test_dra_mig_device_claim(api: client.ApiClient, dra: Setup, operator: OperatorProcess) -> None:
    core = client.CoreV1Api(api)
    mig = dra.uuids["gpu-3-mig-1g5gb-1"]
    assert mig.startswith("MIG-")
    message = wait_for(lambda: pod_annotation(core, dra, "mig", ANN_MESSAGE), 60, "the MIG pod annotated")
    assert mig in message
    limits = limits_of(core, dra, "mig")
    assert limits is not None and limits[f"perDevice[{mig}]"]["bytes"] == 2 * GI


def test_dra_vanished_device_is_reported_and_not_acted_on(
    api: client.ApiClient, dra: Setup, operator: OperatorProcess
) -> None:
    core = client.CoreV1Api(api)
    uid = core.read_namespaced_pod("gone", dra.namespace).metadata.uid
    event = wait_for(
        lambda: events_about(core, dra.namespace, uid, "AllocatedDeviceMissing"), 60, "the missing device reported"
    )[0]
    assert event.type == "Warning" and "gpu-2" in event.message and dra.claims["gone"]["gpu-2"] in event.message
    # 15Gi used against a 10Gi claim, but the claim's device is gone: no limit, no action
    wait_for(lambda: pod_annotation(core, dra, "over", ANN_MESSAGE), 60, "an evaluation with actions")
    assert pod_annotation(core, dra, "gone", ANN_MESSAGE) is None
    assert limits_of(core, dra, "gone") is None


def test_dra_top_shows_the_claims(cluster: Any, dra: Setup, operator: OperatorProcess, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    wait_for(lambda: limits_of(core, dra, "over"), 60, "the limits written")
    env = {**cluster.env(), "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "operator", "agent", "sim"))}
    out = subprocess.run(
        [sys.executable, "-m", "vramguard_operator", "top", "-A"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if dra.namespace in line]
    over = next(line for line in lines if " over " in f" {line} ")
    assert f"dra/{dra.claims['over']['gpu-0']}" in over
    assert any("dra/shared" in line for line in lines)
