"""Namespace shards on the local cluster (issue 18, item 5): two operators with
``--shards=2`` share the namespaces through two Leases; one is killed
(SIGKILL) between the Annotate and the Throttle step of every pod in its
namespaces; the other takes its Lease over once it lapses and fires those
Throttle steps, and every pod ends with one Annotate Event and one Throttled
Event: no step repeated, none lost. The operators run under a ServiceAccount
token, and the audit log shows that they use Leases exactly as the chart's
Role for shards grants (``operator.shards``)."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.e2e.chart_rbac import AuditLog, token_kubeconfig
from tests.e2e.conftest import cluster  # noqa: F401  (the session fixture)
from tests.e2e.operator_harness import (
    GI,
    GROUP,
    VERSION,
    OperatorProcess,
    Usage,
    budget_manifest,
    create_gpu_nodes,
    delete_nodes,
    events_about,
    pod_manifest,
    publish,
    run_pods,
    wait_for,
)
from tests.unit.chart.helm import render
from tests.unit.chart.rbac import read_events
from vramguard_operator.controller.shards import LEASE_PREFIX, shard_of

LEASE_S = 8  # with --request-timeout=3s: a holder stops at 4 s, a take-over after 8 s
THROTTLE_AFTER_S = 30
LADDER = [{"action": "Annotate", "after": "0s"},
          {"action": "Throttle", "after": f"{THROTTLE_AFTER_S}s", "cpuLimit": "500m"}]
ACCOUNT = "vg-shards-e2e"


class ShardOperator(OperatorProcess):
    def __init__(self, kubeconfig: str, pattern: str, identity: str, lease_ns: str) -> None:
        super().__init__(kubeconfig, [pattern], [
            "--shards=2", f"--shard-identity={identity}", f"--lease-namespace={lease_ns}",
            f"--lease-duration={LEASE_S}s", "--request-timeout=3s", "--evaluation-period=1s", "--debounce=10ms",
        ])
        self.identity = identity

    def shards(self) -> list[int]:
        h = self.health() or {}
        return list((h.get("evaluation") or {}).get("shards") or [])


@pytest.fixture(scope="module")
def world(cluster: Any) -> Iterator[dict[str, Any]]:  # noqa: F811
    api = cluster.api_client()
    core, custom, rbac = client.CoreV1Api(api), client.CustomObjectsApi(api), client.RbacAuthorizationV1Api(api)
    tag = uuid.uuid4().hex[:6]
    prefix = f"t-shards-{tag}"
    spaces: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while min(len(v) for v in spaces.values()) < 2:  # two namespaces in each shard
        ns = f"{prefix}-w{i}"
        if len(spaces[shard_of(ns, 2)]) < 2:
            spaces[shard_of(ns, 2)].append(ns)
        i += 1
    lease_ns, node = f"{prefix}-leases", f"vg-shards-{tag}"
    every = [ns for v in spaces.values() for ns in v]
    for ns in [lease_ns, *every]:
        core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(lease_ns, {"metadata": {"name": ACCOUNT}})
    rbac.create_cluster_role_binding({
        "metadata": {"name": f"{ACCOUNT}-{tag}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": lease_ns}]})
    create_gpu_nodes(core, [node])
    try:
        yield {"api": api, "core": core, "custom": custom, "spaces": spaces, "lease_ns": lease_ns,
               "node": node, "pattern": f"{prefix}-*", "tag": tag}
    finally:
        for ns in [lease_ns, *every]:
            core.delete_namespace(ns)
        rbac.delete_cluster_role_binding(f"{ACCOUNT}-{tag}")
        delete_nodes(core, custom, [node])


def test_a_killed_shard_is_taken_over_without_a_step_repeated_or_lost(cluster: Any, world: dict[str, Any],  # noqa: F811
                                                                        tmp_path: Any) -> None:
    core, custom, spaces, node = world["core"], world["custom"], world["spaces"], world["node"]
    token = core.create_namespaced_service_account_token(
        ACCOUNT, world["lease_ns"], {"spec": {"expirationSeconds": 3600}}).status.token
    kubeconfig = token_kubeconfig(cluster.kubeconfig, token, tmp_path / "sa.kubeconfig")
    pods: dict[str, client.V1Pod] = {}
    for ns in (n for v in spaces.values() for n in v):
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, "gpumemorybudgets",
                                               budget_manifest("train", {"perPod": {"vram": "10Gi"}}, LADDER))
        pods[ns] = run_pods(core, ns, [pod_manifest("w0", node, {"app": "train"})])["w0"]
    audit = AuditLog.of_local_cluster()
    offset = audit.offset()
    ops = [ShardOperator(kubeconfig, world["pattern"], name, world["lease_ns"]) for name in ("op-a", "op-b")]
    for op in ops:
        op.start(timeout=120)
    try:
        wait_for(lambda: sorted(s for op in ops for s in op.shards()) == [0, 1], 60, "one shard each")
        victim = next(op for op in ops if op.shards() == [0])
        heir = next(op for op in ops if op is not victim)

        def report() -> None:
            publish(custom, node, [Usage(p, 12 * GI, GI) for p in pods.values()])

        report()
        wait_for(lambda: all(_reasons(core, p).count("LimitExceeded") == 1 for p in pods.values()), 60,
                 "every pod annotated")
        annotated_at = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        victim.proc.wait(10)  # type: ignore[union-attr]

        def throttled() -> bool:
            report()  # the agent goes on reporting
            return all(_cpu(core, p) == "500m" for p in pods.values())

        wait_for(lambda: heir.shards() == [0, 1], LEASE_S * 4, "the shard taken over", interval=1)
        taken = time.monotonic() - annotated_at
        wait_for(throttled, THROTTLE_AFTER_S + 60, "every pod throttled", interval=2)
        for p in pods.values():
            why = _reasons(core, p)
            assert why.count("LimitExceeded") == 1 and why.count("Throttled") == 1, (p.metadata.namespace, why)
            steps = [r.get("step") for r in json.loads(_pod(core, p).metadata.annotations["vramguard.io/violations"])]
            assert steps == ["Throttle"], steps
        assert taken < THROTTLE_AFTER_S, "taken over only after the Throttle steps were due"
        print(f"shard 0 of {victim.identity} taken over by {heir.identity} {taken:.1f} s after the kill")
    finally:
        for op in ops:
            op.stop()
            print(f"--- {op.identity} ({op.log}) ---\n{op.tail(30)}")
    _leases_used_as_granted(audit, offset, world["lease_ns"])


def _leases_used_as_granted(audit: AuditLog, offset: int, lease_ns: str) -> None:
    """The Lease requests in the audit log are those the chart's Role for two
    shards grants: its verbs, on its Lease names (and nothing refused)."""
    user = f"system:serviceaccount:{lease_ns}:{ACCOUNT}"
    used: set[tuple[str, str | None]] = set()
    for ev in read_events(audit.path, offset):
        ref = ev.get("objectRef") or {}
        if (ev.get("user") or {}).get("username") == user and ref.get("resource") == "leases":
            assert ref.get("namespace") == lease_ns and (ev.get("responseStatus") or {}).get("code", 0) < 500
            used.add((ev["verb"], ref.get("name")))
    role = next(o for o in render({"operator.shards": 2}) if o["kind"] == "Role")
    granted = {(v, n) for r in role["rules"] for v in r["verbs"] for n in r.get("resourceNames", [None])}
    assert {v for v, _ in used} == {v for v, _ in granted}, used
    for verb, name in used:
        assert (verb, name) in granted or (verb, None) in granted, (verb, name)
        assert name is None or name.startswith(LEASE_PREFIX)


def _pod(core: client.CoreV1Api, p: client.V1Pod) -> client.V1Pod:
    return core.read_namespaced_pod(p.metadata.name, p.metadata.namespace)


def _cpu(core: client.CoreV1Api, p: client.V1Pod) -> str | None:
    try:
        return _pod(core, p).spec.containers[0].resources.limits.get("cpu")
    except ApiException:
        return None


def _reasons(core: client.CoreV1Api, p: client.V1Pod) -> list[str]:
    return [e.reason for e in events_about(core, p.metadata.namespace, p.metadata.uid) for _ in range(e.count or 1)]
