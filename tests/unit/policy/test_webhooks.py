"""The webhooks' configuration and the views they read from kopf's indexes
(the admission handlers themselves run in tests/e2e/test_policy_e2e.py)."""

from __future__ import annotations

import pytest

from vramguard_operator.controller.policy_handlers import policy_body
from vramguard_operator.controller.webhooks import WebhookConfig
from vramguard_operator.plan.entries import Versioned, budget_entry, namespace_entry, node_entry
from vramguard_operator.plan.index_views import budgets_of, labels_of, namespaces_of, nodes_of, policies_of
from vramguard_operator.policy.mutation import GPU_POD_LABEL, gpu_pod_label_ops

from .builders import device, node_obj, policy, report


def test_config_from_env() -> None:
    assert WebhookConfig.from_env({}) is None
    cfg = WebhookConfig.from_env(
        {
            "VRAMGUARD_WEBHOOK_PORT": "9443",
            "VRAMGUARD_WEBHOOK_TLS_DIR": "/tls",
            "VRAMGUARD_WEBHOOK_MANAGED": "true",
            "VRAMGUARD_WEBHOOK_EXTRA_SANS": "a.svc,b.svc",
        }
    )
    assert cfg == WebhookConfig(9443, "/tls", managed=True, extra_sans=("a.svc", "b.svc"))
    assert cfg.hosts() == ["127.0.0.1", "localhost", "a.svc", "b.svc"]
    with pytest.raises(ValueError, match="VRAMGUARD_WEBHOOK_PORT"):
        WebhookConfig.from_env({"VRAMGUARD_WEBHOOK_PORT": "https"})


def test_hosts_include_a_specific_listen_address() -> None:
    assert WebhookConfig(1, "/t", addr="10.0.0.5", host="10.0.0.5").hosts() == ["10.0.0.5", "localhost", "127.0.0.1"]


def test_node_entry_keeps_gpu_nodes_only() -> None:
    assert node_entry(node_obj("gpu-h100-ts")) is not None
    mig = node_entry(node_obj("gpu-a100-mig"))
    assert mig is not None and mig["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] == "2"
    assert node_entry({"metadata": {"name": "cpu", "labels": {}}, "status": {"allocatable": {"cpu": "4"}}}) is None
    aliyun = {"metadata": {"name": "a"}, "status": {"allocatable": {"aliyun.com/gpu-mem": "160"}}}
    assert node_entry(aliyun) is not None


def test_store_views() -> None:
    pol = policy("p", ceilings={"perPod": {"vram": "8Gi"}})
    policies = {"p": policy_body(pol.to_api()), "broken": {"metadata": {"name": "broken"}, "spec": {"mode": "x"}}}
    assert [p.metadata.name for p in policies_of(policies)] == ["p"]
    ns_store = {"ml": namespace_entry({"metadata": {"uid": "u", "labels": {"team": "a"}}})}
    assert labels_of(ns_store, "ml") == {"team": "a"} and labels_of(ns_store, "x") == {}
    assert namespaces_of(ns_store) == {"ml": {"team": "a"}}
    good = {
        "metadata": {"name": "b", "namespace": "ml", "uid": "u1"},
        "spec": {"selector": {}, "limits": {"perPod": {"vram": "1Gi"}}},
    }
    bad = {"metadata": {"name": "c", "namespace": "ml", "uid": "u2"}, "spec": {"selector": {}}}
    budgets = {("ml", "b"): budget_entry(good), ("ml", "c"): budget_entry(bad), ("x", "b"): budget_entry(good)}
    assert [b.metadata.name for b in budgets_of(budgets, "ml")] == ["b"]
    nodes = {"gpu-h100-ts": node_entry(node_obj("gpu-h100-ts"))}
    reports = {"gpu-h100-ts": Versioned("u", "1", report("gpu-h100-ts", [device("GPU-a", 80000, 500)]))}
    (facts,) = nodes_of(nodes, reports)
    assert facts.name == "gpu-h100-ts" and facts.device_usable() == ((80000 - 500) * 2**20, "report")
    assert policies_of(None) == [] and nodes_of(None, None) == []


def test_the_webhook_labels_gpu_pods_for_the_operators_watch() -> None:
    assert gpu_pod_label_ops({"metadata": {}}) == [
        {"op": "add", "path": "/metadata/labels", "value": {GPU_POD_LABEL: "true"}}]
    assert gpu_pod_label_ops({"metadata": {"labels": {"app": "x"}}}) == [
        {"op": "add", "path": "/metadata/labels/vramguard.io~1gpu-pod", "value": "true"}]
    assert gpu_pod_label_ops({"metadata": {"labels": {GPU_POD_LABEL: "true"}}}) == []
