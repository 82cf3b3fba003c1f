"""The RBAC proof's pieces (``tests/unit/chart/rbac.py``): what rendered
objects grant a ServiceAccount, what an audit log says it used, and the
comparison. The proof itself runs in tests/e2e/test_chart_e2e.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.chart.helm import CHART, NAMESPACE, find_helm, render
from tests.unit.chart.rbac import (
    CREDENTIAL_ID,
    Call,
    Usage,
    compare,
    credential_id,
    grants,
    read_events,
    rules_of,
    service_account,
    usage,
)

SA = service_account("ns", "app")


def role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"kind": kind, "metadata": meta, "rules": rules}


def binding(kind: str, role_kind: str, role_name: str, sa: str, sa_ns: str = "ns",
            namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": f"{role_name}-{sa}", **({"namespace": namespace} if namespace else {})}
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": role_kind, "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]}


def event(verb: str, resource: str | None, code: int = 200, *, sub: str = "", group: str = "",
          user: str = SA, jti: str = "a", uri: str = "/api") -> dict[str, Any]:
    """An audit.k8s.io/v1 Event as the log backend writes it (fields this proof reads)."""
    ev: dict[str, Any] = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
                          "stage": "ResponseComplete", "requestURI": uri, "verb": verb,
                          "user": {"username": user, "extra": {CREDENTIAL_ID: [f"JTI={jti}"]}},
                          "responseStatus": {"metadata": {}, "code": code}}
    if resource:
        ref = {"resource": resource, "apiVersion": "v1"}
        if group:
            ref["apiGroup"] = group
        if sub:
            ref["subresource"] = sub
        ev["objectRef"] = ref
    return ev


# --- grants ---------------------------------------------------------------------------------


def test_grants_follow_bindings_to_the_account_only():
    objs = [
        role("ClusterRole", "a", [{"apiGroups": [""], "resources": ["pods", "pods/eviction"],
                                   "verbs": ["list", "create"]}]),
        role("ClusterRole", "other", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
        role("Role", "r", [{"apiGroups": ["x.io"], "resources": ["things"], "verbs": ["patch"]}], "ns"),
        binding("ClusterRoleBinding", "ClusterRole", "a", "app"),
        binding("ClusterRoleBinding", "ClusterRole", "other", "someone-else"),
        binding("ClusterRoleBinding", "ClusterRole", "other", "app", sa_ns="elsewhere"),
        binding("RoleBinding", "Role", "r", "app", namespace="ns"),
    ]
    assert grants(objs, "ns", "app") == {
        Call("", "pods", "list"), Call("", "pods", "create"),
        Call("", "pods/eviction", "list"), Call("", "pods/eviction", "create"),
        Call("x.io", "things", "patch"),
    }
    assert grants(objs, "ns", "nobody") == set()


def test_a_binding_to_a_role_from_elsewhere_cannot_be_proven():
    objs = [binding("ClusterRoleBinding", "ClusterRole", "cluster-admin", "app")]
    with pytest.raises(ValueError, match="binds ClusterRole cluster-admin, which the chart does not hold"):
        grants(objs, "ns", "app")


@pytest.mark.parametrize(("rule", "says"), [
    ({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}, "uses '\\*'"),
    ({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}, "uses '\\*'"),
    ({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"], "verbs": ["get"]}, "names resources"),
    ({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}, "names resources or URLs"),
])
def test_rules_this_proof_cannot_compare_are_refused(rule, says):
    with pytest.raises(ValueError, match=f"ClusterRole x: .*{says}"):
        rules_of(role("ClusterRole", "x", [rule]))


@pytest.mark.skipif(find_helm() is None, reason="helm binary not found")
def test_the_rendered_chart_grants_each_renamed_account_its_own_role():
    """Renamed ServiceAccounts keep their grants (the bindings follow), and
    neither account gets the other's."""
    objs = render(values_files=[CHART / "ci" / "nondefault-values.yaml"])
    operator = grants(objs, NAMESPACE, "gpu-guard-controller")
    agent = grants(objs, NAMESPACE, "gpu-guard-node-agent")
    assert Call("", "pods/eviction", "create") in operator and Call("", "pods/eviction", "create") not in agent
    assert Call("vramguard.io", "nodegpuusages", "create") in agent
    assert Call("vramguard.io", "nodegpuusages", "create") not in operator
    assert grants(objs, NAMESPACE, "vramguard-operator") == set()


# --- usage ----------------------------------------------------------------------------------


def test_usage_keeps_one_accounts_requests_made_with_the_given_credentials():
    events = [
        event("list", "pods"), event("watch", "pods"),
        event("create", "pods", 201, sub="eviction"), event("create", "pods", 429, sub="eviction"),
        event("patch", "gpumemorybudgets", 403, sub="status", group="vramguard.io"),
        event("get", None, uri="/apis/vramguard.io/v1alpha1?timeout=32s"),
        event("delete", "pods", user=service_account("ns", "other")),
        event("delete", "secrets", jti="another-token"),
    ]
    used = usage(events, SA, ["JTI=a"])
    assert used.calls == {
        Call("", "pods", "list"): {200}, Call("", "pods", "watch"): {200},
        Call("", "pods/eviction", "create"): {201, 429},
        Call("vramguard.io", "gpumemorybudgets/status", "patch"): {403},
    }
    assert used.non_resource == {"/apis/vramguard.io/v1alpha1"}
    assert used.denied() == {Call("vramguard.io", "gpumemorybudgets/status", "patch"): {403}}
    assert Call("", "secrets", "delete") in usage(events, SA).calls  # no credential filter


def test_read_events_starts_at_an_offset_and_leaves_a_partial_line_out(tmp_path: Path):
    log = tmp_path / "audit.log"
    first, second = json.dumps(event("list", "pods")), json.dumps(event("watch", "pods"))
    log.write_text(first + "\n" + second + "\n" + '{"kind": "Ev')
    assert [e["verb"] for e in read_events(log)] == ["list", "watch"]
    assert [e["verb"] for e in read_events(log, len(first) + 1)] == ["watch"]


def test_credential_id_is_the_tokens_jti():
    claims = base64.urlsafe_b64encode(json.dumps({"jti": "0f-1"}).encode()).decode().rstrip("=")
    assert credential_id(f"e30.{claims}.sig") == "JTI=0f-1"
    with pytest.raises(ValueError, match="jti"):
        credential_id("not-a-jwt")


# --- compare --------------------------------------------------------------------------------

PODS_LIST, PODS_WATCH, EVICT = Call("", "pods", "list"), Call("", "pods", "watch"), Call("", "pods/eviction", "create")


def test_exact_grants_pass():
    assert compare({PODS_LIST, EVICT}, Usage({PODS_LIST: {200}, EVICT: {201, 429}}), {}) == []


def test_an_over_grant_fails_unless_it_is_a_listed_exception():
    used = Usage({PODS_LIST: {200}})
    assert compare({PODS_LIST, PODS_WATCH}, used, {}) == ["granted but never used: watch pods"]
    assert compare({PODS_LIST, PODS_WATCH}, used, {PODS_WATCH: "a short run may not watch"}) == []


def test_a_missing_grant_and_its_refusal_fail():
    used = Usage({PODS_LIST: {200}, EVICT: {403}})
    assert compare({PODS_LIST}, used, {}) == [
        "used but not granted: create pods/eviction (HTTP [403])",
        "refused (403): create pods/eviction",
    ]


def test_a_refusal_by_admission_fails_although_granted():
    assert compare({EVICT}, Usage({EVICT: {201, 403}}), {}) == ["refused (403): create pods/eviction"]


def test_an_exception_for_a_grant_that_is_gone_fails():
    assert compare({PODS_LIST}, Usage({PODS_LIST: {200}}), {PODS_WATCH: "why"}) == [
        "exception for watch pods (why) but the chart does not grant it"]
