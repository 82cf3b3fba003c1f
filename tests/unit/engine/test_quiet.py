"""Running totals: pods a budget may leave out of an evaluation
(``quiet_pod``), and the status the engine builds from their sum
(``EngineInput.quiet``) being the one it builds from the pods themselves."""

from __future__ import annotations

from dataclasses import replace

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.memlimits import MEMORY_LIMITS_ANNOTATION, DeviceMemoryLimit, format_memory_limits
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.quiet import limits_settled, quiet_pod
from vramguard_operator.engine.types import EngineConfig, EngineInput, QuietPods
from vramguard_operator.plan.quiet import QuietTotals

from .builders import GI, T0, at, budget, pod, report, vram

CFG = EngineConfig()


def test_quiet_pods_add_what_the_pods_themselves_would() -> None:
    b = budget(per_pod={"vram": "10Gi", "ram": "8Gi"})
    pods = [pod(f"w{i}") for i in range(6)]
    usage = {f"w{i}": vram(1 + i % 3, ramWorkingSetBytes=(1 << 30)) for i in range(5)}  # w5 unreported
    rep = report("node-a", T0, usage)
    full = evaluate(EngineInput((b,), tuple(pods), {"node-a": rep}, at(1)))
    answers = [quiet_pod(b, p, rep, at(1), CFG) for p in pods]
    assert all(a is not None for a in answers)
    total = QuietTotals()
    for p, a in zip(pods, answers, strict=True):
        total.set(("ml", "train"), p.uid, a)
    given = pods[:2]  # given pods are left out of the sum
    quiet = {b.metadata.uid or "": total.summary(("ml", "train"), [p.uid for p in given])}
    part = evaluate(EngineInput((b,), tuple(given), {"node-a": rep}, at(1), quiet=quiet))
    assert part.statuses[0].status == full.statuses[0].status
    assert full.statuses[0].status.matched_pods == 6 and part.evaluated_pairs == full.evaluated_pairs


def test_a_pod_that_may_change_a_decision_must_be_given() -> None:
    b = budget(per_pod={"vram": "10Gi"})
    rep = report("node-a", T0, {"w0": vram(9)})  # 90%: above the 85% warning threshold
    assert quiet_pod(b, pod("w0"), rep, at(1), CFG) is None
    calm = report("node-a", T0, {"w0": vram(2)})
    assert quiet_pod(b, pod("w0"), calm, at(1), CFG) is not None
    annotated = replace(pod("w0"), annotations={"vramguard.io/violations": "[]"})
    assert quiet_pod(b, annotated, calm, at(1), CFG) is None
    named = b.model_copy(update={"status": GPUMemoryBudgetStatus.model_validate({"warnings": [
        {"kind": "PodVRAM", "pod": "w0", "observedBytes": 1, "limitBytes": 2, "since": T0.isoformat()}]})})
    assert quiet_pod(named, pod("w0"), calm, at(1), CFG) is None
    assert quiet_pod(budget(total={"vram": "100Gi"}), pod("w0"), calm, at(1), CFG) is None  # a total needs all
    leak = budget(per_pod={"vram": "10Gi"}, leak={"enabled": True})
    trending = report("node-a", T0, {"w0": vram(2, trend={"windowSeconds": 600, "samples": 20})})
    assert quiet_pod(leak, pod("w0"), trending, at(1), CFG) is None


def test_stale_missing_and_finished_pods_add_what_the_status_counts() -> None:
    b = budget(per_pod={"vram": "10Gi"})
    stale = quiet_pod(b, pod("w0"), report("node-a", T0, {"w0": vram(2)}), at(600), CFG)
    assert stale == QuietPods(matched=1, stale_nodes=frozenset({"node-a"}))
    assert quiet_pod(b, pod("w0"), None, at(1), CFG) == QuietPods(matched=1, missing_nodes=frozenset({"node-a"}))
    assert quiet_pod(b, pod("w0", phase="Succeeded"), None, at(1), CFG) == QuietPods()
    assert quiet_pod(b, pod("w0", phase="Pending"), None, at(1), CFG) == QuietPods(matched=1)


def test_totals_follow_each_answer() -> None:
    t, key = QuietTotals(), ("ml", "b")
    t.set(key, "a", QuietPods(matched=1, vram_bytes=5, vram_known=1, stale_nodes=frozenset({"n1"})))
    t.set(key, "b", QuietPods(matched=1, vram_bytes=7, vram_known=1, stale_nodes=frozenset({"n1"})))
    t.set(key, "c", None)  # active
    assert t.summary(key, []) == QuietPods(2, 12, 2, 0, 0, frozenset({"n1"}))
    assert t.summary(key, ["a"]) == QuietPods(1, 7, 1, 0, 0, frozenset({"n1"}))
    t.set(key, "a", QuietPods(matched=1, vram_bytes=1, vram_known=1))
    assert t.summary(key, []) == QuietPods(2, 8, 2, 0, 0, frozenset({"n1"}))
    t.drop_pod("b")
    assert t.summary(key, []) == QuietPods(1, 1, 1) and t.quiet(key, "a") and not t.quiet(key, "c")
    t.drop_budget(key)
    assert t.summary(key, []) == QuietPods() and t.known(key) == 0


def test_pods_whose_memory_limits_are_settled_or_whose_node_is_not_believed_are_given() -> None:
    """A quiet pod is never evaluated, so nothing may be settled for it: soft
    limits at its share (the budget's softLimits: Share, or the policy's for a
    budget that leaves it unset), held limits it carries, and the DataStale
    reason of a report not believed."""
    calm = report("node-a", T0, {"w0": vram(2)})
    b = budget(per_pod={"vram": "10Gi"})
    assert quiet_pod(b, pod("w0"), calm, at(1), CFG) is not None
    soft = b.model_copy(deep=True)
    soft.spec.enforcement.soft_limits = "Share"
    assert quiet_pod(soft, pod("w0"), calm, at(1), CFG) is None
    assert quiet_pod(b, pod("w0"), calm, at(1), CFG, soft_limits=True) is None  # the policy's
    off = b.model_copy(deep=True)
    off.spec.enforcement.soft_limits = "Off"
    assert quiet_pod(off, pod("w0"), calm, at(1), CFG, soft_limits=True) is not None  # the budget's own wins
    capped = replace(pod("w0"), annotations={"vramguard.io/memory-limits": '{"GPU-0":{"hardLimit":1}}'})
    assert quiet_pod(b, capped, calm, at(1), CFG) is None
    assert quiet_pod(b, pod("w0"), calm, at(1), CFG, unknown_nodes={"node-a": "two reports"}) is None
    twice = report("node-a", T0, {"w0": vram(2)})
    dup = twice.model_copy(update={"status": twice.status.model_copy(  # type: ignore[union-attr]
        update={"pods": [*twice.status.pods, *twice.status.pods]})})  # type: ignore[union-attr]
    assert quiet_pod(b, pod("w0"), dup, at(1), CFG) is None  # the report's own checks: a pod listed twice


def test_soft_limits_are_settled_only_where_an_evaluation_would_leave_them() -> None:
    """``limits_settled``: the annotation equals the lowest share of the budgets
    that want soft limits, as the engine writes it; none where none can be written."""
    nvml = "GPU-00000001-0000-4000-8000-000000000000"
    dev = [{"uuid": nvml, "index": 0, "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI}}]
    rep = report("node-a", T0, {"w0": vram(2, device=nvml)}, devices=dev)
    wide, narrow = budget(per_pod={"vram": "20Gi"}), budget(name="n", uid="uid-n", per_pod={"vram": "10Gi"})
    both = [(wide, True), (narrow, True)]
    assert not limits_settled(pod("w0"), both, rep, at(1), CFG)  # not written yet
    at_share = {nvml: DeviceMemoryLimit(10 * GI)}
    written = replace(pod("w0"), annotations={MEMORY_LIMITS_ANNOTATION: format_memory_limits(at_share)})
    assert limits_settled(written, both, rep, at(1), CFG)
    assert not limits_settled(written, [(wide, True)], rep, at(1), CFG)  # 20Gi wanted: rewritten
    assert not limits_settled(written, [(wide, False), (narrow, False)], rep, at(1), CFG)  # removed
    assert not limits_settled(written, both, rep, at(600), CFG)  # a stale report: held, not settled
    hard = replace(pod("w0"), annotations={MEMORY_LIMITS_ANNOTATION: format_memory_limits(
        {nvml: DeviceMemoryLimit(10 * GI, 12 * GI)})})
    assert not limits_settled(hard, both, rep, at(1), CFG)  # a Cap's hard limit: its violation decides
    mig_dev = [{**dev[0], "uuid": "MIG-00000001-0000-4000-8000-000000000000"}]
    mig = report("node-a", T0, {"w0": vram(2, device=mig_dev[0]["uuid"])}, devices=mig_dev)  # holds no limits
    assert limits_settled(pod("w0"), both, mig, at(1), CFG)
    assert quiet_pod(narrow, pod("w0"), mig, at(1), CFG, soft_limits=True) is None
    assert quiet_pod(narrow, pod("w0"), mig, at(1), CFG, soft_limits=True, settled=True) is not None
