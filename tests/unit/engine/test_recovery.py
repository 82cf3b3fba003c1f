"""Recovery: hysteresis, CPU restore, pods leaving the selector, budgets deleted."""

from __future__ import annotations

from vramguard_operator.engine.types import (
    ANNOTATION_MESSAGE,
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_VIOLATIONS,
    Recover,
    Throttle,
)

from .builders import GI, apply, at, budget, pod, report, run, simulate, steps, vram


def test_recovery_needs_usage_below_the_margin():
    b = budget(per_pod={"vram": "40Gi"})
    timeline = [(0, {"w0": vram(41)}), (60, {"w0": vram(39.5)}), (120, {"w0": vram(39.1)})]
    events, budgets, _ = simulate([b], [pod("w0")], timeline)
    # 39.5Gi is above 98% of 40Gi (39.2Gi): still open; 39.1Gi closes it
    assert steps(events) == [(0, "Annotate", "w0"), (120, "Recover", "w0")]
    assert budgets[0].status.open_violations == 0


def test_recover_restores_cpu_and_removes_annotations():
    b = budget(
        per_pod={"vram": "40Gi"}, ladder=[{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "1m"}]
    )
    events, budgets, pods = simulate([b], [pod("w0", cpu="3")], [(0, {"w0": vram(41)}), (60, {"w0": vram(41)})])
    assert pods[0].containers[0].cpu_limit == "100m"
    assert set(pods[0].annotations) == {ANNOTATION_VIOLATIONS, ANNOTATION_MESSAGE, ANNOTATION_ORIGINAL_CPU}
    out = run(budgets, pods, [report("node-a", at(120), {"w0": vram(20)})], at(120))
    (rec,) = out.decisions
    assert isinstance(rec, Recover) and rec.cause == "UsageBelowLimit"
    assert [(c.name, c.limit, c.request) for c in rec.restore] == [("main", "3", "3")]
    (patch,) = out.pod_patches
    assert patch.annotations == {ANNOTATION_VIOLATIONS: None, ANNOTATION_MESSAGE: None, ANNOTATION_ORIGINAL_CPU: None}
    budgets, pods = apply(out, budgets, pods)
    assert pods[0].annotations == {} and pods[0].containers[0].cpu_limit == "3"


def test_pod_stays_throttled_while_another_violation_holds_it():
    b = budget(per_pod={"vram": "40Gi", "ram": "8Gi"}, ladder=[{"action": "Throttle", "after": "0s"}])
    both = {"w0": vram(41, ramWorkingSetBytes=9 * GI)}
    events, budgets, pods = simulate([b], [pod("w0")], [(0, both)])
    throttles = [d for _, d in events if isinstance(d, Throttle)]
    assert len(throttles) == 2 and throttles[0].resize and not throttles[1].resize  # second: already low
    out = run(budgets, pods, [report("node-a", at(60), {"w0": vram(20, ramWorkingSetBytes=9 * GI)})], at(60))
    (rec,) = out.decisions
    assert rec.violation.kind == "PodVRAM" and rec.restore == ()
    budgets, pods = apply(out, budgets, pods)
    out = run(budgets, pods, [report("node-a", at(120), {"w0": vram(20, ramWorkingSetBytes=1 * GI)})], at(120))
    (rec,) = out.decisions
    assert rec.violation.kind == "PodRAM" and [c.limit for c in rec.restore] == ["4"]


def test_pod_no_longer_selected_recovers():
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    relabelled = [p.__class__(**{**{s: getattr(p, s) for s in p.__slots__}, "labels": {"app": "other"}}) for p in pods]
    out = run(budgets, relabelled, [report("node-a", at(60), {"w0": vram(41)})], at(60))
    (rec,) = out.decisions
    assert isinstance(rec, Recover) and rec.cause == "NoLongerSelected"
    assert out.pod_patches[0].annotations[ANNOTATION_VIOLATIONS] is None


def test_budget_deleted_recovers_its_pods():
    b = budget(per_pod={"vram": "40Gi"}, ladder=[{"action": "Throttle", "after": "0s"}])
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    out = run([], pods, [report("node-a", at(60), {"w0": vram(41)})], at(60))
    (rec,) = out.decisions
    assert isinstance(rec, Recover) and rec.cause == "BudgetDeleted"
    assert [c.limit for c in rec.restore] == ["4"]
    # recreated under the same name (new uid): the old state is not inherited
    again = budget(per_pod={"vram": "40Gi"}, uid="uid-new", ladder=[{"action": "Throttle", "after": "0s"}])
    out = run([again], pods, [report("node-a", at(60), {"w0": vram(41)})], at(60))
    assert {type(d).__name__ for d in out.decisions} == {"Recover", "Throttle"}


def test_total_recovery_is_one_budget_level_decision():
    b = budget(total={"vram": "60Gi"})
    pods = [pod("w0"), pod("w1")]
    events, budgets, pods = simulate(
        [b], pods, [(0, {"w0": vram(31), "w1": vram(30)}), (60, {"w0": vram(20), "w1": vram(20)})]
    )
    assert steps(events) == [(0, "Annotate", "w0"), (0, "Annotate", "w1"), (60, "Recover", None)]
    assert all(not p.annotations for p in pods)
