"""Issue 32, item 1: a report that contradicts itself is never believed. From
a consistent report of two pods within their 10Gi budget (device pressure
armed on the node's devices), hypothesis breaks exactly one rule of
``engine/report_checks.RULES`` in a random way; the evaluation must then take
no action on the node's pods (budgets' or device pressure's), and give one
reason: DataStale=True ReportInvalid on the budget and one ObjectProblem on the
report, both naming the rule."""

from __future__ import annotations

from copy import deepcopy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.report_checks import RULES, report_problem
from vramguard_operator.engine.types import EngineInput, PressureRule

from .builders import GI, MI, at, budget, pod

RULE_NAMES = {r.name for r in RULES}
PRESSURE = PressureRule(min_free_fraction=0.05, source="policy/fleet", protect_shares=False)


def consistent(used: list[int], reserved: int) -> dict[str, Any]:
    """node-a: GPU-0 and GPU-1 (80 GiB, ``reserved`` bytes reserved), pod w<i>
    holding used[i] bytes on GPU-<i % 2>, usedBytes the pods' sum."""
    total = 80 * GI
    on = [sum(b for i, b in enumerate(used) if i % 2 == k) for k in (0, 1)]
    devices = [{"uuid": f"GPU-{k}", "index": k, "memory": {
        "totalBytes": total, "reservedBytes": reserved, "usableBytes": total - reserved, "usedBytes": on[k]}}
        for k in (0, 1)]
    pods = [{"uid": f"uid-w{i}", "namespace": "ml", "name": f"w{i}", "vramBytes": b,
             "devices": [{"uuid": f"GPU-{i % 2}", "usedBytes": b}]} for i, b in enumerate(used)]
    return {"metadata": {"name": "node-a", "uid": "uid-report-a"}, "spec": {"nodeName": "node-a"},
            "status": {"sampleTime": at(0).isoformat(), "devices": devices, "pods": pods}}


@st.composite
def contradiction(draw: Any) -> tuple[str, dict[str, Any]]:
    used = draw(st.lists(st.integers(1 * GI, 9 * GI), min_size=2, max_size=4))
    raw = consistent(used, draw(st.sampled_from([0, 570 * MI, 4 * GI])))
    s = raw["status"]
    dev = draw(st.integers(0, 1))
    mem = s["devices"][dev]["memory"]
    pods = s["pods"]
    victim = pods[draw(st.integers(0, len(pods) - 1))]
    kind = draw(st.sampled_from(["used", "no-memory", "crowded", "sum", "unlisted"]))
    if kind == "used":  # the device uses more than it has
        mem["usedBytes"] = mem["totalBytes"] + draw(st.integers(1, 1 << 40))
    elif kind == "no-memory":  # a pod's usage on a device without memory figures
        del s["devices"][int(victim["devices"][0]["uuid"][-1])]["memory"]
    elif kind == "crowded":  # pods on a device above its usable memory, usedBytes given or not
        big = draw(st.integers(mem["usableBytes"] // 2 + 3 * GI, mem["usableBytes"]))
        for p in pods[:2]:
            p["vramBytes"] = big
            p["devices"] = [{"uuid": f"GPU-{dev}", "usedBytes": big}]
        if draw(st.booleans()):
            del mem["usedBytes"]
        else:
            mem["usedBytes"] = mem["usableBytes"]
    elif kind == "sum":  # vramBytes not the sum of the pod's entries
        off = draw(st.integers(1, 70 * GI))
        victim["vramBytes"] = max(0, victim["vramBytes"] + draw(st.sampled_from([-1, 1])) * off) or victim["vramBytes"] + off
    else:  # usage on a device the report does not list
        victim["devices"] = [*victim["devices"], {"uuid": draw(st.sampled_from(["GPU-7", "MIG-x"])),
                                                  "usedBytes": draw(st.integers(0, 9 * GI))}]
        victim["vramBytes"] = sum(d["usedBytes"] for d in victim["devices"])
    return kind, raw


def evaluate_node(raw: dict[str, Any]) -> Any:
    rep = NodeGPUUsage.model_validate(raw)
    pods = tuple(pod(p["name"]) for p in raw["status"]["pods"])
    return evaluate(EngineInput(budgets=(budget(per_pod={"vram": "10Gi"}),), pods=pods, reports={"node-a": rep},
                                now=at(0), pressure_rules={"ml": PRESSURE}))


@given(st.lists(st.integers(1 * GI, 9 * GI), min_size=2, max_size=4), st.sampled_from([0, 570 * MI, 4 * GI]))
@settings(max_examples=60, deadline=None)
def test_the_consistent_report_is_believed(used: list[int], reserved: int) -> None:
    raw = consistent(used, reserved)
    assert report_problem(NodeGPUUsage.model_validate(raw).status) is None
    assert not evaluate_node(raw).object_problems


@given(contradiction())
@settings(max_examples=300, deadline=None)
def test_a_contradicting_report_leads_to_no_action_and_one_reason(case: tuple[str, dict[str, Any]]) -> None:
    kind, raw = case
    out = evaluate_node(deepcopy(raw))
    assert out.decisions == (), (kind, [(d.action, d.pod and d.pod.name) for d in out.decisions])
    (problem,) = out.object_problems
    assert (problem.kind, problem.name, problem.reason) == ("NodeGPUUsage", "node-a", "ReportInvalid")
    rules = [n for n in RULE_NAMES if f"(rule {n})" in problem.message]
    assert len(rules) == 1, problem.message
    stale = {c.type: c for c in out.statuses[0].status.conditions or ()}["DataStale"]
    assert (stale.status, stale.reason) == ("True", "ReportInvalid")
    assert f"(rule {rules[0]})" in stale.message
