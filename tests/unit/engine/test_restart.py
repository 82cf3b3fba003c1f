"""Restart safety: state read back from the objects gives the same decisions as
an uninterrupted run, and no step fires twice."""

from __future__ import annotations

import json
from dataclasses import replace

from vramguard_api.budget import GPUMemoryBudget
from vramguard_operator.engine.types import ANNOTATION_VIOLATIONS

from .builders import TWO_GPUS, at, budget, pod, report, run, simulate, steps, vram

TIMELINE = [(t, {"w0": vram(41), "w1": vram(30, "GPU-1"), "w2": vram(30, "GPU-1")}) for t in range(0, 901, 60)]


def through_api(budgets, pods):
    """What a restarted operator reads: budgets from their JSON, pods with their annotations."""
    return [GPUMemoryBudget.model_validate(b.to_api()) for b in budgets], list(pods)


def test_restart_at_every_point_gives_the_same_decisions():
    b = budget(per_pod={"vram": "40Gi"}, total={"vram": "90Gi"})
    pods = [pod("w0"), pod("w1"), pod("w2")]
    reference, _, _ = simulate([b], pods, TIMELINE, TWO_GPUS)
    assert [a for _, a, _ in steps(reference)].count("Evict") == 1
    for cut in range(1, len(TIMELINE)):
        first, budgets, ps = simulate([b], pods, TIMELINE[:cut], TWO_GPUS)
        budgets, ps = through_api(budgets, ps)
        rest, _, _ = simulate(budgets, ps, TIMELINE[cut:], TWO_GPUS)
        assert steps(first + rest) == steps(reference), f"restart before t={TIMELINE[cut][0]}"


def test_status_lost_pod_annotations_keep_the_ladder():
    # crash after the Throttle (pod annotation written) but before the status write
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)}), (300, {"w0": vram(41)})])
    assert steps(events)[-1] == (300, "Throttle", "w0")
    blank = [budgets[0].model_copy(update={"status": None})]
    out = run(blank, pods, [report("node-a", at(360), {"w0": vram(41)})], at(360))
    assert out.decisions == ()  # neither Annotate nor Throttle again
    (v,) = out.statuses[0].status.violations
    assert (v.opened_at, v.step, v.step_time, v.next_step, v.next_step_time) == (
        at(0),
        "Throttle",
        at(300),
        "Evict",
        at(600),
    )
    out = run(blank, pods, [report("node-a", at(600), {"w0": vram(41)})], at(600))
    assert [d.action for d in out.decisions] == ["Evict"]


def test_pod_annotations_lost_status_keeps_the_ladder():
    # issue 17 (item 3): the step the budget's record holds is written back on the
    # pod (it used to be left off, and a pod held at Throttle without its record
    # was restored and throttled again, over and over); no step fires again
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    bare = [replace(p, annotations={}) for p in pods]
    out = run(budgets, bare, [report("node-a", at(60), {"w0": vram(41)})], at(60))
    assert out.decisions == ()
    (patch,) = out.pod_patches
    (rec,) = json.loads(patch.annotations[ANNOTATION_VIOLATIONS])
    assert (rec["kind"], rec["step"], rec["stepTime"]) == ("PodVRAM", "Annotate", "2024-05-01T10:00:00Z")


def test_annotation_and_status_merge_to_the_furthest_step():
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    old_status = budgets[0].status
    events, budgets, pods = simulate(budgets, pods, [(300, {"w0": vram(41)})])
    stale = [budgets[0].model_copy(update={"status": old_status})]  # status one step behind
    out = run(stale, pods, [report("node-a", at(360), {"w0": vram(41)})], at(360))
    assert out.decisions == ()
    assert out.statuses[0].status.violations[0].step == "Throttle"


def test_malformed_annotation_entry_is_reported_and_the_rest_kept():
    b = budget(per_pod={"vram": "40Gi", "ram": "8Gi"})
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41, ramWorkingSetBytes=9 << 30)})])
    text = pods[0].annotations[ANNOTATION_VIOLATIONS]
    broken = text[:-1] + ',{"budget":"train","kind":"Bogus","since":"x"}]'
    pods = [replace(pods[0], annotations={**pods[0].annotations, ANNOTATION_VIOLATIONS: broken})]
    out = run(
        [budgets[0].model_copy(update={"status": None})],
        pods,
        [report("node-a", at(60), {"w0": vram(41, ramWorkingSetBytes=9 << 30)})],
        at(60),
    )
    assert out.decisions == ()  # both real records survived: nothing re-fires
    assert len(out.problems) == 1 and "Bogus" in out.problems[0] and "ml/w0" in out.problems[0]
    (patch,) = out.pod_patches  # the broken entry is dropped from the annotation
    assert "Bogus" not in patch.annotations[ANNOTATION_VIOLATIONS]


def test_unparsable_annotation_is_reported():
    b = budget(per_pod={"vram": "40Gi"})
    p = replace(pod("w0"), annotations={ANNOTATION_VIOLATIONS: "{not json"})
    out = run([b], [p], [report("node-a", at(0), {"w0": vram(1)})], at(0))
    assert out.problems and "invalid JSON" in out.problems[0]
