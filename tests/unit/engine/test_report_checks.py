"""A node report is checked before its numbers are believed (issue 17, item 5):
a report that contradicts itself marks its node's data unknown (no action on
its pods, DataStale=True with reason ReportInvalid naming the node and why, an
ObjectProblem on the report), never "last entry wins"; other nodes go on."""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import pytest

from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.report_checks import RULES, report_problem, unknown_pods
from vramguard_operator.engine.types import Annotate, EngineInput

from .builders import GI, MI, at, budget, pod, report, vram

GPU0 = {"uuid": "GPU-0", "index": 0, "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI}}
GPU1 = {"uuid": "GPU-1", "index": 1, "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI}}


def body(pods: list[dict[str, Any]], devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "node-a", "uid": "uid-report-a"},
        "spec": {"nodeName": "node-a"},
        "status": {"sampleTime": at(0).isoformat(), "devices": devices or [GPU0], "pods": pods},
    }


def w(name: str, gib: float, device: str = "GPU-0", **extra: Any) -> dict[str, Any]:
    return {"uid": f"uid-{name}", "namespace": "ml", "name": name, **vram(gib, device), **extra}


def with_used(device: dict[str, Any], used: int) -> dict[str, Any]:
    d = deepcopy(device)
    d["memory"]["usedBytes"] = used
    return d


CONTRADICTIONS = [
    ("pod above the node's devices", body([w("w0", 4)] + [{**w("w1", 4), "vramBytes": (1 << 53), "devices": []}]),
     "vramBytes 9007199254740992, above the 80Gi of the node's devices"),
    ("pod above its device", body([w("w0", 4), {**w("w1", 1), "devices": [{"uuid": "GPU-0", "usedBytes": 81 * GI}],
                                              "vramBytes": 81 * GI}], [GPU0, GPU1]),
     "on device GPU-0, above its 80Gi"),
    ("usable bytes 0", body([w("w0", 4)], [{**GPU0, "memory": {**GPU0["memory"], "usableBytes": 0}}]),
     "device GPU-0 has no usable memory"),
    ("usable above total", body([w("w0", 4)], [{**GPU0, "memory": {**GPU0["memory"], "usableBytes": 81 * GI}}]),
     "usableBytes 86973087744 is above its totalBytes"),
    ("duplicate pod uid", body([w("w0", 4), w("w0", 60)]), "pod uid uid-w0 is listed more than once"),
    ("duplicate device", body([w("w0", 4)], [GPU0, GPU0]), "device GPU-0 is listed more than once"),
    ("used below the pods", body([w("w0", 4), w("w1", 30)], [with_used(GPU0, 20 * GI)]),
     "device GPU-0 reports 20Gi used, below the 34Gi its pods use"),
    ("VRAM on no device", body([w("w0", 4)], []) | {"status": {**body([w("w0", 4)])["status"], "devices": []}},
     "reports 4Gi of VRAM on a node that lists no device"),
    # issue 32: each of these was believed, and pods at 4Gi under a 10Gi budget acted on
    ("device used above total", body([w("w0", 4)], [with_used(GPU0, 200 * GI)]),
     "device GPU-0 reports usedBytes 214748364800, above its totalBytes 85899345920"),
    ("usage on a device without memory figures", body([w("w0", 4)], [{"uuid": "GPU-0", "index": 0}]),
     "reports 4294967296 bytes on device GPU-0, which has no memory figures"),
    ("VRAM beside devices without memory figures",
     body([w("w0", 0), {**w("w1", 0), "vramBytes": 1000 * GI, "devices": []}],
          [{"uuid": f"GPU-{i}", "index": i} for i in range(8)]),
     "reports 1000Gi of VRAM on no device entry, beside a device with no memory figures"),
    ("pods above usable without usedBytes", body([w("w0", 70), w("w1", 70)]),
     "device GPU-0: its pods report 140Gi, above its 80Gi usable memory"),
    ("vramBytes not the sum of its devices", body([w("w0", 4), {**w("w1", 1), "vramBytes": 70 * GI}]),
     "reports vramBytes 75161927680, not the sum of its device entries (1073741824 over 1 devices)"),
    ("device the report does not list", body([w("w0", 4), w("w1", 4, "GPU-9")]),
     "reports usage on device GPU-9, which the report does not list"),
]
RULE_OF = {
    "pod above the node's devices": "PodAboveDevice", "pod above its device": "PodAboveDevice",
    "usable bytes 0": "DeviceMemory", "usable above total": "DeviceMemory", "duplicate pod uid": "DuplicatePod",
    "duplicate device": "DuplicateDevice", "used below the pods": "UsedBelowPods", "VRAM on no device": "PodOnNoDevice",
    "device used above total": "DeviceUsedAboveTotal", "usage on a device without memory figures": "UsageWithoutMemory",
    "VRAM beside devices without memory figures": "UsageWithoutMemory",
    "pods above usable without usedBytes": "PodsAboveUsable", "vramBytes not the sum of its devices": "PodSumMismatch",
    "device the report does not list": "UnlistedDevice",
}


def evaluate_at(rep: NodeGPUUsage, **kw: Any) -> Any:
    b = budget(per_pod={"vram": "10Gi"})
    other = report("node-b", at(0), {"b0": vram(12)})
    pods = (pod("w0"), pod("w1"), pod("b0", node="node-b"))
    return evaluate(EngineInput(
        budgets=(b,), pods=pods, reports={"node-a": rep, "node-b": other}, now=at(0), **kw))


@pytest.mark.parametrize(("case", "raw", "why"), CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_a_report_that_contradicts_itself_is_not_believed(case, raw, why):
    out = evaluate_at(NodeGPUUsage.model_validate(raw))
    # the pods on node-a are not acted on, whatever their numbers; node-b's pod is
    assert [(type(d).__name__, d.pod.name if d.pod else None) for d in out.decisions] == [("Annotate", "b0")]
    st = out.statuses[0].status
    stale = {c.type: c for c in st.conditions or ()}["DataStale"]
    assert (stale.status, stale.reason) == ("True", "ReportInvalid")
    assert "node-a: " in stale.message and why in stale.message, stale.message
    assert f"(rule {RULE_OF[case]})" in stale.message
    (problem,) = out.object_problems
    assert (problem.kind, problem.name, problem.uid, problem.reason) == (
        "NodeGPUUsage", "node-a", "uid-report-a", "ReportInvalid")
    assert why in problem.message


def test_a_device_used_within_the_slack_of_its_pods_is_believed():
    # the agent reads the device, then its processes: a pod may allocate in between
    raw = body([w("w0", 12), w("w1", 30)], [with_used(GPU0, 42 * GI - 4 * GI + 512 * MI)])
    out = evaluate_at(NodeGPUUsage.model_validate(raw))
    assert sorted(d.pod.name for d in out.decisions if isinstance(d, Annotate)) == ["b0", "w0", "w1"]
    assert not out.object_problems


def test_a_node_the_controller_cannot_believe_is_unknown_whatever_its_report_says():
    rep = report("node-a", at(0), {"w0": vram(12)})
    out = evaluate_at(rep, unknown_nodes={"node-a": "2 NodeGPUUsage objects report this node (a, b)"})
    assert [d.pod.name for d in out.decisions if d.pod] == ["b0"]
    stale = {c.type: c for c in out.statuses[0].status.conditions or ()}["DataStale"]
    assert stale.reason == "ReportInvalid" and "2 NodeGPUUsage objects report this node" in stale.message


def test_a_consistent_report_is_believed():
    out = evaluate_at(report("node-a", at(0), {"w0": vram(12), "w1": vram(3)}))
    assert sorted(d.pod.name for d in out.decisions if d.pod) == ["b0", "w0"]
    assert not out.object_problems


def test_every_rule_has_a_case():
    assert {r.name for r in RULES} == set(RULE_OF.values())


def test_a_truncated_report_may_name_a_device_it_cut():
    # the agent cuts its device list at its bounds; the pods keep their entries
    raw = body([w("w0", 12), w("w1", 3, "GPU-1")]) | {"status": {**body([])["status"], "truncated": True,
                                                               "pods": body([w("w0", 12), w("w1", 3, "GPU-1")])["status"]["pods"]}}
    out = evaluate_at(NodeGPUUsage.model_validate(raw))
    assert not out.object_problems
    assert sorted(d.pod.name for d in out.decisions if d.pod) == ["b0", "w0"]


def test_unknown_pod_uids_are_named_but_not_a_contradiction():
    st = NodeGPUUsage.model_validate(body([w(f"w{i}", 1) for i in range(5)])).status
    assert unknown_pods(st, {"uid-w0", "uid-w1", "uid-w2", "uid-w3", "uid-w4"}) is None
    assert unknown_pods(st, {"uid-w1"}) == "4 pod uids are not pods on this node: uid-w0, uid-w2, uid-w3 and 1 more"
    assert report_problem(st) is None
