"""Grouping a real engine output into per-pod work in the documented apply order."""

from __future__ import annotations

from vramguard_operator.controller.applier import plan_pod_work
from vramguard_operator.controller.resize import merged_resize
from vramguard_operator.engine.types import (
    ANNOTATION_ORIGINAL_CPU,
    ContainerCPU,
    PodRef,
    Recover,
    Throttle,
    Warn,
)

from ..engine.builders import apply, at, budget, pod, report, run, vram

LADDER = [
    {"action": "Annotate", "after": "0s"},
    {"action": "Throttle", "after": "60s"},
    {"action": "Evict", "after": "120s"},
]


def test_each_step_of_the_ladder_becomes_pod_work_with_its_patch():
    budgets = [budget(per_pod={"vram": "10Gi"}, ladder=LADDER, total={"vram": "100Gi"})]
    pods = [pod("w0"), pod("w1")]
    seen = []
    for t, gib in ((0, 12), (60, 12), (120, 12)):
        out = run(budgets, pods, [report("node-a", at(t), {"w0": vram(gib), "w1": vram(1)})], at(t))
        work, budget_only = plan_pod_work(out)
        assert budget_only == []
        assert [w.pod.name for w in work] == ["w0"]  # w1 is within its limit: nothing to do
        w = work[0]
        seen.append((t, [type(d).__name__ for d in (*w.restores, *w.throttles, *w.evicts, *w.others)]))
        if t == 60:
            assert w.patch is not None and ANNOTATION_ORIGINAL_CPU in w.patch  # written before the resize
            assert merged_resize(w.throttles) == (ContainerCPU("main", "100m", "100m"),)
        budgets, pods = apply(out, budgets, pods)
    assert seen == [(0, ["Annotate"]), (60, ["Throttle"]), (120, ["Evict"])]


def test_recovery_of_a_throttled_pod_is_a_restore_before_its_patch():
    budgets = [budget(per_pod={"vram": "10Gi"}, ladder=LADDER[:2])]
    pods = [pod("w0")]
    for t in (0, 60):
        out = run(budgets, pods, [report("node-a", at(t), {"w0": vram(12)})], at(t))
        budgets, pods = apply(out, budgets, pods)
    out = run(budgets, pods, [report("node-a", at(90), {"w0": vram(2)})], at(90))
    work, _ = plan_pod_work(out)
    (w,) = work
    assert [type(d) for d in w.restores] == [Recover]
    assert merged_resize(w.restores) == (ContainerCPU("main", "4", "4"),)
    assert w.patch is not None and w.patch[ANNOTATION_ORIGINAL_CPU] is None


def test_budget_level_warnings_have_no_pod_work():
    budgets = [budget(total={"vram": "10Gi"}, ladder=LADDER)]
    pods = [pod("w0"), pod("w1")]
    out = run(budgets, pods, [report("node-a", at(0), {"w0": vram(4.5), "w1": vram(4.5)})], at(0))
    work, budget_only = plan_pod_work(out)
    assert work == []
    assert [type(d) for d in budget_only] == [Warn]


def test_merged_resize_keeps_one_entry_per_container():
    ref = PodRef("ml", "w0", "u")
    common = dict(budget=None, violation=None, pod=ref, time=at(0), observed_bytes=1, limit_bytes=1,
                  event=None)
    a = Throttle(resize=(ContainerCPU("b", "1"), ContainerCPU("a", "1")), original={}, **common)
    b = Throttle(resize=(ContainerCPU("a", "2"),), original={}, **common)
    assert merged_resize([a, b]) == (ContainerCPU("a", "2"), ContainerCPU("b", "1"))
