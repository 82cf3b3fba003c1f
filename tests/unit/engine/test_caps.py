"""The Cap step: the hard limit it records on the pod (``vramguard.io/memory-limits``)
starts at the pod's use and follows it down to its level, is level-triggered
(restarts neither lose nor duplicate it), held on unknown data, removed on
recovery, when the budget no longer asks, and never written in DryRun; where
no device of the pod can hold one it is recorded as impossible and the ladder
moves on."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from vramguard_api.memlimits import MIN_HARD_LIMIT_BYTES, parse_memory_limits
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.types import (
    ANNOTATION_MEMORY_LIMITS,
    EVENT_CAP_IMPOSSIBLE,
    EVENT_CAPPED,
    Cap,
    DryRunStep,
    EffectivePolicy,
    Evict,
    Recover,
)

from .builders import GI, MI, NS, apply, at, budget, pod, report, run, steps, vram

LADDER = [
    {"action": "Annotate", "after": "0s"},
    {"action": "Cap", "after": "2m"},
    {"action": "Evict", "after": "10m"},
]
GPU0 = "GPU-0"


def device(uuid: str = GPU0, index: int = 0, support: str | None = "Supported", reason: str = "ProbeSucceeded"):
    d: dict[str, Any] = {
        "uuid": uuid,
        "index": index,
        "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI},
    }
    if support is not None:
        d.update(memoryLimits=support, memoryLimitsReason=reason, memoryLimitsMessage="probe")
    return d


def node_report(t: float, pods: dict[str, dict[str, Any]], devices: list[dict[str, Any]] | None = None, **status):
    rep = report("node-a", at(t), pods, devices=devices or [device()])
    if not status:
        return rep
    body = rep.model_dump(by_alias=True, exclude_none=True)
    return NodeGPUUsage.model_validate({**body, "status": {**body["status"], **status}})


def limits_of(p) -> dict[str, dict[str, int]]:
    text = p.annotations.get(ANNOTATION_MEMORY_LIMITS)
    return {} if text is None else {u: lim.to_json() for u, lim in parse_memory_limits(text).items()}


def play(budgets, pods, timeline, *, devices=None, policy=None):
    """Evaluate at each (seconds, usage), applying each output; returns (time, decision)
    pairs, the annotation's limits after each step, and the end state."""
    events, seen = [], []
    for t, usage in timeline:
        out = run(budgets, pods, [node_report(t, usage, devices)], at(t), policy=policy)
        events.extend((t, d) for d in out.decisions)
        budgets, pods = apply(out, budgets, pods)
        seen.append((t, limits_of(pods[0])))
    return events, seen, budgets, pods


def over(n: float, until: int = 900) -> list[tuple[int, dict[str, Any]]]:
    return [(t, {"w0": vram(n)}) for t in range(0, until + 1, 60)]


def granule_up(n_bytes: int) -> int:
    return -(-n_bytes // MIN_HARD_LIMIT_BYTES) * MIN_HARD_LIMIT_BYTES


# --- the step and the limit it writes ----------------------------------------------------


def test_cap_fires_on_its_delay_and_writes_the_hard_limit_at_the_pods_use():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    events, seen, _, pods = play([b], [pod("w0")], over(45.1, 240))
    assert steps(events) == [(0, "Annotate", "w0"), (120, "Cap", "w0")]
    (cap,) = [d for _, d in events if isinstance(d, Cap)]
    held = granule_up(int(45.1 * GI))
    assert cap.hard_limits == {GPU0: held} and cap.impossible_reason is None
    assert cap.event.reason == EVENT_CAPPED
    assert "Capped: GPU memory hard limit 45.2Gi on GPU-0, down to 40Gi as the pod frees memory" in cap.event.message
    assert "Next: Evict at 2024-05-01T10:10:00Z" in cap.event.message
    assert dict(seen)[60] == {} and dict(seen)[120] == {GPU0: {"hardLimit": held}}
    assert json.loads(pods[0].annotations["vramguard.io/violations"])[0]["step"] == "Cap"


def test_the_hard_limit_follows_the_pods_use_down_to_the_level_and_never_up():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    usage = [45, 45, 45, 43, 47, 41.1, 30]
    timeline = [(t * 60, {"w0": vram(n)}) for t, n in enumerate(usage)]
    events, seen, _, pods = play([b], [pod("w0")], timeline)
    hard = [lim.get(GPU0, {}).get("hardLimit") for _, lim in seen]
    assert hard == [None, None, 45 * GI, 43 * GI, 43 * GI, granule_up(int(41.1 * GI)), None]
    # recovered: the violation closes, the cap goes with it
    assert isinstance(events[-1][1], Recover) and ANNOTATION_MEMORY_LIMITS not in pods[0].annotations


def test_the_level_is_reached_and_held_while_the_violation_stays_open():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    timeline = [(0, {"w0": vram(45)}), (120, {"w0": vram(45)}), (180, {"w0": vram(39.5)})]
    _, seen, _, _ = play([b], [pod("w0")], timeline)
    # 39.5Gi is within the recovery margin of 40Gi (2%): still open, held at the level
    assert seen[-1][1] == {GPU0: {"hardLimit": 40 * GI}}


def test_a_restart_neither_loses_nor_duplicates_the_cap():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, budgets, pods = play([b], [pod("w0")], over(45, 180))
    again = run(budgets, pods, [node_report(180, {"w0": vram(45)})], at(180))
    assert not [d for d in again.decisions if isinstance(d, Cap)] and again.pod_patches == ()
    # the budget status lost (a restart between patch and status write): the pod's record keeps the step
    lost = [budgets[0].model_copy(update={"status": None})]
    again = run(lost, pods, [node_report(240, {"w0": vram(45)})], at(240))
    assert not [d for d in again.decisions if isinstance(d, Cap)]
    assert all(ANNOTATION_MEMORY_LIMITS not in p.annotations for p in again.pod_patches)


def test_unknown_data_holds_the_cap_as_it_is():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, seen, budgets, pods = play([b], [pod("w0")], over(45, 180))
    capped = seen[-1][1]
    stale = run(budgets, pods, [node_report(180, {"w0": vram(30)})], at(600))  # report 7 minutes old
    unknown = run(budgets, pods, [node_report(600, {"w0": {"attribution": "Unknown"}})], at(600))
    for out in (stale, unknown):
        assert not any(ANNOTATION_MEMORY_LIMITS in p.annotations for p in out.pod_patches)
        assert [m.limits for m in out.memory_limits] == [parse_memory_limits(json.dumps(capped))]


def test_a_terminating_pod_keeps_its_cap():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, budgets, pods = play([b], [pod("w0")], over(45, 120))
    gone = [replace(pods[0], terminating=True)]
    out = run(budgets, gone, [node_report(180, {"w0": vram(45)})], at(180))
    assert not any(ANNOTATION_MEMORY_LIMITS in p.annotations for p in out.pod_patches)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"ladder": [{"action": "Annotate", "after": "0s"}, {"action": "Evict", "after": "10m"}]},
                     id="ladder-without-cap"),
        pytest.param({"mode": "DryRun"}, id="budget-dry-run"),
        pytest.param({"selector": {"matchLabels": {"app": "other"}}}, id="no-longer-selected"),
    ],
)
def test_the_cap_goes_when_the_budget_no_longer_asks_for_it(change):
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, budgets, pods = play([b], [pod("w0")], over(45, 120))
    assert ANNOTATION_MEMORY_LIMITS in pods[0].annotations
    edited = budget(per_pod={"vram": "40Gi"}, **{"ladder": LADDER, **change})
    edited = edited.model_copy(update={"status": budgets[0].status})
    out = run([edited], pods, [node_report(180, {"w0": vram(45)})], at(180))
    (patch,) = out.pod_patches
    assert patch.annotations[ANNOTATION_MEMORY_LIMITS] is None


def test_the_cap_goes_when_the_policy_turns_to_dry_run_or_exempts_the_namespace():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, budgets, pods = play([b], [pod("w0")], over(45, 120))
    for policy in (EffectivePolicy(mode="DryRun"), EffectivePolicy(exempt_namespaces=frozenset({NS}))):
        out = run(budgets, pods, [node_report(180, {"w0": vram(45)})], at(180), policy=policy)
        assert [p.annotations.get(ANNOTATION_MEMORY_LIMITS, "kept") for p in out.pod_patches] == [None]


def test_the_cap_goes_with_its_budget():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, _, pods = play([b], [pod("w0")], over(45, 120))
    out = run([], pods, [node_report(180, {"w0": vram(45)})], at(180))
    (patch,) = out.pod_patches
    assert patch.annotations[ANNOTATION_MEMORY_LIMITS] is None
    assert [d.cause for d in out.decisions if isinstance(d, Recover)] == ["BudgetDeleted"]


def test_dry_run_would_cap_and_writes_nothing():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER, mode="DryRun")
    events, seen, budgets, _ = play([b], [pod("w0")], over(45, 180))
    (would,) = [d for _, d in events if isinstance(d, DryRunStep) and d.would == "Cap"]
    assert would.event.message.startswith("dry run: would cap.")
    assert all(lim == {} for _, lim in seen)
    assert budgets[0].status.violations[0].step == "Cap" and budgets[0].status.violations[0].dry_run


# --- impossible: the ladder moves on -------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "agent", "why"),
    [
        ([device(support="Unsupported", reason="DriverTooOld")], None, "GPU-0 does not support per-cgroup memory"
         " limits (DriverTooOld: probe)"),
        ([device()], {"version": "1", "backend": "sim", "sampleIntervalSeconds": 5, "enforceCaps": False},
         "the node agent does not apply memory limits (enforceCaps off)"),
        ([device(uuid="MIG-1", support=None)], None, "MIG-1 is no GPU UUID: a MIG device (which cannot hold memory limits) or unknown"),
    ],
    ids=["device-unsupported", "agent-without-enforce-caps", "mig-device"],
)
def test_where_no_device_can_hold_a_cap_the_step_is_impossible_and_the_ladder_moves_on(devices, agent, why):
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    uuid = devices[0]["uuid"]
    events, budgets, pods, messages = [], [b], [pod("w0")], {}
    for t in range(0, 661, 60):
        status = {"agent": agent} if agent else {}
        rep = node_report(t, {"w0": vram(45, device=uuid)}, devices, **status)
        out = run(budgets, pods, [rep], at(t))
        events.extend((t, d) for d in out.decisions)
        budgets, pods = apply(out, budgets, pods)
        messages[t] = budgets[0].status.violations[0].message
    assert steps(events) == [(0, "Annotate", "w0"), (120, "Cap", "w0"), (600, "Evict", "w0")]
    (cap,) = [d for _, d in events if isinstance(d, Cap)]
    assert cap.impossible_reason == why and cap.hard_limits == {}
    assert cap.event.reason == EVENT_CAP_IMPOSSIBLE and cap.event.message.endswith(f"Cap impossible: {why}")
    assert ANNOTATION_MEMORY_LIMITS not in pods[0].annotations
    assert messages[540].endswith(f"; cap impossible: {why}")


def test_a_ram_violation_cannot_be_capped():
    b = budget(per_pod={"ram": "8Gi"}, ladder=LADDER)
    timeline = [(t, {"w0": {**vram(1), "ramWorkingSetBytes": 9 * GI}}) for t in (0, 120)]
    events, seen, _, _ = play([b], [pod("w0")], timeline)
    (cap,) = [d for _, d in events if isinstance(d, Cap)]
    assert cap.impossible_reason == "the driver limits GPU memory only, not RAM"
    assert seen[-1][1] == {}


def test_the_status_says_what_the_agent_holds():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, budgets, pods = play([b], [pod("w0")], over(45, 120))
    entry = {"uuid": GPU0, "state": "Failed", "reason": "NotHeld", "message": "the driver holds no hard limit"}
    out = run(budgets, pods, [node_report(180, {"w0": vram(45, memoryLimits=[entry])})], at(180))
    msg = out.statuses[0].status.violations[0].message
    assert msg.endswith("cap on GPU-0: Failed (NotHeld): the driver holds no hard limit")
    assert [m.not_held for m in out.memory_limits] == [(GPU0,)]
    applied = {**entry, "state": "Applied", "reason": "Applied", "message": None, "hardLimitBytes": 45 * GI}
    out = run(budgets, pods, [node_report(180, {"w0": vram(45, memoryLimits=[applied])})], at(180))
    assert out.statuses[0].status.violations[0].message.endswith("cap on GPU-0: 45Gi held")


# --- levels ----------------------------------------------------------------------------------


def test_a_device_violation_caps_that_device_only():
    b = budget(per_device={"vram": "20Gi"}, ladder=LADDER)
    usage = {"vramBytes": 30 * GI, "devices": [{"uuid": "GPU-0", "usedBytes": 25 * GI},
                                               {"uuid": "GPU-1", "usedBytes": 5 * GI}]}
    devices = [device(), device("GPU-1", 1)]
    _, seen, _, _ = play([b], [pod("w0")], [(0, {"w0": usage}), (120, {"w0": usage})], devices=devices)
    assert seen[-1][1] == {"GPU-0": {"hardLimit": 25 * GI}}


def test_a_pod_limit_is_split_over_its_devices_by_use():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    usage = {"vramBytes": 48 * GI, "devices": [{"uuid": "GPU-0", "usedBytes": 36 * GI},
                                               {"uuid": "GPU-1", "usedBytes": 12 * GI}]}
    fallen = {"vramBytes": 40 * GI + 1, "devices": [{"uuid": "GPU-0", "usedBytes": 30 * GI},
                                                    {"uuid": "GPU-1", "usedBytes": 10 * GI + 1}]}
    devices = [device(), device("GPU-1", 1)]
    timeline = [(0, {"w0": usage}), (120, {"w0": usage}), (180, {"w0": fallen})]
    _, seen, _, _ = play([b], [pod("w0")], timeline, devices=devices)
    assert seen[1][1] == {"GPU-0": {"hardLimit": 36 * GI}, "GPU-1": {"hardLimit": 12 * GI}}
    # levels 30Gi and 10Gi (40Gi by 3:1): GPU-0 reaches its level, GPU-1 stops one granule above it
    assert seen[2][1] == {"GPU-0": {"hardLimit": 30 * GI}, "GPU-1": {"hardLimit": 10 * GI + 256 * MI}}


@pytest.mark.parametrize("level", [{"vram": "42Gi"}, {"fraction": 0.525}], ids=["bytes", "fraction-of-usable"])
def test_the_steps_hard_limit_sets_the_level(level):
    ladder = [{**r, "hardLimit": level} if r["action"] == "Cap" else r for r in LADDER]
    b = budget(per_pod={"vram": "40Gi"}, ladder=ladder)
    timeline = [(t * 60, {"w0": vram(n)}) for t, n in enumerate([45, 45, 45, 41, 10])]
    _, seen, _, _ = play([b], [pod("w0")], timeline)
    hard = [lim.get(GPU0, {}).get("hardLimit") for _, lim in seen]
    assert hard == [None, None, 45 * GI, 42 * GI, None]


def test_a_leak_is_capped_where_it_stands():
    b = budget(per_pod={"vram": "79Gi"}, ladder=LADDER, leak={"enabled": True, "minGrowthPerHour": "1Gi"})
    trend = {"windowSeconds": 3600, "samples": 120, "growthBytesPerHour": 4 * GI, "growthLowBytesPerHour": 3 * GI,
             "floorRiseBytes": 4 * GI, "onsetSeconds": 3600}
    timeline = [(0, {"w0": vram(20.1, trend=trend)}), (120, {"w0": vram(20.1, trend=trend)}),
                (180, {"w0": vram(12, trend=trend)})]
    events, seen, _, _ = play([b], [pod("w0")], timeline)
    (cap,) = [d for _, d in events if isinstance(d, Cap)]
    assert cap.violation.kind == "Leak" and "down to" not in cap.event.message
    held = {GPU0: {"hardLimit": granule_up(int(20.1 * GI))}}
    assert seen[1][1] == held
    assert seen[2][1] == held  # a leak's cap stays where it was set while the leak is open


def test_a_totals_cap_goes_to_the_largest_consumer_at_its_use_less_the_excess():
    b = budget(total={"vram": "60Gi"}, ladder=LADDER)
    usage = {"big": vram(50), "small": vram(20)}
    pods = [pod("big"), pod("small")]
    budgets = [b]
    for t in (0, 120, 180):
        u = usage if t < 180 else {"big": vram(45), "small": vram(20)}
        out = run(budgets, pods, [node_report(t, u)], at(t))
        budgets, pods = apply(out, budgets, pods)
    big, small = pods
    # excess 10Gi: big's level is 40Gi; it holds 45Gi now, so its hard limit follows it to 45Gi
    assert limits_of(big) == {GPU0: {"hardLimit": 45 * GI}} and limits_of(small) == {}


def test_two_budgets_capping_one_pod_hold_the_lowest_level():
    loose = budget(name="loose", uid="uid-loose", per_pod={"vram": "40Gi"}, ladder=LADDER)
    tight = budget(name="tight", uid="uid-tight", per_pod={"vram": "30Gi"}, ladder=LADDER)
    timeline = [(0, {"w0": vram(45)}), (120, {"w0": vram(45)}), (180, {"w0": vram(35)})]
    _, seen, _, _ = play([loose, tight], [pod("w0")], timeline)
    assert seen[-1][1] == {GPU0: {"hardLimit": 35 * GI}}


def test_a_malformed_annotation_is_reported_and_rewritten():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, budgets, pods = play([b], [pod("w0")], over(45, 120))
    forged = [replace(pods[0], annotations={**pods[0].annotations, ANNOTATION_MEMORY_LIMITS: "{nope"})]
    out = run(budgets, forged, [node_report(180, {"w0": vram(45)})], at(180))
    assert any("vramguard.io/memory-limits" in p for p in out.problems)
    (patch,) = out.pod_patches
    assert parse_memory_limits(patch.annotations[ANNOTATION_MEMORY_LIMITS]) == parse_memory_limits(
        pods[0].annotations[ANNOTATION_MEMORY_LIMITS]
    )


def test_a_capped_pod_is_still_evicted_on_time():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    events, _, _, _ = play([b], [pod("w0")], over(45, 600))
    assert [(t, type(d).__name__) for t, d in events if isinstance(d, Evict | Cap)] == [(120, "Cap"), (600, "Evict")]
