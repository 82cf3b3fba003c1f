"""What incremental evaluation evaluates together with a marked pod when the
device-pressure rule may compare it with its neighbours (``closure``): every
pod of its node, across namespaces and budgets, and nothing more without a
rule; the decisions then equal a pass over everything's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from .test_incremental_equivalence import GI, NODES, PERIOD, T0, UUID, _copy, _world
from .world import World

NODE = NODES[0]


def _pod(name: str, ns: str, app: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": {"app": app}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "1"},
                                               "requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"}}


def _report(used: dict[str, int], other_gi: int) -> dict[str, Any]:
    pods = [{"uid": f"uid-{n}", "namespace": ns, "name": n, "attribution": "Measured", "vramBytes": gi * GI,
             "devices": [{"uuid": UUID[NODE], "usedBytes": gi * GI}]}
            for n, (ns, gi) in _where(used).items()]
    total = sum(gi for _, gi in _where(used).values()) + other_gi
    return {"metadata": {"name": NODE, "uid": f"r-{NODE}"}, "spec": {"nodeName": NODE}, "status": {
        "sampleTime": T0.isoformat(),
        "devices": [{"uuid": UUID[NODE], "index": 0, "memory": {
            "totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI, "usedBytes": total * GI}}],
        "pods": pods}}


def _where(used: dict[str, int]) -> dict[str, tuple[str, int]]:
    return {n: ("ml" if n.startswith("a") else "research", gi) for n, gi in used.items()}


def _setup(w: World, rule: bool) -> None:
    spec: dict[str, Any] = {"defaults": {"shareFromNode": True}}
    if rule:
        spec["devicePressure"] = {"minFree": "10%"}
    w.put("policies", "p", {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryPolicy",
                            "metadata": {"name": "p", "uid": "pol-p", "generation": 1}, "spec": spec})
    for name, ns, app in (("a1", "ml", "x"), ("a2", "ml", "y"), ("b1", "research", "z")):
        w.put("pods", f"uid-{name}", _pod(name, ns, app))
    w.put("reports", NODE, _report({"a1": 8, "a2": 5, "b1": 10}, 0))  # within shares, no pressure


@pytest.mark.parametrize("rule", [True, False], ids=["a device-pressure rule", "no rule"])
def test_a_pod_change_brings_its_node_only_under_a_rule(rule: bool) -> None:
    w = _world()
    _setup(w, rule)
    w.step_incremental(T0)
    body = _copy(w.get("pods", "uid-b1"))
    body["metadata"]["labels"] = {"app": "w"}  # one pod of another namespace changes, nothing else
    w.put("pods", "uid-b1", body)
    planned = {u for g in w.inc.plan(T0 + timedelta(seconds=1)).groups for u in g.pod_uids}
    if rule:
        assert planned == {"uid-a1", "uid-a2", "uid-b1"}
    else:
        assert planned == {"uid-b1"}


def test_pressure_decisions_after_a_pod_change_equal_a_full_pass() -> None:
    """A neighbour of the pod most above its share changes (a label): the rule
    must still see every pod of the device, in both namespaces."""
    inc, full = _world(), _world()
    for w in (inc, full):
        _setup(w, rule=True)
    now = T0
    assert sorted(map(repr, inc.step_incremental(now))) == sorted(map(repr, full.step_full(now)))
    for w in (inc, full):
        w.put("reports", NODE, _report({"a1": 30, "a2": 10, "b1": 35}, 3))  # 2 GiB free of 8 kept
    now += timedelta(seconds=PERIOD)
    got, want = inc.step_incremental(now), full.step_full(now)
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    for w in (inc, full):
        body = _copy(w.get("pods", "uid-a2"))
        body["metadata"]["labels"] = {"app": "w"}
        w.put("pods", "uid-a2", body)
    now += timedelta(seconds=PERIOD)
    got, want = inc.step_incremental(now), full.step_full(now)
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    assert any("DevicePressure" in repr(d) for d in want)
