"""Tolerance and the escalation ladder, table-driven over timelines."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from vramguard_operator.engine.types import ANNOTATION_VIOLATIONS, DryRunStep, Evict, Throttle

from .builders import GI, TWO_GPUS, apply, at, budget, pod, report, run, simulate, steps, vram


def flat(value_gib: float, minutes: int, every: int = 60) -> list[tuple[float, dict]]:
    return [(t, {"w0": vram(value_gib)}) for t in range(0, minutes * 60 + 1, every)]


TOLERANCE = [
    # id, tolerance, usage GiB (limit 40Gi), first Annotate at (s) or None
    ("no-tolerance", None, 40.5, 0),
    ("within-overshoot-waits-duration", {"overshootPercent": 10, "duration": "2m"}, 43, 120),
    ("above-overshoot-opens-at-once", {"overshootPercent": 10, "duration": "2m"}, 44.5, 0),
    ("overshoot-without-duration", {"overshootPercent": 10, "duration": "0s"}, 41, 0),
    ("duration-only", {"duration": "3m"}, 40.5, 0),  # overshoot 0%: anything above is hard
    ("not-above-limit", {"overshootPercent": 10, "duration": "2m"}, 40, None),
]


@pytest.mark.parametrize(("tolerance", "gib", "first"), [c[1:] for c in TOLERANCE], ids=[c[0] for c in TOLERANCE])
def test_tolerance(tolerance, gib, first):
    b = budget(per_pod={"vram": "40Gi"}, tolerance=tolerance, ladder=[{"action": "Annotate", "after": "0s"}])
    events, budgets, _ = simulate([b], [pod("w0")], flat(gib, 5))
    annotations = [t for t, action, _ in steps(events) if action == "Annotate"]
    assert annotations == ([] if first is None else [first])


def test_pending_violation_is_in_status_and_resets_when_usage_drops():
    b = budget(per_pod={"vram": "40Gi"}, tolerance={"overshootPercent": 10, "duration": "2m"})
    timeline = [
        (0, {"w0": vram(43)}),
        (60, {"w0": vram(43)}),
        (90, {"w0": vram(30)}),
        (120, {"w0": vram(43)}),
        (180, {"w0": vram(43)}),
        (240, {"w0": vram(43)}),
    ]
    events, budgets, _ = simulate([b], [pod("w0")], timeline[:2])
    (v,) = budgets[0].status.violations
    assert v.opened_at is None and v.since == at(0) and budgets[0].status.open_violations == 0
    events, budgets, _ = simulate([b], [pod("w0")], timeline)
    # the dip at 90s restarts the clock: opens at 120 + 120
    assert [t for t, a, _ in steps(events) if a == "Annotate"] == [240]


LADDERS = [
    # id, ladder, expected (time, action) over 20 minutes at 41Gi sampled every 30s
    ("default-three-steps", None, [(0, "Annotate"), (300, "Throttle"), (600, "Evict")]),
    ("annotate-only", [{"action": "Annotate", "after": "0s"}], [(0, "Annotate")]),
    ("evict-only-late", [{"action": "Evict", "after": "7m"}], [(420, "Evict")]),
    (
        "throttle-then-evict",
        [{"action": "Throttle", "after": "1m"}, {"action": "Evict", "after": "90s"}],
        [(60, "Throttle"), (90, "Evict")],
    ),
    (
        "delayed-annotate",
        [{"action": "Annotate", "after": "2m"}, {"action": "Throttle", "after": "4m"}],
        [(120, "Annotate"), (240, "Throttle")],
    ),
]


@pytest.mark.parametrize(("ladder", "expected"), [c[1:] for c in LADDERS], ids=[c[0] for c in LADDERS])
def test_ladder_timing(ladder, expected):
    b = budget(per_pod={"vram": "40Gi"}, ladder=ladder)
    events, _, _ = simulate([b], [pod("w0")], flat(41, 20, every=30))
    assert [(t, a) for t, a, _ in steps(events)] == expected


def test_one_step_per_evaluation_when_several_are_due():
    # evaluations 20 minutes apart: Annotate, then Throttle, then Evict, one per evaluation
    b = budget(per_pod={"vram": "40Gi"})
    events, _, _ = simulate([b], [pod("w0")], flat(41, 60, every=1200))
    assert [(t, a) for t, a, _ in steps(events)] == [(0, "Annotate"), (1200, "Throttle"), (2400, "Evict")]


def test_steps_do_not_escalate_at_or_just_under_the_limit():
    # 39.5Gi is within the 2% recovery margin of 40Gi: the violation stays open but does not escalate
    b = budget(per_pod={"vram": "40Gi"})
    timeline = [(0, {"w0": vram(41)})] + [(t, {"w0": vram(39.5)}) for t in range(60, 1201, 60)]
    events, budgets, _ = simulate([b], [pod("w0")], timeline)
    assert [(t, a) for t, a, _ in steps(events)] == [(0, "Annotate")]
    assert budgets[0].status.open_violations == 1


def test_evict_is_retried_until_the_pod_terminates_then_recorded_once():
    b = budget(per_pod={"vram": "40Gi"})
    pods = [pod("w0")]
    budgets = [b]
    for t in (0, 300, 600):
        out = run(budgets, pods, [report("node-a", at(t), {"w0": vram(41)})], at(t))
        budgets, pods = apply(out, budgets, pods)
    # the eviction was refused (429 from a PodDisruptionBudget): the pod is not terminating
    pods = [replace(p, terminating=False) for p in pods]
    again = run(budgets, pods, [report("node-a", at(660), {"w0": vram(41)})], at(660))
    assert [type(d) for d in again.decisions] == [Evict]
    # accepted: the pod terminates; the step is recorded and never fires again
    budgets, pods = apply(again, budgets, pods)
    for t in (720, 780):
        out = run(budgets, pods, [report("node-a", at(t), {"w0": vram(41)})], at(t))
        assert out.decisions == ()
        budgets, pods = apply(out, budgets, pods)
    (v,) = budgets[0].status.violations
    assert v.step == "Evict" and v.step_time == at(720)


def test_total_violation_annotates_all_then_throttles_and_evicts_the_largest():
    b = budget(total={"vram": "60Gi"})
    pods = [pod("w0"), pod("w1"), pod("w2")]
    usage = {"w0": vram(20), "w1": vram(25), "w2": vram(16)}
    events, budgets, pods = simulate([b], pods, [(t, usage) for t in range(0, 601, 60)])
    assert steps(events) == [
        (0, "Annotate", "w0"),
        (0, "Annotate", "w1"),
        (0, "Annotate", "w2"),
        (300, "Throttle", "w1"),
        (600, "Evict", "w1"),
    ]
    throttle = next(d for _, d in events if isinstance(d, Throttle))
    assert throttle.observed_bytes == 61 * GI and throttle.limit_bytes == 60 * GI


def test_total_evict_fires_once_even_if_total_stays_above():
    b = budget(total={"vram": "50Gi"})
    pods = [pod("w0"), pod("w1"), pod("w2")]
    usage = {"w0": vram(30), "w1": vram(31, "GPU-1"), "w2": vram(30)}
    events, budgets, pods = simulate([b], pods, [(t, usage) for t in range(0, 1201, 60)], TWO_GPUS)
    assert [(a, p) for _, a, p in steps(events) if a == "Evict"] == [("Evict", "w1")]
    (v,) = budgets[0].status.violations
    assert v.step == "Evict" and v.step_time == at(660)
    # a terminating pod no longer counts: the rest is still above the limit
    assert v.observed_bytes == 60 * GI


def test_throttle_cpu_limit_from_the_step():
    b = budget(per_pod={"vram": "40Gi"}, ladder=[{"action": "Throttle", "after": "0s", "cpuLimit": "250m"}])
    out = run([b], [pod("w0", cpu="2")], [report("node-a", at(0), {"w0": vram(41)})], at(0))
    (d,) = out.decisions
    assert isinstance(d, Throttle)
    assert [(c.name, c.limit, c.request) for c in d.resize] == [("main", "250m", "250m")]
    assert d.original == {"main": {"limit": "2", "request": "2"}}
    (patch,) = out.pod_patches
    assert patch.annotations["vramguard.io/original-cpu"] == '{"main":{"limit":"2","request":"2"}}'


def test_throttle_impossible_is_explained():
    b = budget(per_pod={"vram": "40Gi"}, ladder=[{"action": "Throttle", "after": "0s"}])
    out = run([b], [pod("w0", cpu=None)], [report("node-a", at(0), {"w0": vram(41)})], at(0))
    (d,) = out.decisions
    assert isinstance(d, Throttle) and d.resize == ()
    assert "no CPU limit" in (d.impossible_reason or "")
    assert d.event.reason == "ThrottleImpossible" and "no CPU limit" in d.event.message
    (v,) = out.statuses[0].status.violations
    assert v.step == "Throttle" and "throttle impossible" in v.message
    assert all("original-cpu" not in k for p in out.pod_patches for k in p.annotations)


def test_events_name_budget_value_limit_next_step_and_when():
    b = budget(per_pod={"vram": "40Gi"})
    out = run([b], [pod("w0")], [report("node-a", at(0), {"w0": vram(41)})], at(0))
    (d,) = out.decisions
    msg = d.event.message
    assert "ml/train" in msg and "41Gi" in msg and "40Gi" in msg
    assert "Next: Throttle at 2024-05-01T10:05:00Z" in msg
    assert d.next_step == "Throttle" and d.next_step_time == at(300)
    assert not isinstance(d, DryRunStep)


def test_total_evict_is_recorded_only_when_its_target_terminates():
    b = budget(total={"vram": "50Gi"})
    pods = [pod("w0"), pod("w1"), pod("w2")]
    usage = {"w0": vram(20), "w1": vram(25), "w2": vram(10)}
    _, budgets, pods = simulate([b], pods, [(t, usage) for t in range(0, 541, 60)])
    # another pod terminates for its own reasons (a rollout) as the Evict comes due
    pods = [replace(p, terminating=p.name == "w2") for p in pods]
    usage = {"w0": vram(20), "w1": vram(35)}
    out = run(budgets, pods, [report("node-a", at(600), usage)], at(600))
    assert [(d.action, d.pod.name) for d in out.decisions] == [("Evict", "w1")]
    (v,) = out.statuses[0].status.violations
    assert v.step == "Throttle" and v.evict_target_uid == "uid-w1"
    budgets, pods = apply(out, budgets, pods)
    # the eviction was refused (429): w1 is still running, so Evict is retried, not recorded
    pods = [replace(p, terminating=p.name == "w2") for p in pods]
    out = run(budgets, pods, [report("node-a", at(660), usage)], at(660))
    assert [(d.action, d.pod.name) for d in out.decisions] == [("Evict", "w1")]
    budgets, pods = apply(out, budgets, pods)
    # accepted: w1 terminates and the step is recorded; w0 is never evicted
    out = run(budgets, pods, [report("node-a", at(720), {"w0": vram(55)})], at(720))
    assert out.decisions == ()
    (v,) = out.statuses[0].status.violations
    assert (v.step, v.step_time) == ("Evict", at(720))


def test_total_evict_counts_when_its_target_is_gone_and_survives_a_lost_status():
    b = budget(total={"vram": "50Gi"})
    usage = {"w0": vram(30), "w1": vram(31)}
    events, budgets, pods = simulate([b], [pod("w0"), pod("w1")], [(t, usage) for t in range(0, 601, 60)])
    assert steps(events)[-1] == (600, "Evict", "w1")
    # the target pod is gone (its record with it): the status says whom it evicted
    gone = [p for p in pods if p.name != "w1"]
    out = run(budgets, gone, [report("node-a", at(660), {"w0": vram(51)})], at(660))
    assert out.decisions == () and out.statuses[0].status.violations[0].step == "Evict"
    # the status write was lost, but the terminating target's annotation says it
    blank = [budgets[0].model_copy(update={"status": None})]
    out = run(blank, pods, [report("node-a", at(660), {"w0": vram(51)})], at(660))
    assert out.decisions == () and out.statuses[0].status.violations[0].step == "Evict"


def test_total_evict_target_that_was_never_throttled_is_not_throttled_by_it():
    # Throttle went to w1; when Evict comes due w0 is the largest: w0 is chosen for
    # eviction, and its record says so without claiming that the total throttled it
    b = budget(total={"vram": "50Gi"})
    usage = {"w0": vram(20), "w1": vram(31)}
    _, budgets, pods = simulate([b], [pod("w0"), pod("w1")], [(t, usage) for t in range(0, 541, 60)])
    usage = {"w0": vram(40), "w1": vram(20)}
    out = run(budgets, pods, [report("node-a", at(600), usage)], at(600))
    assert [(d.action, d.pod.name) for d in out.decisions] == [("Evict", "w0")]
    (patch,) = out.pod_patches
    (entry,) = json.loads(patch.annotations[ANNOTATION_VIOLATIONS])
    assert (entry["step"], entry["evictTargetUID"]) == ("Annotate", "uid-w0")
    budgets, pods = apply(out, budgets, pods)
    pods = [replace(p, terminating=False) for p in pods]  # refused (429)
    out = run(budgets, pods, [report("node-a", at(660), usage)], at(660))
    assert [(d.action, d.pod.name) for d in out.decisions] == [("Evict", "w0")]  # no Throttle on w0
