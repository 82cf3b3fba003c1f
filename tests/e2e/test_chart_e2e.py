"""The Helm chart on a real API server: the commands of docs/install.md, run as
they are written (validate server-side with default and non-default values,
install, upgrade, uninstall); the objects exist; the agent lands only on GPU
nodes; each ServiceAccount's grants are exactly what it uses, read from the API
server's audit log while the operator and the agent work under their own
tokens (``chart_rbac``), plus a reviewed list of exceptions; an agent's
pod-bound token may write only its own node's report; the operator's token may
change pods only through its annotations, pods/resize and pods/eviction; values
that break the schema are rejected; only the operator may write its state
annotations on pods.

kwok simulates the kubelet, so the chart's containers do not run: for the RBAC
proof the operator and agent run on the host with their ServiceAccounts'
pod-bound tokens (``chart_rbac`` says how)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.chart_rbac import (
    Agent,
    AuditLog,
    ChartOperator,
    Webhooks,
    bound_token,
    sim_scenario,
    token_kubeconfig,
)
from tests.e2e.operator_harness import (
    GROUP,
    VERSION,
    budget_manifest,
    events_about,
    pod_manifest,
    run_pods,
    wait_for,
)
from tests.unit.chart.helm import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    doc_blocks,
    doc_commands,
    find_helm,
    one,
    render,
    template_args,
)
from tests.unit.chart.rbac import (
    Call,
    Usage,
    compare,
    credential_id,
    grants,
    rules_of,
    service_account,
    usage,
)

pytestmark = pytest.mark.e2e

OPERATOR = f"system:serviceaccount:{NAMESPACE}:vramguard-operator"
NODE_POLICY = "vramguard-agent-own-node"
STATE_POLICY = "vramguard-operator-pod-state"
WRITES_POLICY = "vramguard-operator-pod-writes"
AGENT = f"system:serviceaccount:{NAMESPACE}:vramguard-agent"
# Two extra kwok nodes: one without any GPU label (no agent may land there) and
# one with only Node Feature Discovery's NVIDIA label and the nvidia.com/gpu
# taint (an agent must land there: affinity on the NFD label, toleration).
CPU_NODE, NFD_NODE = "vg-chart-cpu", "vg-chart-nfd"


def fake_node(name: str, labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "type": "kwok", **labels}},
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                   "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }


class Docs:
    """Runs the marked blocks of docs/install.md against the cluster, with the
    cached helm first on PATH."""

    def __init__(self, cluster: Any, helm: str) -> None:
        self.cluster = cluster
        self.env = {**cluster.env(), "PATH": f"{Path(helm).parent}{os.pathsep}{os.environ['PATH']}"}
        self.blocks = doc_blocks()
        self.ran: list[str] = []
        self.install_output = ""

    def run(self, block: str, check: bool = True) -> list[subprocess.CompletedProcess[str]]:
        """Run each command of ``block`` in the repository root; on failure (when
        ``check``) fail the test naming the command and its output."""
        results = []
        for cmd in doc_commands(self.blocks[block]):
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, env=self.env,
                                  capture_output=True, text=True, timeout=400)
            self.ran.append(cmd)
            results.append(proc)
            if check and proc.returncode != 0:
                pytest.fail(f"docs/install.md [{block}] `{cmd}` exited {proc.returncode}:\n"
                            f"{proc.stdout}\n{proc.stderr}")
        return results

    def shell(self, cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def docs(cluster: Any) -> Iterator[Docs]:
    helm = cluster.helm or find_helm()
    if helm is None:
        pytest.skip("helm binary not found; hack/cluster/build.sh builds it")
    d = Docs(cluster, helm)
    # Left over from an interrupted run.
    d.shell(f"helm uninstall {RELEASE} -n {NAMESPACE} --wait --timeout 2m")
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s",
                    check=False)
    nodes = [fake_node(CPU_NODE, {}, []),
             fake_node(NFD_NODE, {"feature.node.kubernetes.io/pci-0302_10de.present": "true"},
                       [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(nodes))
    cluster.wait("--for=condition=Ready", f"node/{CPU_NODE}", f"node/{NFD_NODE}",
                 timeout_s=60)
    try:
        d.run("namespace")
        yield d
    finally:
        d.run("uninstall", check=False)
        cluster.kubectl("delete", "node", CPU_NODE, NFD_NODE, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "nodegpuusages.vramguard.io", CPU_NODE, NFD_NODE,
                        "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def installed(docs: Docs) -> Docs:
    docs.install_output = docs.run("install")[0].stdout
    return docs


def get(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


# --- validate, install ----------------------------------------------------------


def test_docs_validate_block_passes_server_side(docs):
    results = docs.run("validate")
    applied = [r.stdout for r in results if "--dry-run=server" in r.args[-1]]
    assert len(applied) == 2
    for out in applied:
        assert "(server dry run)" in out
        for kind in ("daemonset.apps/", "deployment.apps/", "validatingadmissionpolicy",
                     "validatingwebhookconfiguration", "clusterrole.rbac"):
            assert kind in out, (kind, out)


def test_monitoring_values_are_valid_where_the_server_knows_the_kind(docs, cluster):
    """cert-manager's and the Prometheus Operator's CRDs are not on the local
    cluster: every other object of that render is validated server-side, and
    those four kinds are the only ones left out."""
    args = template_args(values_files=[CHART / "ci" / "monitoring-values.yaml"])
    out = docs.shell("helm " + " ".join(args))
    assert out.returncode == 0, out.stderr
    objs = [o for o in yaml.safe_load_all(out.stdout) if o]
    served = [o for o in objs if not o["apiVersion"].startswith(("cert-manager.io/",
                                                                 "monitoring.coreos.com/"))]
    assert sorted(o["kind"] for o in objs if o not in served) == [
        "Certificate", "PrometheusRule", "ServiceMonitor"]
    # The values put the Grafana dashboard in the namespace "monitoring".
    created = cluster.kubectl("create", "namespace", "monitoring", check=False).returncode == 0
    try:
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                              input=yaml.safe_dump_all(served), check=False)
    finally:
        if created:
            cluster.kubectl("delete", "namespace", "monitoring", "--wait=false")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("(server dry run)") == len(served)


def test_install_creates_every_object(installed, cluster):
    ns = ["-n", NAMESPACE]
    for ref in ("serviceaccount/vramguard-operator", "serviceaccount/vramguard-agent",
                "deployment/vramguard-operator", "daemonset/vramguard-agent",
                "service/vramguard-operator", "service/vramguard-agent",
                "poddisruptionbudget/vramguard-operator", "secret/vramguard-webhook-tls"):
        assert get(cluster, ref, *ns)["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for ref in ("clusterrole/vramguard-operator", "clusterrole/vramguard-agent",
                "clusterrolebinding/vramguard-operator", "clusterrolebinding/vramguard-agent",
                "validatingwebhookconfiguration/vramguard",
                "mutatingwebhookconfiguration/vramguard",
                f"validatingadmissionpolicy/{NODE_POLICY}",
                f"validatingadmissionpolicybinding/{NODE_POLICY}",
                f"validatingadmissionpolicy/{STATE_POLICY}",
                f"validatingadmissionpolicybinding/{STATE_POLICY}",
                f"validatingadmissionpolicy/{WRITES_POLICY}",
                f"validatingadmissionpolicybinding/{WRITES_POLICY}"):
        get(cluster, ref)
    dep = get(cluster, "deployment/vramguard-operator", *ns)
    assert dep["status"].get("availableReplicas") == 1
    # The controller-manager type-checks each policy's CEL against the schema
    # of what it matches and reports warnings in status; there must be none.
    for policy in (NODE_POLICY, STATE_POLICY, WRITES_POLICY):
        deadline = time.monotonic() + 60
        while True:
            vap = get(cluster, f"validatingadmissionpolicy/{policy}")
            status = vap.get("status", {})
            if status.get("observedGeneration") == vap["metadata"]["generation"]:
                break
            assert time.monotonic() < deadline, f"{policy} not type-checked: {status}"
            time.sleep(1)
        assert status.get("typeChecking", {}).get("expressionWarnings") is None, (policy, status)


def test_install_prints_the_notes(installed):
    out = installed.install_output
    assert "STATUS: deployed" in out and "NOTES:" in out
    assert f"is installed in namespace {NAMESPACE}" in out
    assert f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged" in out


def tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    """Kubernetes' matching rule (core/v1 Toleration.ToleratesTaint)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("operator") == "Exists" and not t.get("key"):
            return True
        if t.get("key") == taint["key"] and (t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", "")):
            return True
    return False


def test_agent_runs_on_gpu_nodes_only(installed, cluster):
    nodes = get(cluster, "nodes")["items"]
    ds = get(cluster, "daemonset/vramguard-agent", "-n", NAMESPACE)
    tolerations = ds["spec"]["template"]["spec"].get("tolerations", [])
    gpu_labels = ("nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present",
                  "feature.node.kubernetes.io/pci-0302_10de.present",
                  "feature.node.kubernetes.io/pci-0300_10de.present")
    # GPU nodes whose NoSchedule taints the agent tolerates (the real node's
    # vramguard.io/real-node taint it does not: docs/real-node.md).
    gpu = {n["metadata"]["name"] for n in nodes
           if any(n["metadata"]["labels"].get(k) == "true" for k in gpu_labels)
           and all(tolerates(tolerations, t) for t in n["spec"].get("taints", []) if t["effect"] != "PreferNoSchedule")}
    assert NFD_NODE in gpu and CPU_NODE not in gpu
    assert ds["status"]["desiredNumberScheduled"] == len(gpu)
    pods = get(cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent")["items"]
    assert {p["spec"]["nodeName"] for p in pods} == gpu
    for p in pods:
        assert p["spec"]["priority"] == 2000001000   # system-node-critical resolved
        assert p["spec"]["hostPID"] is True


# --- RBAC: what RBAC must never allow ---------------------------------------------------
# The audit proof below shows each grant is used; these are the denials that
# matter most, asked of the API server itself.

CANNOT = [
    # (who, verb, resource, subresource)
    (OPERATOR, "delete", "pods", ""),           # evictions only, never a bare delete
    (OPERATOR, "create", "pods", ""),
    (OPERATOR, "patch", "pods", "status"),
    (OPERATOR, "get", "secrets", ""),
    (OPERATOR, "patch", "nodes", ""),
    (OPERATOR, "list", "poddisruptionbudgets.policy", ""),  # the Eviction API checks them
    (OPERATOR, "create", "nodegpuusages.vramguard.io", ""),
    (OPERATOR, "patch", "nodegpuusages.vramguard.io", "status"),
    (OPERATOR, "delete", "gpumemorybudgets.vramguard.io", ""),
    (OPERATOR, "patch", "validatingwebhookconfigurations.admissionregistration.k8s.io", ""),
    (AGENT, "create", "pods", "eviction"),
    (AGENT, "patch", "pods", ""),
    (AGENT, "delete", "pods", ""),
    (AGENT, "get", "pods", ""),                 # list/watch only, by node (field selector)
    (AGENT, "patch", "pods", "resize"),
    (AGENT, "get", "secrets", ""),
    (AGENT, "list", "nodes", ""),
    (AGENT, "patch", "nodes", ""),
    (AGENT, "delete", "nodegpuusages.vramguard.io", ""),
    (AGENT, "list", "gpumemorybudgets.vramguard.io", ""),
    (AGENT, "delete", "events", ""),            # it creates Events (NoReadableDevice), never deletes one
    (AGENT, "patch", "events", ""),
]


@pytest.mark.parametrize(("who", "verb", "resource", "sub"), CANNOT,
                         ids=[f"{w.rsplit(':', 1)[1]}-{v}-{r}{'/' + s if s else ''}"
                              for w, v, r, s in CANNOT])
def test_kubectl_auth_can_i_says_no(installed, cluster, who, verb, resource, sub):
    args = ["auth", "can-i", verb, resource, f"--as={who}", "-n", "default"]
    if sub:
        args.append(f"--subresource={sub}")
    res = cluster.kubectl(*args, check=False)
    assert res.stdout.strip() == "no", res.stderr


# --- node restriction, with real tokens ---------------------------------------


def token_client(cluster: Any, token: str) -> Any:
    """An ApiClient that authenticates with ``token`` only (no client certificate)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=cfg)
    cfg.cert_file = cfg.key_file = None
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def report(node: str) -> dict[str, Any]:
    return {"apiVersion": "vramguard.io/v1alpha1", "kind": "NodeGPUUsage",
            "metadata": {"name": node}, "spec": {"nodeName": node}}


def status_patch() -> dict[str, Any]:
    return {"status": {"sampleTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}


def forbidden(call: Any) -> str:
    """Run ``call``; return the API server's message of the 403 it must raise."""
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, err.value.body
    return str(json.loads(err.value.body)["message"])


@pytest.fixture(scope="module")
def agent_on_nfd_node(installed: Docs, cluster: Any) -> dict[str, Any]:
    pods = get(cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=agent",
               "--field-selector", f"spec.nodeName={NFD_NODE}")["items"]
    assert len(pods) == 1
    return dict(pods[0])


def test_agent_token_carries_its_node_claim(cluster, agent_on_nfd_node):
    from kubernetes import client

    pod = agent_on_nfd_node["metadata"]["name"]
    token = cluster.kubectl("create", "token", "vramguard-agent", "-n", NAMESPACE,
                            "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip()
    review = client.AuthenticationV1Api(token_client(cluster, token)).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    user = review.status.user_info
    assert user.username == AGENT
    assert user.extra["authentication.kubernetes.io/node-name"] == [NFD_NODE]
    assert user.extra["authentication.kubernetes.io/pod-name"] == [pod]


def test_agent_writes_only_its_own_node_report(cluster, agent_on_nfd_node):
    from kubernetes import client

    pod = agent_on_nfd_node["metadata"]["name"]
    token = cluster.kubectl("create", "token", "vramguard-agent", "-n", NAMESPACE,
                            "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip()
    api = client.CustomObjectsApi(token_client(cluster, token))
    group = ("vramguard.io", "v1alpha1", "nodegpuusages")
    cluster.kubectl("delete", "nodegpuusages.vramguard.io", NFD_NODE, CPU_NODE,
                    "--ignore-not-found")

    # Its own node: create, then patch the status, as the agent does.
    created = api.create_cluster_custom_object(*group, report(NFD_NODE))
    assert created["metadata"]["name"] == NFD_NODE
    patched = api.patch_cluster_custom_object_status(*group, NFD_NODE, status_patch())
    assert "sampleTime" in patched["status"]

    # Another node's report: neither created nor changed.
    msg = forbidden(lambda: api.create_cluster_custom_object(*group, report(CPU_NODE)))
    assert f"may write only NodeGPUUsage {NFD_NODE}, not {CPU_NODE}" in msg
    assert "vramguard-agent-own-node" in msg
    cluster.kubectl("create", "-f", "-", input=json.dumps(report(CPU_NODE)))
    msg = forbidden(lambda: api.patch_cluster_custom_object_status(*group, CPU_NODE, status_patch()))
    assert f"may write only NodeGPUUsage {NFD_NODE}, not {CPU_NODE}" in msg
    assert "status" not in get(cluster, f"nodegpuusages.vramguard.io/{CPU_NODE}")
    # Its own name, but claiming another node in the spec.
    cluster.kubectl("delete", "nodegpuusages.vramguard.io", NFD_NODE)
    claim = report(NFD_NODE)
    claim["spec"]["nodeName"] = CPU_NODE
    msg = forbidden(lambda: api.create_cluster_custom_object(*group, claim))
    assert f"may not report spec.nodeName {CPU_NODE}" in msg
    # The report itself is never patched or updated, only its status (RBAC).
    forbidden(lambda: api.patch_cluster_custom_object(*group, CPU_NODE, {"metadata": {"labels": {"x": "y"}}}))
    # And no deleting, even its own (RBAC).
    forbidden(lambda: api.delete_cluster_custom_object(*group, NFD_NODE))


def test_token_without_node_claim_writes_nothing(cluster, agent_on_nfd_node):
    from kubernetes import client

    token = cluster.kubectl("create", "token", "vramguard-agent", "-n", NAMESPACE).stdout.strip()
    api = client.CustomObjectsApi(token_client(cluster, token))
    cluster.kubectl("delete", "nodegpuusages.vramguard.io", NFD_NODE, "--ignore-not-found")
    msg = forbidden(lambda: api.create_cluster_custom_object(
        "vramguard.io", "v1alpha1", "nodegpuusages", report(NFD_NODE)))
    assert "carries no node claim" in msg


def test_agent_token_cannot_evict_or_patch_pods(cluster, agent_on_nfd_node):
    from kubernetes import client

    pod = agent_on_nfd_node["metadata"]["name"]
    token = cluster.kubectl("create", "token", "vramguard-agent", "-n", NAMESPACE,
                            "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip()
    core = client.CoreV1Api(token_client(cluster, token))
    victim = get(cluster, "pods", "-n", NAMESPACE, "-l",
                 "app.kubernetes.io/component=operator")["items"][0]["metadata"]["name"]
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": victim, "namespace": NAMESPACE}}
    forbidden(lambda: core.create_namespaced_pod_eviction(victim, NAMESPACE, eviction))
    forbidden(lambda: core.patch_namespaced_pod(victim, NAMESPACE,
                                                {"metadata": {"annotations": {"x": "y"}}}))
    # Listing the pods of its node is what it may do.
    listed = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NFD_NODE}")
    assert [p.metadata.name for p in listed.items] == [pod]


# --- RBAC proven by the audit log -------------------------------------------------------------

RBAC_NS = "vg-chart-rbac"
LADDER = [{"action": "Annotate", "after": "0s"},
          {"action": "Throttle", "after": "1s", "cpuLimit": "100m"},
          {"action": "Evict", "after": "2s"}]
# Grants that the run below may leave unused, each with why the chart keeps it.
# Reviewed: an entry here is a permission that no test proves, so keep it short.
MAY_GO_UNUSED: dict[str, dict[Call, str]] = {
    "vramguard-operator": {
        Call("", "pods", "get"): "an OOM record's pod (controller/oom.py): the scenario below has no OOM kill; "
        "tests/e2e/test_real_node_oom_e2e.py drives it",
        Call("vramguard.io", "nodegpuusages", "patch"): "the OOM records' acknowledgement (controller/oom.py): the "
        "scenario below has no OOM kill; tests/e2e/test_real_node_oom_e2e.py drives it",
    },
    "vramguard-agent": {
        Call("", "events", "create"): "only when no GPU device can be read (test_agent_e2e proves it); the run's "
                                      "simulated GPUs are readable",
    },
}


@dataclass
class RbacRun:
    """What the operator's and the agent's tokens asked for, by account name."""

    usage: dict[str, Usage]
    logs: str


@pytest.fixture(scope="module")
def rbac_run(installed: Docs, cluster: Any, agent_on_nfd_node: dict[str, Any],
             tmp_path_factory: pytest.TempPathFactory) -> RbacRun:
    """The operator and the agent at work under their pod-bound tokens (see
    ``chart_rbac``) while ``drive_every_grant`` runs; returns what the audit log
    recorded for those two tokens (and no other request)."""
    audit = AuditLog.of_local_cluster()
    work = tmp_path_factory.mktemp("rbac")
    operator_pod = get(cluster, "pods", "-n", NAMESPACE, "-l",
                       "app.kubernetes.io/component=operator")["items"][0]["metadata"]["name"]
    tokens = {"vramguard-operator": bound_token(cluster, NAMESPACE, "vramguard-operator", operator_pod),
              "vramguard-agent": bound_token(cluster, NAMESPACE, "vramguard-agent",
                                             agent_on_nfd_node["metadata"]["name"])}
    kubeconfigs = {name: token_kubeconfig(cluster.kubeconfig, token, work / f"{name}.kubeconfig")
                   for name, token in tokens.items()}
    cluster.kubectl("delete", "namespace", RBAC_NS, "--ignore-not-found", "--timeout=120s")
    cluster.kubectl("delete", "nodegpuusages.vramguard.io", NFD_NODE, "--ignore-not-found")
    cluster.kubectl("create", "namespace", RBAC_NS)
    operator = ChartOperator(one(render(), "Deployment"), kubeconfigs["vramguard-operator"], work / "tls")
    agent = Agent(NFD_NODE, sim_scenario(NFD_NODE, [(RBAC_NS, "w0", "12Gi")]),
                  kubeconfigs["vramguard-agent"], work)
    start, hooks, failed = audit.offset(), None, None
    try:
        operator.start()
        hooks = Webhooks.point_at(cluster, RELEASE, operator.webhook_port, operator.ca.read_bytes())
        agent.start()
        drive_every_grant(cluster.api_client())
    except AssertionError as err:
        failed = err
    finally:
        agent.stop()
        operator.stop()
        if hooks is not None:
            hooks.restore()
        cluster.kubectl("delete", "gpumemorypolicy", RBAC_NS, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "namespace", RBAC_NS, "--wait=false", check=False)
    events = audit.events(start)
    run = RbacRun(
        usage={name: usage(events, service_account(NAMESPACE, name), [credential_id(token)])
               for name, token in tokens.items()},
        logs=f"--- operator ---\n{operator.tail()}\n--- agent ---\n{agent.tail()}",
    )
    if failed is not None:  # a missing grant stops a path: say which request was refused
        denied = [f"{name}: {c}" for name, u in run.usage.items() for c in u.denied()]
        pytest.fail(f"{failed}\nrefused (403): {denied or 'none'}\n{run.logs}")
    return run


def drive_every_grant(api: Any) -> None:
    """A policy and a budget whose pod goes over its limit: the agent reports it
    (its node, its pods, its report and the report's status); the operator
    reads everything it watches, rejects a budget above the policy's ceiling
    in its webhook, annotates, throttles (pods/resize), tries to evict while a
    PodDisruptionBudget refuses (a repeated Event is counted up), evicts once
    the PodDisruptionBudget is gone, and writes the budget's and the policy's
    status, with an Event for each action."""
    from kubernetes.client import CoreV1Api, CustomObjectsApi, PolicyV1Api

    core, custom, policy = CoreV1Api(api), CustomObjectsApi(api), PolicyV1Api(api)
    custom.create_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryPolicy", "metadata": {"name": RBAC_NS},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": RBAC_NS}},
                 "ceilings": {"perPod": {"vram": "40Gi"}},
                 "evictionRateLimit": {"perMinute": 60, "burst": 10}}})
    wait_for(lambda: (custom.get_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", RBAC_NS)
                      .get("status") or {}).get("namespaces") == [RBAC_NS], 30, "the policy's status")
    with pytest.raises(ApiException) as err:   # the webhook on the host, from the operator's indexes
        custom.create_namespaced_custom_object(GROUP, VERSION, RBAC_NS, "gpumemorybudgets",
                                               budget_manifest("too-big", {"perPod": {"vram": "50Gi"}}, LADDER))
    assert 'GPUMemoryBudget "too-big" is invalid' in json.loads(err.value.body)["message"], err.value.body
    policy.create_namespaced_pod_disruption_budget(RBAC_NS, {
        "metadata": {"name": "keep-w0"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "rbac"}}}})
    w0 = run_pods(core, RBAC_NS, [pod_manifest("w0", NFD_NODE, {"app": "rbac"})])["w0"]
    custom.create_namespaced_custom_object(GROUP, VERSION, RBAC_NS, "gpumemorybudgets",
                                           budget_manifest("rbac", {"perPod": {"vram": "10Gi"}}, LADDER))
    wait_for(lambda: core.read_namespaced_pod("w0", RBAC_NS).spec.containers[0].resources.limits["cpu"]
             == "100m", 60, "w0 throttled through pods/resize")  # 30 s ran out once in a full run under load
    wait_for(lambda: [e for e in events_about(core, RBAC_NS, w0.metadata.uid, "EvictionBlocked")
                      if (e.count or 0) >= 2], 30, "a refused eviction retried (its Event counted up)")
    policy.delete_namespaced_pod_disruption_budget("keep-w0", RBAC_NS)
    wait_for(lambda: not core.list_namespaced_pod(RBAC_NS, field_selector="metadata.name=w0").items,
             30, "w0 evicted")
    wait_for(lambda: "Evicting" in [e.reason for e in events_about(core, RBAC_NS, w0.metadata.uid)],
             10, "the Evicting Event")
    budget = custom.get_namespaced_custom_object(GROUP, VERSION, RBAC_NS, "gpumemorybudgets", "rbac")
    assert (budget.get("status") or {}).get("observedGeneration") == 1, budget.get("status")


def test_the_audit_log_holds_each_components_requests(rbac_run):
    """Each account made requests in the run with the token bound to its pod
    (an empty audit log would prove nothing)."""
    for name, used in rbac_run.usage.items():
        assert used.calls, f"no request of {name} in the audit log\n{rbac_run.logs}"


@pytest.mark.parametrize("account", ["vramguard-operator", "vramguard-agent"])
def test_chart_grants_what_the_audit_log_shows_used(rbac_run, account):
    """The chart's grants for ``account``, as ``helm template`` renders them,
    equal what its token asked for, plus ``MAY_GO_UNUSED``; nothing was refused."""
    granted = grants(render(), NAMESPACE, account)
    used = rbac_run.usage[account]
    problems = compare(granted, used, MAY_GO_UNUSED[account])
    seen = "\n".join(f"  {c}: HTTP {sorted(codes)}" for c, codes in sorted(used.calls.items()))
    assert not problems, "\n".join(problems) + f"\nused by {account}:\n{seen}\n{rbac_run.logs}"


@pytest.mark.parametrize("account", ["vramguard-operator", "vramguard-agent"])
def test_installed_roles_are_the_rendered_ones(installed, cluster, account):
    """What the audit is compared with is what the install block installed."""
    rendered = one(render(), "ClusterRole", account)
    assert rules_of(get(cluster, f"clusterrole/{account}")) == rules_of(rendered)


# --- what the operator may change on a pod, with its real token ---------------------------------

WRITES_NS = "vg-chart-op-writes"


@pytest.fixture(scope="module")
def operator_core(installed: Docs, cluster: Any) -> Iterator[Any]:
    """A CoreV1Api with a token of the operator's ServiceAccount, and a pod
    ``p0`` running in ``WRITES_NS`` that in-place resize can act on."""
    from kubernetes import client

    cluster.kubectl("delete", "namespace", WRITES_NS, "--ignore-not-found", "--timeout=120s")
    cluster.kubectl("create", "namespace", WRITES_NS)
    run_pods(client.CoreV1Api(cluster.api_client()), WRITES_NS,
             [pod_manifest("p0", NFD_NODE, {"app": "p0"})])
    token = cluster.kubectl("create", "token", "vramguard-operator", "-n", NAMESPACE).stdout.strip()
    try:
        yield client.CoreV1Api(token_client(cluster, token))
    finally:
        cluster.kubectl("delete", "namespace", WRITES_NS, "--wait=false", check=False)


def patch_p0(core: Any, body: dict[str, Any]) -> Any:
    """A strategic merge patch of p0 (lists merge by key, as kubectl's default patch)."""
    return core.patch_namespaced_pod("p0", WRITES_NS, body,
                                     _content_type="application/strategic-merge-patch+json")


@pytest.mark.parametrize(("body", "says"), [
    ({"metadata": {"labels": {"app": "other"}}}, "may not change a pod's labels"),
    ({"metadata": {"annotations": {"example.com/note": "x"}}},
     "may change only vramguard.io/ annotations on a pod, not example.com/note"),
    ({"metadata": {"finalizers": ["example.com/hold"]}}, "finalizers or owner references"),
    ({"spec": {"activeDeadlineSeconds": 60}}, "may not change a pod's spec"),
    ({"spec": {"containers": [{"name": "main", "image": "registry.invalid/other:1"}]}},
     "may not change a pod's spec"),
], ids=["label", "foreign-annotation", "finalizer", "spec-field", "image"])
def test_operator_token_may_not_change_anything_else_through_the_pod(cluster, operator_core, body, says):
    before = get(cluster, "pod/p0", "-n", WRITES_NS)
    msg = forbidden(lambda: patch_p0(operator_core, body))
    assert says in msg and WRITES_POLICY in msg, msg
    after = get(cluster, "pod/p0", "-n", WRITES_NS)
    assert (after["metadata"]["resourceVersion"], after["spec"]) == (before["metadata"]["resourceVersion"],
                                                                    before["spec"])


@pytest.mark.parametrize("args", [
    ["delete", "pod", "p0", "--wait=false"],
    ["patch", "pod", "p0", "--subresource=status", "--type=merge", "-p", '{"status":{"message":"x"}}'],
], ids=["delete", "status"])
def test_the_policy_holds_where_rbac_would_allow(cluster, operator_core, args):
    """With every permission (the group system:masters), the operator's name
    still may not delete a pod or write its status."""
    res = cluster.kubectl(*args, "-n", WRITES_NS, f"--as={OPERATOR}", "--as-group=system:masters", check=False)
    assert res.returncode != 0 and WRITES_POLICY in res.stderr, res.stderr
    get(cluster, "pod/p0", "-n", WRITES_NS)


def test_operator_token_may_write_its_annotations_resize_and_evict(cluster, operator_core):
    """Last of these tests: the eviction removes p0."""
    got = patch_p0(operator_core, {"metadata": {"annotations": {"vramguard.io/violation": "x"}}})
    assert got.metadata.annotations["vramguard.io/violation"] == "x"
    patch_p0(operator_core, {"metadata": {"annotations": {"vramguard.io/violation": None}}})
    resized = operator_core.patch_namespaced_pod_resize(
        "p0", WRITES_NS, {"spec": {"containers": [{"name": "main", "resources": {
            "limits": {"cpu": "1"}, "requests": {"cpu": "1"}}}]}})
    assert resized.spec.containers[0].resources.limits["cpu"] == "1"
    operator_core.create_namespaced_pod_eviction("p0", WRITES_NS, {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p0", "namespace": WRITES_NS}})
    wait_for(lambda: cluster.kubectl("get", "pod", "p0", "-n", WRITES_NS, check=False).returncode != 0,
             30, "p0 evicted")


# --- the operator's state on pods ------------------------------------------------

STATE_NS = "vg-chart-pod-state"
TENANT = f"system:serviceaccount:{STATE_NS}:tenant"


@pytest.fixture(scope="module")
def tenant(installed: Docs, cluster: Any) -> Iterator[str]:
    """A namespace where ServiceAccount ``tenant`` may create and patch pods
    (status included), with pod ``w0`` carrying the operator's state."""
    cluster.kubectl("delete", "namespace", STATE_NS, "--ignore-not-found", "--timeout=120s")
    objs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STATE_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "tenant", "namespace": STATE_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pods", "namespace": STATE_NS},
         "rules": [{"apiGroups": [""], "resources": ["pods", "pods/status"],
                    "verbs": ["get", "create", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "pods", "namespace": STATE_NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
         "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": STATE_NS}]},
        state_pod("w0", {"vramguard.io/violations": "[]", "vramguard.io/original-cpu": "{}"}),
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))  # as a cluster admin
    try:
        yield STATE_NS
    finally:
        cluster.kubectl("delete", "namespace", STATE_NS, "--wait=false", check=False)


def state_pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": STATE_NS, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "busybox"}],
                     # never scheduled: kwok would play the kubelet, which is not the point here
                     "nodeSelector": {"vg-chart-e2e": "no-such-node"}}}


def patch_as(cluster: Any, who: str, annotations: dict[str, str | None],
             sub: str = "") -> subprocess.CompletedProcess[str]:
    args = ["patch", "pod", "w0", "-n", STATE_NS, f"--as={who}", "--type=merge",
            "-p", json.dumps({"metadata": {"annotations": annotations}})]
    if sub:
        args.append(f"--subresource={sub}")
    return cluster.kubectl(*args, check=False)


def annotations(cluster: Any) -> dict[str, str]:
    return dict(get(cluster, "pod/w0", "-n", STATE_NS)["metadata"].get("annotations") or {})


@pytest.mark.parametrize(("change", "sub"), [
    ({"vramguard.io/violations": "[]  "}, ""),            # changed
    ({"vramguard.io/violations": None}, ""),               # removed
    ({"vramguard.io/limits": '{"perPod":{}}'}, ""),        # added
    ({"vramguard.io/original-cpu": None}, "status"),       # through pods/status
    ({"vramguard.io/memory-limits": "{}"}, ""),            # the agent applies it: a tenant may not
    ({"vramguard.io/state-signature": "v1:" + "0" * 64}, ""),  # the seal on the state (issue 17)
    ({"vramguard.io/violations": '[{"budget":"b","kind":"PodVRAM","since":"2024-01-01T00:00:00Z",'
                                 '"step":"Evict"}]'}, ""),  # a forged step (issue 17)
], ids=["change", "remove", "add", "status", "memory-limits", "seal", "forged-evict"])
def test_a_tenant_may_not_edit_the_operators_state(cluster, tenant, change, sub):
    before = annotations(cluster)
    res = patch_as(cluster, TENANT, change, sub)
    assert res.returncode != 0
    assert "only the vramguard operator may add, change or remove" in res.stderr, res.stderr
    assert STATE_POLICY in res.stderr
    assert annotations(cluster) == before


def test_a_tenant_may_edit_other_annotations_and_the_operator_its_state(cluster, tenant):
    res = patch_as(cluster, TENANT, {"example.com/note": "mine"})
    assert res.returncode == 0, res.stderr
    # The operator with its own token (it patches without reading: it may not get pods).
    from kubernetes import client

    token = cluster.kubectl("create", "token", "vramguard-operator", "-n", NAMESPACE).stdout.strip()
    client.CoreV1Api(token_client(cluster, token)).patch_namespaced_pod(
        "w0", STATE_NS, {"metadata": {"annotations": {"vramguard.io/violations": None,
                                                      "vramguard.io/violation": "closed"}}},
        _content_type="application/merge-patch+json")
    got = annotations(cluster)
    assert got["example.com/note"] == "mine" and got["vramguard.io/violation"] == "closed"
    assert "vramguard.io/violations" not in got


def test_a_pod_may_be_created_with_the_webhooks_record_only(cluster, tenant):
    ok = state_pod("created", {"vramguard.io/injected": "{}"})
    res = cluster.kubectl("create", "-f", "-", f"--as={TENANT}", input=json.dumps(ok), check=False)
    assert res.returncode == 0, res.stderr
    bad = state_pod("preset", {"vramguard.io/original-cpu": '{"main":{"limit":"64"}}'})
    res = cluster.kubectl("create", "-f", "-", f"--as={TENANT}", input=json.dumps(bad), check=False)
    assert res.returncode != 0 and "vramguard.io/original-cpu" in res.stderr, res.stderr


# --- agent.enforceCaps -----------------------------------------------------------


def test_enforce_caps_daemonset_is_accepted_server_side(installed, cluster):
    """The API server accepts what agent.enforceCaps renders: SYS_ADMIN with
    allowPrivilegeEscalation false. It refuses that combination only for the
    spelling CAP_SYS_ADMIN (apimachinery compares the string), which is why the
    docs call no_new_privs no boundary here rather than rely on the API's check."""
    (ds,) = [o for o in render({"agent.enforceCaps": True}) if o["kind"] == "DaemonSet"]
    res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(ds), check=False)
    assert res.returncode == 0 and "(server dry run)" in res.stdout, res.stderr
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = ["CAP_SYS_ADMIN"]
    res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(ds), check=False)
    assert res.returncode != 0 and "cannot set `allowPrivilegeEscalation` to false" in res.stderr, res.stderr


# --- schema and upgrade ----------------------------------------------------------


def revision(docs: Docs) -> int:
    out = docs.shell(f"helm status {RELEASE} -n {NAMESPACE} -o json")
    assert out.returncode == 0, out.stderr
    return int(json.loads(out.stdout)["version"])


@pytest.mark.parametrize("bad", ["operator.replicas=2", "agent.backend=cuda",
                                 "webhook.tls.secretName=mine"])
def test_upgrade_with_values_breaking_the_schema_is_rejected(installed, bad):
    before = revision(installed)
    out = installed.shell(f"helm upgrade {RELEASE} {CHART} -n {NAMESPACE} --set {bad}")
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema" in out.stderr
    assert revision(installed) == before


def test_docs_upgrade_block_keeps_the_webhook_certificate(installed, cluster):
    def ca() -> tuple[str, set[str]]:
        secret = get(cluster, "secret/vramguard-webhook-tls", "-n", NAMESPACE)
        hooks = get(cluster, "validatingwebhookconfiguration/vramguard")["webhooks"]
        hooks += get(cluster, "mutatingwebhookconfiguration/vramguard")["webhooks"]
        return secret["data"]["ca.crt"], {h["clientConfig"]["caBundle"] for h in hooks}

    secret_ca, bundles = ca()
    assert bundles == {secret_ca}
    assert base64.b64decode(secret_ca).startswith(b"-----BEGIN CERTIFICATE-----")
    before = revision(installed)
    installed.run("upgrade")
    assert revision(installed) == before + 1
    assert ca() == (secret_ca, bundles)




def test_docs_uninstall_block_removes_the_release_and_keeps_the_crds(installed, cluster):
    installed.run("uninstall")
    for ref in ("validatingwebhookconfiguration/vramguard",
                "mutatingwebhookconfiguration/vramguard",
                f"validatingadmissionpolicy/{NODE_POLICY}",
                f"validatingadmissionpolicy/{STATE_POLICY}",
                f"validatingadmissionpolicy/{WRITES_POLICY}",
                "clusterrole/vramguard-operator", "clusterrole/vramguard-agent"):
        res = cluster.kubectl("get", ref, check=False)
        assert res.returncode != 0 and "NotFound" in res.stderr, ref
    for crd in ("gpumemorybudgets", "gpumemorypolicies", "nodegpuusages"):
        get(cluster, f"crd/{crd}.vramguard.io")
