"""Static checks of charts/vramguard, rendered with `helm template`: least
privilege per component (no "*", calls each one must never be allowed; that
each grant is used is proven by tests/e2e/test_chart_e2e.py from the API
server's audit log), the operator's pod-writes policy, the agent
DaemonSet's confinement, the node-restriction policy, the webhooks and their
TLS, the optional monitoring objects, values the schema rejects, the CRDs'
sync with crds/, and the images' non-root user."""

from __future__ import annotations

import base64
import filecmp
import json
import re
import tomllib
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509

from tests.unit.chart.helm import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    ROOT,
    HelmError,
    allows,
    doc_blocks,
    doc_commands,
    find,
    find_helm,
    helm,
    one,
    render,
)

pytestmark = pytest.mark.skipif(
    find_helm() is None,
    reason="helm binary not found ($HELM, ~/.cache/vramguard/bin/helm-*/helm or PATH); "
    "hack/cluster/build.sh builds it",
)

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
ALL_VALUES = [None, *CI_VALUES]
AGENT_SA = f"system:serviceaccount:{NAMESPACE}:vramguard-agent"
OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:vramguard-operator"
NODE_POLICY = "vramguard-agent-own-node"
STATE_POLICY = "vramguard-operator-pod-state"
WRITES_POLICY = "vramguard-operator-pod-writes"
STATE_KEYS = ["vramguard.io/violations", "vramguard.io/violation", "vramguard.io/original-cpu",
              "vramguard.io/state-signature", "vramguard.io/limits", "vramguard.io/memory-limits",
              "vramguard.io/injected"]

@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod_spec(obj)["containers"]
    return c


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# --- lint and render ---------------------------------------------------------


@pytest.mark.parametrize("values_file", ALL_VALUES, ids=lambda p: p.name if p else "default")
def test_helm_lint_passes(values_file):
    args = ["lint", str(CHART), "--strict", "--kube-version", "1.36.0"]
    if values_file:
        args += ["--values", str(values_file)]
    out = helm(*args)
    assert "0 chart(s) failed" in out


def test_default_render_has_every_component(default):
    kinds = sorted(o["kind"] for o in default)
    assert kinds == sorted([
        "ServiceAccount", "ServiceAccount", "ClusterRole", "ClusterRole",
        "ClusterRoleBinding", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget",
        "Service", "Service", "DaemonSet", "Secret", "Secret",
        "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ])
    for o in default:
        if o["kind"] not in {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration",
                             "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                             "ValidatingAdmissionPolicyBinding"}:
            assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]["name"]


# --- RBAC: least privilege ---------------------------------------------------


@pytest.mark.parametrize("values_file", ALL_VALUES, ids=lambda p: p.name if p else "default")
def test_no_rbac_rule_uses_a_wildcard(values_file):
    objs = render(values_files=[values_file] if values_file else [])
    roles = find(objs, "ClusterRole") + find(objs, "Role")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule


@pytest.mark.parametrize(("group", "resource", "verb"), [
    ("", "pods/eviction", "create"),
    ("", "pods", "patch"),
    ("", "pods", "update"),
    ("", "pods", "delete"),
    ("", "pods/resize", "patch"),
    ("", "pods", "get"),             # list/watch only, by node (field selector)
    ("", "secrets", "get"),
    ("", "nodes", "patch"),
    ("vramguard.io", "nodegpuusages", "delete"),
    ("vramguard.io", "gpumemorybudgets", "get"),
    ("vramguard.io", "gpumemorybudgets/status", "patch"),
])
def test_agent_cannot(default, group, resource, verb):
    assert not allows(one(default, "ClusterRole", "vramguard-agent"), group, resource, verb)


@pytest.mark.parametrize(("group", "resource", "verb"), [
    ("", "pods", "delete"),       # evictions only, never a bare delete
    ("", "pods", "create"),
    ("", "pods/status", "patch"),
    ("", "secrets", "get"),
    ("", "nodes", "patch"),
    ("events.k8s.io", "events", "create"),     # the actions post core/v1 Events
    ("policy", "poddisruptionbudgets", "list"),  # the Eviction API checks them, not us
    ("vramguard.io", "nodegpuusages", "create"),
    ("vramguard.io", "nodegpuusages/status", "patch"),
    ("vramguard.io", "gpumemorybudgets", "delete"),
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch"),
])
def test_operator_cannot(default, group, resource, verb):
    assert not allows(one(default, "ClusterRole", "vramguard-operator"), group, resource, verb)


def test_each_component_has_its_own_service_account(default):
    bindings = {b["metadata"]["name"]: b for b in find(default, "ClusterRoleBinding")}
    for component in ("operator", "agent"):
        b = bindings[f"vramguard-{component}"]
        assert b["roleRef"]["name"] == f"vramguard-{component}"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": f"vramguard-{component}",
                                  "namespace": NAMESPACE}]
    assert pod_spec(one(default, "Deployment"))["serviceAccountName"] == "vramguard-operator"
    assert pod_spec(one(default, "DaemonSet"))["serviceAccountName"] == "vramguard-agent"


# --- the agent DaemonSet ----------------------------------------------------


def test_agent_runs_only_on_gpu_nodes(default):
    spec = pod_spec(one(default, "DaemonSet"))
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    keys = [e["key"] for t in terms for e in t["matchExpressions"]]
    nfd = "feature.node.kubernetes.io/pci-"
    assert keys == ["nvidia.com/gpu.present", f"{nfd}10de.present", f"{nfd}0302_10de.present",
                    f"{nfd}0300_10de.present"]
    assert all(e["values"] == ["true"] for t in terms for e in t["matchExpressions"])
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert gpu_taint in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"


def test_agent_is_confined(default):
    ds = one(default, "DaemonSet")
    spec, c = pod_spec(ds), container(ds)
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    # Only the two host paths, each mounted read-only where the agent's flags say.
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host == {"host-proc": "/proc", "host-cgroup": "/sys/fs/cgroup"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert mounts["host-cgroup"]["readOnly"] is True
    assert "--proc-root=/host/proc" in c["args"]
    assert f"--cgroup-root={mounts['host-cgroup']['mountPath']}" in c["args"]


def test_agent_sees_every_gpu_without_taking_one(default):
    c = container(one(default, "DaemonSet"))
    e = env(c)
    assert e["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all"
    for section in ("requests", "limits"):
        assert not [r for r in c["resources"].get(section, {}) if r.startswith("nvidia.com/")]
    assert c["command"] == ["vramguard-agent"] and c["args"][0] == "run"
    assert "--backend=nvml" in c["args"] and "--sample-interval=5s" in c["args"] and "--ram-interval=30s" in c["args"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 9400}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_agent_command_line_is_accepted_by_the_agent_cli(default):
    """The chart's command line parses with the real `vramguard-agent` parser."""
    settings = pytest.importorskip("vramguard_agent.settings")
    c = container(one(default, "DaemonSet"))
    parsed = settings.parse(c["args"], env={"NODE_NAME": "gpu-1"})
    args = SimpleNamespace(command=parsed.command, **parsed.params)
    assert args.command == "run" and args.backend == "nvml"
    assert str(args.proc_root) == "/host/proc" and str(args.cgroup_root) == "/host/sys/fs/cgroup"
    assert args.sample_interval == 5.0 and args.ram_interval == 30.0
    assert args.metrics_address == ":9400"


def test_operator_command_line_is_accepted_by_the_operator_cli(default, monkeypatch):
    """The chart's command line parses with the real `vramguard` parser."""
    settings = pytest.importorskip("vramguard_operator.controller.settings")
    monkeypatch.setattr(settings, "read_key", lambda path: b"k" * 48)  # the mounted Secret's key
    c = container(one(default, "Deployment"))
    assert c["args"][0] == "operator"
    parsed = settings.parse_settings(c["args"][1:], env={})
    assert parsed.webhook is not None and parsed.namespaces == ()


def test_agent_as_root_stays_unprivileged():
    objs = render({"agent.runAsUser": 0, "agent.runtimeClassName": "nvidia"})
    ds = one(objs, "DaemonSet")
    assert pod_spec(ds)["securityContext"]["runAsNonRoot"] is False
    assert pod_spec(ds)["runtimeClassName"] == "nvidia"
    sc = container(ds)["securityContext"]
    assert sc["privileged"] is False and sc["capabilities"] == {"drop": ["ALL"]}


# --- node restriction ---------------------------------------------------------


def test_node_restriction_policy_binds_the_agent(default):
    vap = one(default, "ValidatingAdmissionPolicy", NODE_POLICY)
    binding = one(default, "ValidatingAdmissionPolicyBinding", NODE_POLICY)
    assert vap["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["vramguard.io"]
    assert set(rule["resources"]) == {"nodegpuusages", "nodegpuusages/status"}
    assert set(rule["operations"]) >= {"CREATE", "UPDATE"}
    (cond,) = spec["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == '{AGENT_SA}'"
    claim = "request.userInfo.extra['authentication.kubernetes.io/node-name']"
    assert claim in spec["variables"][0]["expression"]
    assert any(v["expression"] == "request.name == variables.node" for v in spec["validations"])


def test_node_restriction_follows_a_renamed_service_account():
    objs = render({"agent.serviceAccount.name": "gpu-agent"})
    (cond,) = one(objs, "ValidatingAdmissionPolicy", NODE_POLICY)["spec"]["matchConditions"]
    assert cond["expression"].endswith(f":{NAMESPACE}:gpu-agent'")
    assert pod_spec(one(objs, "DaemonSet"))["serviceAccountName"] == "gpu-agent"


def test_agent_disabled_renders_no_agent_objects():
    objs = render({"agent.enabled": False})
    assert not find(objs, "DaemonSet") and not find(objs, "ValidatingAdmissionPolicy", NODE_POLICY)
    assert "vramguard-agent" not in {o["metadata"]["name"] for o in objs}


# --- the operator's state on pods ---------------------------------------------


def test_pod_state_policy_lets_only_the_operator_write_its_annotations(default):
    vap = one(default, "ValidatingAdmissionPolicy", STATE_POLICY)
    binding = one(default, "ValidatingAdmissionPolicyBinding", STATE_POLICY)
    assert vap["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {"policyName": STATE_POLICY, "validationActions": ["Deny"]}
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    # pods/status too: a status update can change annotations as well
    assert rule["apiGroups"] == [""] and set(rule["resources"]) == {"pods", "pods/status"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert conditions["not-the-operator"] == f"request.userInfo.username != '{OPERATOR_SA}'"
    assert "'system:masters'" in conditions["not-a-cluster-admin"]
    keys = next(v["expression"] for v in spec["variables"] if v["name"] == "keys")
    assert keys == "[" + ", ".join(f"'{k}'" for k in STATE_KEYS) + "]"
    (check,) = spec["validations"]
    # on CREATE the mutating webhook's record (added before validation) is allowed
    assert "request.operation == 'CREATE'" in check["expression"]
    assert "k == 'vramguard.io/injected'" in check["expression"]
    assert check["reason"] == "Forbidden"


def test_pod_state_policy_follows_a_renamed_operator_and_can_be_turned_off():
    objs = render({"operator.serviceAccount.name": "gpu-op", "operator.annotationGuard.adminGroups": []})
    spec = one(objs, "ValidatingAdmissionPolicy", STATE_POLICY)["spec"]
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert conditions["not-the-operator"].endswith(f":{NAMESPACE}:gpu-op'")
    assert "not-a-cluster-admin" not in conditions
    objs = render({"operator.annotationGuard.enabled": False})
    assert not find(objs, "ValidatingAdmissionPolicy", STATE_POLICY)
    assert not find(objs, "ValidatingAdmissionPolicyBinding", STATE_POLICY)


def test_pod_writes_policy_covers_every_pod_write_of_the_operator(default):
    """Every operation on pods and on each of their subresources, for the
    operator's ServiceAccount only, denied on a failed evaluation too (what it
    allows is checked on the API server by tests/e2e/test_chart_e2e.py)."""
    vap = one(default, "ValidatingAdmissionPolicy", WRITES_POLICY)
    binding = one(default, "ValidatingAdmissionPolicyBinding", WRITES_POLICY)
    assert binding["spec"] == {"policyName": WRITES_POLICY, "validationActions": ["Deny"]}
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and set(rule["resources"]) == {"pods", "pods/*"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE", "CONNECT"}
    (cond,) = spec["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == '{OPERATOR_SA}'"
    assert all(v["reason"] == "Forbidden" for v in spec["validations"])


def test_pod_writes_policy_follows_a_renamed_operator_and_can_be_turned_off():
    objs = render({"operator.serviceAccount.name": "gpu-op"})
    (cond,) = one(objs, "ValidatingAdmissionPolicy", WRITES_POLICY)["spec"]["matchConditions"]
    assert cond["expression"].endswith(f":{NAMESPACE}:gpu-op'")
    objs = render({"operator.podWriteRestriction.enabled": False})
    assert not find(objs, "ValidatingAdmissionPolicy", WRITES_POLICY)
    assert not find(objs, "ValidatingAdmissionPolicyBinding", WRITES_POLICY)
    assert find(objs, "ValidatingAdmissionPolicy", STATE_POLICY)


# --- the operator -----------------------------------------------------------


def test_operator_is_a_single_standalone_replica(default):
    dep = one(default, "Deployment", "vramguard-operator")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    c = container(dep)
    assert c["command"] == ["vramguard"]
    assert c["args"][:3] == ["operator", "--standalone", "--all-namespaces"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 9090, "webhook": 9443}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec(dep)["securityContext"]["runAsNonRoot"] is True


def test_operator_pdb_selects_the_operator_pods(default):
    pdb = one(default, "PodDisruptionBudget")
    dep = one(default, "Deployment")
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_operator_shards_run_one_replica_each_with_leases_of_their_own(monkeypatch):
    from vramguard_operator.controller import settings as operator_settings
    from vramguard_operator.controller.shards import LEASE_PREFIX, LEASE_VERBS

    monkeypatch.setattr(operator_settings, "read_key", lambda path: b"k" * 48)  # the mounted Secret's key

    objs = render({"operator.shards": 3})
    dep = one(objs, "Deployment", "vramguard-operator")
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    args = container(dep)["args"]
    settings = operator_settings.parse_settings(args[1:], env={})
    assert (settings.shards, settings.lease_duration) == (3, 30.0)
    assert {"POD_NAME", "POD_NAMESPACE"} <= set(env(container(dep)))  # the identity and the Leases' namespace
    role = one(objs, "Role", "vramguard-operator-shards")
    assert role["metadata"]["namespace"] == NAMESPACE
    verbs = {v for r in role["rules"] for v in r["verbs"]}
    assert verbs == set(LEASE_VERBS)
    named = next(r for r in role["rules"] if "resourceNames" in r)
    assert named["resourceNames"] == [f"{LEASE_PREFIX}{i}" for i in range(3)]
    assert all(r["resources"] == ["leases"] and r["apiGroups"] == ["coordination.k8s.io"] for r in role["rules"])
    binding = one(objs, "RoleBinding", "vramguard-operator-shards")
    assert binding["subjects"][0]["name"] == pod_spec(dep)["serviceAccountName"]
    assert not find(render(), "Role", "vramguard-operator-shards")  # no shards: no Lease access


@pytest.mark.parametrize("values", [
    {"operator.replicas": 2},
    {"operator.replicas": 0},
])
def test_operator_replicas_other_than_one_are_rejected(values):
    with pytest.raises(HelmError, match="/operator/replicas"):
        render(values)


# --- webhooks -----------------------------------------------------------------


def webhooks(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    hooks = {}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for cfg in find(objs, kind):
            hooks.update({h["name"]: h for h in cfg["webhooks"]})
    return hooks


def test_webhooks_paths_and_failure_policies(default):
    hooks = webhooks(default)
    expected = {
        "gpumemorybudgets.validate.vramguard.io": ("/validate-budget", "Fail"),
        "pods.validate.vramguard.io": ("/validate-pod", "Ignore"),
        "pods.mutate.vramguard.io": ("/mutate-pod", "Ignore"),
    }
    assert set(hooks) == set(expected)
    for name, (path, policy) in expected.items():
        h = hooks[name]
        assert h["clientConfig"]["service"] == {
            "name": "vramguard-operator", "namespace": NAMESPACE, "path": path, "port": 443}
        assert h["failurePolicy"] == policy
        assert h["sideEffects"] == "None" and h["admissionReviewVersions"] == ["v1"]
    svc = one(default, "Service", "vramguard-operator")
    port = {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    assert port in svc["spec"]["ports"]


def test_pod_webhooks_skip_own_and_system_namespaces_and_non_gpu_pods(default):
    for name in ("pods.validate.vramguard.io", "pods.mutate.vramguard.io"):
        h = webhooks(default)[name]
        (expr,) = h["namespaceSelector"]["matchExpressions"]
        assert expr["operator"] == "NotIn" and set(expr["values"]) == {NAMESPACE, "kube-system"}
        assert h["rules"][0]["operations"] == ["CREATE"] and h["rules"][0]["resources"] == ["pods"]
        (cond,) = h["matchConditions"]
        assert "startsWith(p)" in cond["expression"] and "['nvidia.com/']" in cond["expression"]


def test_generated_certificate_is_signed_by_the_ca_bundle_and_names_the_service(default):
    secret = one(default, "Secret", "vramguard-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    for h in webhooks(default).values():
        assert base64.b64decode(h["clientConfig"]["caBundle"]) == ca_pem
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"vramguard-operator.{NAMESPACE}.svc" in sans.get_values_for_type(x509.DNSName)
    dep = one(default, "Deployment")
    (vol,) = [v for v in pod_spec(dep)["volumes"] if v["name"] == "webhook-tls"]
    assert vol["secret"]["secretName"] == "vramguard-webhook-tls"


def tls_secrets(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The webhook's TLS Secrets (the state key's Secret is another)."""
    return [o for o in find(objs, "Secret") if o.get("type") == "kubernetes.io/tls"]


def test_cert_manager_injects_the_ca_instead():
    objs = render({"webhook.certManager.enabled": True})
    assert not tls_secrets(objs)
    cert = one(objs, "Certificate")
    assert cert["spec"]["secretName"] == "vramguard-webhook-tls"
    assert f"vramguard-operator.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    issuer = one(objs, "Issuer")["metadata"]["name"]
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        cfg = one(objs, kind)
        assert cfg["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/vramguard-webhook-tls"}
        assert all("caBundle" not in h["clientConfig"] for h in cfg["webhooks"])


def test_existing_secret_and_ca_bundle_from_values():
    objs = render({"webhook.tls.secretName": "mine", "webhook.tls.caBundle": "Y2E="})
    assert not tls_secrets(objs) and not find(objs, "Certificate")
    assert {h["clientConfig"]["caBundle"] for h in webhooks(objs).values()} == {"Y2E="}
    (vol,) = [v for v in pod_spec(one(objs, "Deployment"))["volumes"] if v["name"] == "webhook-tls"]
    assert vol["secret"]["secretName"] == "mine"


def test_webhooks_disabled():
    objs = render({"webhook.enabled": False})
    assert not webhooks(objs) and not tls_secrets(objs)
    c = container(one(objs, "Deployment"))
    assert not [a for a in c["args"] if a.startswith("--webhook")]


# --- monitoring -------------------------------------------------------------


def test_monitoring_objects_only_when_enabled(default):
    for kind in ("ServiceMonitor", "PrometheusRule", "ConfigMap"):
        assert not find(default, kind)


def test_monitoring_objects():
    objs = render(values_files=[CHART / "ci" / "monitoring-values.yaml"])
    sm = one(objs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    # Both Services it selects name their port "metrics".
    for svc in find(objs, "Service"):
        assert all(sm["spec"]["selector"]["matchLabels"][k] == svc["metadata"]["labels"][k]
                   for k in sm["spec"]["selector"]["matchLabels"])
        assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    rules = alert_rules(objs)
    assert {alert for alert, _ in rules} == {
        "VRAMGuardBudgetNearLimit", "VRAMGuardBudgetViolation", "VRAMGuardMemoryLeakSuspected", "VRAMGuardAgentStale",
        "VRAMGuardAgentUnhealthy",
        "VRAMGuardEvaluationErrors", "VRAMGuardInnocentOOMKill", "VRAMGuardDeviceMemoryNearFull",
        "VRAMGuardDeviceFreeMemoryLow", "VRAMGuardNodeSwapping", "VRAMGuardPodDiagnosis"}
    assert rules["VRAMGuardBudgetNearLimit", "warning"]["expr"].endswith(">= 0.9")
    assert rules["VRAMGuardAgentStale", "warning"]["expr"].endswith("> 60")
    assert rules["VRAMGuardBudgetNearLimit", "warning"]["for"] == "10m"
    cm = one(objs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["vramguard.json"])
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    # Every metric the alerts use is on the dashboard too.
    for rule in rules.values():
        for metric in re.findall(r"vramguard_[a-z_]+", rule["expr"]):
            assert metric in exprs, metric


def alert_rules(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The PrometheusRule's rules by (alert, severity): a warning and a critical share a name."""
    rules = one(objs, "PrometheusRule")["spec"]["groups"][0]["rules"]
    return {(r["alert"], r["labels"]["severity"]): r for r in rules}


def test_default_thresholds_are_the_seeds_and_peers_levels():
    rules = alert_rules(render({"metrics.prometheusRule.enabled": True}))
    assert rules["VRAMGuardBudgetNearLimit", "warning"]["expr"].endswith(">= 0.85")
    assert rules["VRAMGuardBudgetNearLimit", "critical"]["expr"].endswith(">= 0.97")
    assert rules["VRAMGuardDeviceMemoryNearFull", "warning"]["expr"].endswith(">= 0.85")
    assert rules["VRAMGuardDeviceMemoryNearFull", "critical"]["expr"].endswith(">= 0.97")
    assert rules["VRAMGuardDeviceFreeMemoryLow", "warning"]["expr"].endswith("< 0.05")
    assert rules["VRAMGuardNodeSwapping", "warning"]["expr"].endswith("> 1048576")
    assert 'diagnosis=~"RAMShort|VRAMLeak|RAMLeak"' in rules["VRAMGuardPodDiagnosis", "warning"]["expr"]


def test_each_threshold_is_a_chart_value():
    rules = alert_rules(render({
        "metrics.prometheusRule.enabled": True, "metrics.prometheusRule.usageCriticalRatio": 0.99,
        "metrics.prometheusRule.deviceFreeRatio": 0.1, "metrics.prometheusRule.swapInBytesPerSecond": 0,
        "metrics.prometheusRule.diagnoses": ["RAMShort"]}))
    assert rules["VRAMGuardBudgetNearLimit", "critical"]["expr"].endswith(">= 0.99")
    assert rules["VRAMGuardDeviceFreeMemoryLow", "warning"]["expr"].endswith("< 0.1")
    assert rules["VRAMGuardNodeSwapping", "warning"]["expr"].endswith("> 0")
    assert 'diagnosis=~"RAMShort"' in rules["VRAMGuardPodDiagnosis", "warning"]["expr"]


# --- the schema rejects bad values --------------------------------------------


@pytest.mark.parametrize(("values", "where"), [
    ({"agent.backend": "cuda"}, "/agent/backend"),
    ({"agent.interval": "5"}, "/agent/interval"),
    ({"agent.ramInterval": "often"}, "/agent/ramInterval"),
    ({"agent.port": 0}, "/agent/port"),
    ({"agent.runAsUser": -1}, "/agent/runAsUser"),
    ({"agent.simulatedDriverDir": "relative/dir"}, "/agent/simulatedDriverDir"),
    ({"agent.priorityClassName": ""}, "/agent/priorityClassName"),
    ({"agent.hostPaths.proc": "proc"}, "/agent/hostPaths/proc"),
    ({"agent.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution": None},
     "missing property 'requiredDuringSchedulingIgnoredDuringExecution'"),
    ({"agent.privileged": True}, "/agent"),
    ({"agent.enforceCaps": "yes"}, "/agent/enforceCaps"),
    ({"agent.resources.limits.memory": "lots"}, "/agent/resources/limits/memory"),
    ({"operator.podDisruptionBudget.maxUnavailable": 0},
     "/operator/podDisruptionBudget/maxUnavailable"),
    ({"operator.image.pullPolicy": "Sometimes"}, "/operator/image/pullPolicy"),
    ({"webhook.pods.failurePolicy": "Maybe"}, "/webhook/pods/failurePolicy"),
    ({"webhook.timeoutSeconds": 31}, "/webhook/timeoutSeconds"),
    ({"webhook.pods.excludeNamespaces": ["Not_A_Namespace"]}, "/webhook/pods/excludeNamespaces/0"),
    ({"webhook.pods.gpuResourcePrefixes": ["nvidia.com/'"]}, "/webhook/pods/gpuResourcePrefixes/0"),
    ({"webhook.tls.secretName": "mine"}, "/webhook/tls/caBundle"),
    ({"webhook.tls.caBundle": "Y2E="}, "/webhook/tls/secretName"),
    ({"metrics.prometheusRule.usageWarningRatio": 1.5},
     "/metrics/prometheusRule/usageWarningRatio"),
    ({"metrics.prometheusRule.for": "5 minutes"}, "/metrics/prometheusRule/for"),
    ({"unknownTopLevel": 1}, "unknownTopLevel"),
])
def test_schema_rejects(values, where):
    with pytest.raises(HelmError) as err:
        render(values)
    assert "schema" in str(err.value) and where in str(err.value)


# --- CRDs and images ---------------------------------------------------------


def test_chart_crds_are_a_copy_of_crds_dir():
    generated = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert generated, "crds/ is empty: run make generate"
    copied = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert copied == generated, "charts/vramguard/crds is out of sync: run make generate"
    _, mismatch, errors = filecmp.cmpfiles(ROOT / "crds", CHART / "crds", generated, shallow=False)
    assert not mismatch and not errors, f"differ from crds/: {mismatch + errors}; run make generate"


@pytest.mark.parametrize(("component", "extra"), [("operator", "operator"), ("agent", "agent")])
def test_images_run_as_the_charts_non_root_user(default, component, extra):
    dockerfile = (ROOT / "images" / f"{component}.Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users, "no USER line"
    uid = users[-1].split(":")[0]
    # Numeric, or the kubelet cannot check runAsNonRoot.
    assert uid.isdigit() and int(uid) != 0
    kind = "Deployment" if component == "operator" else "DaemonSet"
    assert pod_spec(one(default, kind))["securityContext"]["runAsUser"] == int(uid)
    # The project with this component's extra only, into the venv, at the pinned versions.
    assert re.search(rf"pip install -q -c images/constraints.txt \"\.\[{extra}\]\"", dockerfile)
    other = {"operator": "agent", "agent": "operator"}[extra]
    assert f"[{other}]" not in dockerfile
    assert "COPY --from=venv /opt/vramguard /opt/vramguard" in dockerfile


@pytest.mark.parametrize("component", ["operator", "agent"])
def test_build_context_lets_in_every_file_the_dockerfile_reads(component):
    """.dockerignore is an allow-list (``*``, then ``!path``): each repository file
    a Dockerfile's first stage reads (``images/...``) must be let in, or the build
    fails only where it runs."""
    allowed = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    dockerfile = (ROOT / "images" / f"{component}.Dockerfile").read_text()
    read = set(re.findall(r"(?<![\w/])(images/[\w.-]+)", dockerfile)) - {f"images/{component}.Dockerfile"}
    assert read and read <= allowed, read - allowed
    assert {"pyproject.toml", "README.md", "api", "operator", "agent"} <= allowed


def test_image_pins_cover_every_dependency_of_both_extras():
    """images/constraints.txt (make lock) pins each package the images install: every
    requirement of the project and of both extras has a line ``name==version``."""
    pins = {line.split("==")[0].lower().replace("_", "-")
            for line in (ROOT / "images/constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["operator"],
              *project["optional-dependencies"]["agent"]]
    names = {re.split(r"[<>=\[ ]", req, maxsplit=1)[0].lower().replace("_", "-") for req in wanted}
    assert names - pins == set()


def test_simulated_driver_dir_is_test_only_and_off_by_default(default):
    """agent.simulatedDriverDir (the local cluster's real node) mounts that host
    directory read-only and points the agent at its socket; unset, nothing of it renders."""
    c = container(one(default, "DaemonSet"))
    assert not any("simgpu" in a for a in c["args"])
    assert "simgpu" not in {m["name"] for m in c["volumeMounts"]}
    ds = one(render({"agent.simulatedDriverDir": "/var/lib/simgpu"}), "DaemonSet")
    c = container(ds)
    assert "--simgpu-socket=/run/simgpu/driver.sock" in c["args"]
    assert {"name": "simgpu", "mountPath": "/run/simgpu", "readOnly": True} in c["volumeMounts"]
    assert {"name": "simgpu", "hostPath": {"path": "/var/lib/simgpu", "type": "Directory"}} in pod_spec(ds)["volumes"]
    settings = pytest.importorskip("vramguard_agent.settings")
    parsed = settings.parse(c["args"], env={"NODE_NAME": "real-node-1"})
    assert str(parsed.params["simgpu_socket"]) == "/run/simgpu/driver.sock"


# --- docs/install.md: the commands the end-to-end test runs -------------------


def test_install_doc_has_the_blocks_the_e2e_test_runs():
    blocks = doc_blocks()
    assert set(blocks) == {"namespace", "validate", "install", "upgrade", "uninstall"}
    assert f"--kube-version {KUBE_VERSION}" in blocks["validate"]
    install = list(doc_commands(blocks["install"]))
    assert install[0].startswith(f"helm install vramguard charts/vramguard --namespace {NAMESPACE}")
    validate = list(doc_commands(blocks["validate"]))
    assert sum("kubectl apply --dry-run=server -f -" in c for c in validate) == 2
    for f in CI_VALUES:
        if f.name == "nondefault-values.yaml":
            assert any(str(f.relative_to(ROOT)) in c for c in validate)


def test_readme_chart_commands_are_those_the_tests_run():
    """Any chart command the README shows must be one docs/install.md runs in the e2e test."""
    run = {c for block in doc_blocks().values() for c in doc_commands(block)}
    readme = (ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else ""
    shown = [c for block in re.findall(r"```(?:bash|console|sh)\n(.*?)```", readme, re.S)
             for c in doc_commands(block)
             if "charts/vramguard" in c or NAMESPACE in c]
    assert [c for c in shown if c not in run] == []


# --- agent.enforceCaps ---------------------------------------------------------


def test_enforce_caps_grants_exactly_root_sys_admin_and_the_writable_cgroup_tree(default):
    """What NVML needs to set memory limits, and nothing else (docs/agent.md, "Memory limits")."""
    off = one(default, "DaemonSet")
    on = one(render({"agent.enforceCaps": True}), "DaemonSet")
    assert "--enforce-caps" not in container(off)["args"] and "--enforce-caps" in container(on)["args"]
    spec, c = pod_spec(on), container(on)
    assert spec["securityContext"]["runAsUser"] == 0 and spec["securityContext"]["runAsNonRoot"] is False
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = [(m["name"], m["mountPath"], m.get("readOnly", False)) for m in c["volumeMounts"]]
    assert ("host-cgroup", "/sys/fs/cgroup", False) in mounts and ("host-cgroup", "/host/sys/fs/cgroup", True) in mounts
    # Same host paths, same node access otherwise.
    assert spec["volumes"] == pod_spec(off)["volumes"]
    assert {k: v for k, v in spec.items() if k != "securityContext" and k != "containers"} == {
        k: v for k, v in pod_spec(off).items() if k != "securityContext" and k != "containers"
    }
    assert {m["mountPath"] for m in c["volumeMounts"]} - {m["mountPath"] for m in container(off)["volumeMounts"]} == {
        "/sys/fs/cgroup"
    }


def test_enforce_caps_command_line_is_accepted_by_the_agent_cli():
    settings = pytest.importorskip("vramguard_agent.settings")
    c = container(one(render({"agent.enforceCaps": True}), "DaemonSet"))
    assert settings.parse(c["args"], env={"NODE_NAME": "gpu-1"}).params["enforce_caps"] is True


def test_agent_knows_its_own_pod_uid(default):
    assert env(container(one(default, "DaemonSet")))["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_the_state_key_is_generated_mounted_and_kept(default):
    """The operator seals its state on pods with a key of its own (docs/operator.md,
    "Forged state"): a generated Secret, kept on uninstall and upgrade, mounted
    into the operator alone and named by its flag."""
    (secret,) = [o for o in find(default, "Secret") if o["metadata"]["name"] == "vramguard-operator-state-key"]
    assert len(base64.b64decode(secret["data"]["state-key"])) == 48
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    dep = one(default, "Deployment")
    (vol,) = [v for v in pod_spec(dep)["volumes"] if v["name"] == "state-key"]
    assert vol["secret"]["secretName"] == "vramguard-operator-state-key"
    c = container(dep)
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "state-key"]
    assert mount["readOnly"] is True
    assert f"--state-key-file={mount['mountPath']}/state-key" in c["args"]
    assert "state-key" not in str(pod_spec(one(default, "DaemonSet")))


def test_an_existing_state_key_secret_is_used_as_it_is():
    objs = render({"operator.stateKey.existingSecret": "my-key"})
    assert not [o for o in find(objs, "Secret") if o.get("type") != "kubernetes.io/tls"]
    (vol,) = [v for v in pod_spec(one(objs, "Deployment"))["volumes"] if v["name"] == "state-key"]
    assert vol["secret"]["secretName"] == "my-key"


def test_no_state_key_when_disabled():
    objs = render({"operator.stateKey.enabled": False})
    c = container(one(objs, "Deployment"))
    assert not [a for a in c["args"] if a.startswith("--state-key")]
    assert not [o for o in find(objs, "Secret") if o.get("type") != "kubernetes.io/tls"]
