"""The two cost reductions of incremental evaluation, each against a pass over
everything (docs/operator.md, "The reconcile loop"): a node far from its
devices' pressure thresholds is not pulled in with one of its pods, until
something its threshold is made of changes; and a pod whose soft limits stand
at its share stays quiet, until they or its share change."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from vramguard_api.memlimits import MEMORY_LIMITS_ANNOTATION, DeviceMemoryLimit, format_memory_limits
from vramguard_operator.engine.outputs import DevicePressureReport
from vramguard_operator.plan.coupling import clear_of, device_slacks, near_margin, slack_of

from .test_incremental_equivalence import GI, PERIOD, T0, UUID, _annotations, _copy, _statuses, _world
from .world import World

A, B = "gpu-h100-ts", "gpu-h100-b"
WHERE = {"a1": ("ml", "x", A), "n1": ("research", "z", A), "a2": ("ml", "x", B), "n2": ("research", "z", B)}


def _pod(name: str) -> dict[str, Any]:
    ns, app, node = WHERE[name]
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": {"app": app}},
            "spec": {"nodeName": node, "containers": [
                {"name": "main", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "1"},
                                               "requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"}}


def _report(node: str, used: dict[str, float], now: datetime) -> dict[str, Any]:
    pods = [{"uid": f"uid-{n}", "namespace": WHERE[n][0], "name": n, "attribution": "Measured",
             "vramBytes": int(gi * GI), "devices": [{"uuid": UUID[node], "usedBytes": int(gi * GI)}]}
            for n, gi in used.items()]
    return {"metadata": {"name": node, "uid": f"r-{node}"}, "spec": {"nodeName": node}, "status": {
        "sampleTime": now.isoformat(),
        "agent": {"version": "1", "backend": "sim", "sampleIntervalSeconds": 5, "enforceCaps": True},
        "devices": [{"uuid": UUID[node], "index": 0, "processesComplete": True, "memoryLimits": "Supported",
                     "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI,
                                "usedBytes": int(sum(used.values()) * GI)}}],
        "pods": pods}}


def _budget(min_free: str, gen: int) -> dict[str, Any]:
    return {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryBudget",
            "metadata": {"name": "b1", "namespace": "ml", "uid": "b-1", "generation": gen},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "limits": {"perPod": {"vram": "40Gi"}},
                     "devicePressure": {"minFree": min_free}}}


def _policy(soft: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"defaults": {"shareFromNode": True}, "devicePressure": {"minFree": "5%"}}
    if soft:
        spec["softLimits"] = "Share"
    return {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryPolicy",
            "metadata": {"name": "p", "uid": "pol-p", "generation": 1}, "spec": spec}


def _both(worlds: tuple[World, World], kind: str, key: Any, body: dict[str, Any] | None) -> None:
    for w in worlds:
        w.put(kind, key, _copy(body))


def _step(worlds: tuple[World, World], now: datetime) -> tuple[set[str], list[Any]]:
    """Evaluate both ways; the pods the incremental plan evaluated, and the decisions (equal)."""
    inc, full = worlds
    planned: set[str] = set()
    plan = inc.inc.plan
    inc.inc.plan = lambda t: (p := plan(t), planned.update(u for g in p.groups for u in g.pod_uids))[0]  # type: ignore[method-assign]
    got, want = inc.step_incremental(now), full.step_full(now)
    inc.inc.plan = plan  # type: ignore[method-assign]
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    assert _statuses(inc) == _statuses(full)
    assert _annotations(inc) == _annotations(full)
    return {u.removeprefix("uid-") for u in planned}, want


def _setup(soft: bool) -> tuple[tuple[World, World], datetime]:
    worlds = (_world(), _world())
    _both(worlds, "policies", "p", _policy(soft))
    for name in WHERE:
        _both(worlds, "pods", f"uid-{name}", _pod(name))
    _both(worlds, "budgets", ("ml", "b1"), _budget("5%", 1))
    now = T0
    _both(worlds, "reports", (A, A), _report(A, {"a1": 34, "n1": 36}, now))  # 10Gi free: clear of 5% by 6Gi
    _both(worlds, "reports", (B, B), _report(B, {"a2": 2, "n2": 3}, now))
    _step(worlds, now)
    now += timedelta(seconds=PERIOD)
    _step(worlds, now)  # what decided something is looked at again; node A is coupled there
    return worlds, now


def test_a_far_node_stays_out_until_its_threshold_moves() -> None:
    worlds, now = _setup(soft=False)
    now += timedelta(seconds=PERIOD)
    _both(worlds, "reports", (B, B), _report(B, {"a2": 2.5, "n2": 3}, now))
    planned, _ = _step(worlds, now)
    assert "a1" in planned and "n1" not in planned  # a1 (above its warning) comes with b1; node A is far
    now += timedelta(seconds=PERIOD)
    _both(worlds, "budgets", ("ml", "b1"), _budget("45%", 2))  # 36Gi to keep: node A is under it
    planned, decisions = _step(worlds, now)
    assert {"a1", "n1"} <= planned
    assert [d.pod.name for d in decisions if "DevicePressure" in repr(d)] == ["n1"]  # most above its share


def test_a_far_node_comes_back_with_a_changed_pod() -> None:
    worlds, now = _setup(soft=False)
    now += timedelta(seconds=PERIOD)
    body = _pod("n1")
    body["metadata"]["labels"] = {"app": "x"}  # b1 (and its rule) now selects it
    _both(worlds, "pods", "uid-n1", body)
    planned, _ = _step(worlds, now)
    assert {"a1", "n1"} <= planned


def test_soft_limits_at_the_share_keep_a_pod_quiet() -> None:
    worlds, now = _setup(soft=True)
    for _ in range(2):  # the limits written, then answered again on the next report
        now += timedelta(seconds=PERIOD)
        _both(worlds, "reports", (B, B), _report(B, {"a2": 2, "n2": 3}, now))
        _step(worlds, now)
    held = worlds[0].get("pods", "uid-a2")["metadata"]["annotations"][MEMORY_LIMITS_ANNOTATION]
    now += timedelta(seconds=PERIOD)
    _both(worlds, "reports", (A, A), _report(A, {"a1": 34.5, "n1": 36}, now))
    planned, _ = _step(worlds, now)
    assert "a1" in planned and "a2" not in planned  # b1 is evaluated without its settled pod
    now += timedelta(seconds=PERIOD)
    for w in worlds:  # someone moves the soft limit away from the share
        body = _copy(w.get("pods", "uid-a2"))
        body["metadata"]["annotations"][MEMORY_LIMITS_ANNOTATION] = format_memory_limits(
            {UUID[B]: DeviceMemoryLimit(1 * GI)})
        w.put("pods", "uid-a2", body)
    planned, _ = _step(worlds, now)
    assert "a2" in planned
    assert worlds[0].get("pods", "uid-a2")["metadata"]["annotations"][MEMORY_LIMITS_ANNOTATION] == held


def test_near_is_within_the_margin_above_the_threshold() -> None:
    def report(free: int, state: Any = "Clear") -> DevicePressureReport:
        return DevicePressureReport(node=A, device=UUID[A], state=state, free_bytes=free, usable_bytes=80 * GI,
                                    min_free_bytes=4 * GI, chosen=None, protected=0, reason="")

    assert near_margin(80 * GI) == 4 * GI and near_margin(8 * GI) == GI
    assert clear_of(report(8 * GI)) and not clear_of(report(8 * GI - 1))
    assert not clear_of(report(40 * GI, "Unknown")) and not clear_of(report(40 * GI, "NoCandidate"))


def test_a_devices_slack_is_the_smallest_over_the_groups_that_judged_it() -> None:
    """The one measure both planners keep a device by (the operator's margin,
    the simulation's clear devices): free memory above the threshold, the
    smallest over the groups, none when a verdict is not Clear."""
    def report(device: str, free: int, minimum: int, state: Any = "Clear") -> DevicePressureReport:
        return DevicePressureReport(node=A, device=device, state=state, free_bytes=free, usable_bytes=80 * GI,
                                    min_free_bytes=minimum, chosen=None, protected=0, reason="")

    found = device_slacks([report("d1", 20 * GI, 4 * GI), report("d1", 20 * GI, 6 * GI),
                           report("d2", 20 * GI, 4 * GI), report("d2", 1 * GI, 4 * GI, "Act"),
                           report("d3", 30 * GI, 30 * GI)])
    assert found == {"d1": 14 * GI, "d2": -math.inf, "d3": 0}
    assert slack_of(report("d1", 20 * GI, 4 * GI)) == 16 * GI
