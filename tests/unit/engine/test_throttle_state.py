"""Throttle state on pods: restores undo only vramguard's own throttling, and a
throttle that did not take (resize refused, operator restarted between the pod
patch and the resize) is re-applied while the violation holds it."""

from __future__ import annotations

from dataclasses import replace

from vramguard_operator.engine.types import (
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_VIOLATIONS,
    ContainerFacts,
    EngineOutput,
    PodFacts,
    Recover,
    Throttle,
)

from .builders import apply, at, budget, pod, report, run, simulate, steps, vram

THROTTLE_NOW = [{"action": "Throttle", "after": "0s"}, {"action": "Evict", "after": "10m"}]


def without_resizes(out: EngineOutput) -> EngineOutput:
    """The output as applied when every resize failed (patches and statuses written)."""
    return replace(out, decisions=tuple(d for d in out.decisions if not isinstance(d, Throttle)))


def two_containers(name: str = "w0") -> PodFacts:
    return replace(
        pod(name),
        containers=(
            ContainerFacts("main", cpu_limit="4", cpu_request="4"),
            ContainerFacts("side", cpu_limit="2", cpu_request="2"),
        ),
    )


# --- restores undo only what vramguard did -------------------------------------------


def test_hand_written_original_cpu_on_a_pod_without_budget_is_dropped_not_restored():
    forged = replace(
        pod("w0", labels={"app": "other"}, cpu="4"),
        annotations={ANNOTATION_ORIGINAL_CPU: '{"main":{"limit":"64","request":"64"}}'},
    )
    out = run([budget(per_pod={"vram": "40Gi"})], [forged], [report("node-a", at(0), {"w0": vram(1)})], at(0))
    assert not [d for d in out.decisions if isinstance(d, Recover) and d.restore]
    (patch,) = out.pod_patches
    assert patch.annotations == {ANNOTATION_ORIGINAL_CPU: None}
    assert any("original-cpu" in p and "ml/w0" in p for p in out.problems)


def test_hand_written_original_cpu_at_the_throttle_target_without_a_violation_is_not_restored():
    # the pod sits at the default throttle CPU, but no violation of any budget throttled it
    forged = replace(
        pod("w0", cpu="100m"),
        annotations={ANNOTATION_ORIGINAL_CPU: '{"main":{"limit":"64","request":"64"}}'},
    )
    out = run([budget(per_pod={"vram": "40Gi"})], [forged], [report("node-a", at(0), {"w0": vram(1)})], at(0))
    assert not [d for d in out.decisions if isinstance(d, Recover) and d.restore]
    assert [p.annotations for p in out.pod_patches] == [{ANNOTATION_ORIGINAL_CPU: None}]


def test_restore_skips_containers_no_longer_at_the_throttle_target():
    b = budget(per_pod={"vram": "40Gi"}, ladder=THROTTLE_NOW)
    _, budgets, pods = simulate([b], [two_containers()], [(0, {"w0": vram(41)})])
    assert [c.cpu_limit for c in pods[0].containers] == ["100m", "100m"]
    # someone changed "side" after the throttle (and forged its original): vramguard
    # must not resize a container it does not hold at its own target
    ann = {
        **pods[0].annotations,
        ANNOTATION_ORIGINAL_CPU: '{"main":{"limit":"4","request":"4"},"side":{"limit":"64","request":"64"}}',
    }
    side = ContainerFacts("side", cpu_limit="1", cpu_request="1")
    pods = [replace(pods[0], annotations=ann, containers=(pods[0].containers[0], side))]
    out = run(budgets, pods, [report("node-a", at(60), {"w0": vram(10)})], at(60))
    (rec,) = out.decisions
    assert isinstance(rec, Recover)
    assert [(c.name, c.limit, c.request) for c in rec.restore] == [("main", "4", "4")]
    assert out.pod_patches[0].annotations[ANNOTATION_ORIGINAL_CPU] is None


def test_restore_matches_the_step_cpu_limit_in_any_spelling():
    ladder = [{"action": "Throttle", "after": "0s", "cpuLimit": "0.5"}]
    b = budget(per_pod={"vram": "40Gi"}, ladder=ladder)
    _, budgets, pods = simulate([b], [pod("w0", cpu="3")], [(0, {"w0": vram(41)})])
    pods = [replace(pods[0], containers=(ContainerFacts("main", cpu_limit="500m", cpu_request="500m"),))]
    out = run(budgets, pods, [report("node-a", at(60), {"w0": vram(10)})], at(60))
    (rec,) = out.decisions
    assert [(c.limit, c.request) for c in rec.restore] == [("3", "3")]


# --- throttling is level-triggered ----------------------------------------------------


def test_throttle_is_reapplied_when_the_resize_did_not_take():
    b = budget(per_pod={"vram": "40Gi"}, ladder=THROTTLE_NOW)
    pods = [pod("w0")]
    out = run([b], pods, [report("node-a", at(0), {"w0": vram(41)})], at(0))
    (first,) = out.decisions
    assert isinstance(first, Throttle) and not first.reapply
    budgets, pods = apply(without_resizes(out), [b], pods)  # the resize failed (409, timeout, restart)
    assert pods[0].containers[0].cpu_limit == "4"
    assert pods[0].annotations[ANNOTATION_VIOLATIONS] and pods[0].annotations[ANNOTATION_ORIGINAL_CPU]
    out = run(budgets, pods, [report("node-a", at(60), {"w0": vram(41)})], at(60))
    (again,) = out.decisions
    assert isinstance(again, Throttle) and again.reapply
    assert [(c.name, c.limit, c.request) for c in again.resize] == [("main", "100m", "100m")]
    assert out.pod_patches == ()  # the originals are already recorded
    (v,) = out.statuses[0].status.violations
    assert v.step == "Throttle" and v.step_time == at(0)  # the step is not fired again
    budgets, pods = apply(out, budgets, pods)
    assert pods[0].containers[0].cpu_limit == "100m"
    out = run(budgets, pods, [report("node-a", at(120), {"w0": vram(41)})], at(120))
    assert out.decisions == ()  # at the target: nothing to re-apply


def test_throttle_reapply_records_originals_of_a_container_raised_since():
    b = budget(per_pod={"vram": "40Gi"}, ladder=THROTTLE_NOW)
    _, budgets, pods = simulate([b], [two_containers()], [(0, {"w0": vram(41)})])
    # a container was put back up behind vramguard's back: it is lowered again
    pods = [replace(pods[0], containers=(pods[0].containers[0], ContainerFacts("side", "3", "3")))]
    out = run(budgets, pods, [report("node-a", at(60), {"w0": vram(41)})], at(60))
    (again,) = out.decisions
    assert isinstance(again, Throttle) and again.reapply
    assert [c.name for c in again.resize] == ["side"]
    assert again.original["side"] == {"limit": "2", "request": "2"}  # the first originals are kept


def test_no_reapply_in_dry_run_or_on_stale_data():
    b = budget(per_pod={"vram": "40Gi"}, ladder=THROTTLE_NOW)
    out = run([b], [pod("w0")], [report("node-a", at(0), {"w0": vram(41)})], at(0))
    budgets, pods = apply(without_resizes(out), [b], [pod("w0")])
    stale = run(budgets, pods, [report("node-a", at(0), {"w0": vram(41)})], at(120))
    assert stale.decisions == ()
    dry = [budgets[0].model_copy(update={"spec": budget(per_pod={"vram": "40Gi"}, mode="DryRun").spec})]
    out = run(dry, pods, [report("node-a", at(60), {"w0": vram(41)})], at(60))
    assert not [d for d in out.decisions if isinstance(d, Throttle)]


def test_total_throttle_is_reapplied_on_the_pod_it_throttled():
    b = budget(total={"vram": "60Gi"}, ladder=THROTTLE_NOW)
    pods = [pod("w0"), pod("w1")]
    usage = {"w0": vram(30), "w1": vram(31)}
    out = run([b], pods, [report("node-a", at(0), usage)], at(0))
    assert steps([(0, d) for d in out.decisions]) == [(0, "Throttle", "w1")]
    budgets, pods = apply(without_resizes(out), [b], pods)
    # w0 is now the largest, but the throttle belongs to w1
    usage = {"w0": vram(32), "w1": vram(31)}
    out = run(budgets, pods, [report("node-a", at(60), usage)], at(60))
    (again,) = out.decisions
    assert isinstance(again, Throttle) and again.reapply and again.pod.name == "w1"
