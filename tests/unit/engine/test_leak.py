"""Leak violations from trend features, and evictBefore."""

from __future__ import annotations

from typing import Any

from vramguard_api.leak import seconds_to_limit
from vramguard_api.trend import TrendFeatures
from vramguard_operator.engine.leak_rule import LeakThresholds, leak_cleared, leak_holds

from .builders import GI, MI, budget, pod, simulate, steps, vram


def trend(growth_mib_h: float, *, window_s: float = 3600, low: float | None = None) -> dict[str, Any]:
    """Trend features of a pod whose floor has grown ``growth_mib_h`` MiB/h over the window."""
    g = growth_mib_h * MI
    f: dict[str, Any] = {
        "windowSeconds": window_s,
        "samples": 120,
        "growthBytesPerHour": g,
        "growthLowBytesPerHour": (low if low is not None else growth_mib_h * 0.8) * MI,
        "floorRiseBytes": g * window_s / 3600,
    }
    f["onsetSeconds"] = window_s if growth_mib_h > 0 else None
    return f


def ladder_steps(events):
    """Steps without the PodVRAM warnings that a pod near its limit also raises."""
    return [s for s in steps(events) if s[1] != "Warn"]


def leaking(gib: float, growth_mib_h: float, **kw: Any) -> dict[str, Any]:
    return vram(gib, trend=trend(growth_mib_h, **kw))


LEAK = {"enabled": True, "minGrowthPerHour": "200Mi", "minWindow": "30m"}


def test_leak_opens_a_violation_that_follows_the_ladder():
    b = budget(per_pod={"vram": "16Gi"}, leak=LEAK)
    timeline = [(t, {"w0": leaking(8, 500)}) for t in range(0, 901, 60)]
    events, budgets, _ = simulate([b], [pod("w0")], timeline)
    assert steps(events) == [(0, "Annotate", "w0"), (300, "Throttle", "w0"), (600, "Evict", "w0")]
    first = events[0][1]
    assert first.violation.kind == "Leak" and first.event.reason == "LeakDetected"
    assert (first.observed_bytes, first.limit_bytes) == (500 * MI, 200 * MI)
    assert "500Mi/h" in first.event.message and "projected to reach 16Gi" in first.event.message
    violating = next(c for c in budgets[0].status.conditions if c.type == "Violating")
    assert violating.reason == "LeakDetected"


def test_no_leak_when_disabled_too_slow_or_too_short():
    cases = [
        ({**LEAK, "enabled": False}, leaking(8, 500)),
        (LEAK, leaking(8, 150)),  # below minGrowthPerHour
        (LEAK, leaking(8, 500, window_s=900)),  # shorter than minWindow
        (LEAK, vram(8)),  # no trend features: unknown
    ]
    for leak, usage in cases:
        events, _, _ = simulate([budget(per_pod={"vram": "16Gi"}, leak=leak)], [pod("w0")], [(0, {"w0": usage})])
        assert events == [], (leak, usage)


def test_leak_recovers_when_growth_stops():
    b = budget(per_pod={"vram": "16Gi"}, leak=LEAK)
    timeline = [(0, {"w0": leaking(8, 500)}), (60, {"w0": leaking(8, 100)})]
    events, budgets, _ = simulate([b], [pod("w0")], timeline)
    assert steps(events) == [(0, "Annotate", "w0"), (60, "Recover", "w0")]


def test_evict_before_projected_exhaustion():
    # 15Gi used, 16Gi limit, 3Gi/h: the limit is 20 minutes away; evictBefore 30m
    b = budget(
        per_pod={"vram": "16Gi"},
        leak={**LEAK, "evictBefore": "30m"},
        ladder=[{"action": "Annotate", "after": "0s"}, {"action": "Evict", "after": "2h"}],
    )
    timeline = [(t, {"w0": leaking(15, 3 * 1024)}) for t in (0, 60, 120)]
    events, _, _ = simulate([b], [pod("w0")], timeline)
    assert ladder_steps(events) == [(0, "Annotate", "w0"), (60, "Evict", "w0")]


def test_evict_before_adds_an_evict_step_and_waits_for_the_projection():
    # no Evict rung: evictBefore adds one, due 30 minutes before the projected exhaustion
    b = budget(
        per_pod={"vram": "16Gi"}, leak={**LEAK, "evictBefore": "30m"}, ladder=[{"action": "Annotate", "after": "0s"}]
    )
    # 14Gi used, 2Gi to go at 1Gi/h: exhaustion in 2h, so Evict due in 1h30m
    timeline = [(t, {"w0": leaking(14 + t / 3600, 1024)}) for t in range(0, 7201, 600)]
    events, budgets, _ = simulate([b], [pod("w0")], timeline)
    assert ladder_steps(events) == [(0, "Annotate", "w0"), (5400, "Evict", "w0")]


def test_evict_before_never_skips_earlier_steps():
    b = budget(
        per_pod={"vram": "16Gi"},
        leak={**LEAK, "evictBefore": "1h"},
        ladder=[{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "10m"}],
    )
    timeline = [(t, {"w0": leaking(15.9, 4096)}) for t in range(0, 1201, 60)]
    events, _, _ = simulate([b], [pod("w0")], timeline)
    assert ladder_steps(events) == [(0, "Annotate", "w0"), (600, "Throttle", "w0"), (660, "Evict", "w0")]


def test_rule_functions():
    th = LeakThresholds.of(budget(per_pod={"vram": "1Gi"}, leak=LEAK).spec.leak_detection)
    assert (th.min_growth_bytes_per_hour, th.min_window_seconds, th.evict_before_seconds) == (200 * MI, 1800, None)
    assert leak_holds(TrendFeatures.model_validate(trend(500)), th) is True
    assert leak_holds(TrendFeatures(windowSeconds=60, samples=2), th) is None
    assert leak_cleared(TrendFeatures.model_validate(trend(500)), th) is False
    assert leak_cleared(TrendFeatures.model_validate(trend(100)), th) is True
    assert seconds_to_limit(15 * GI, 16 * GI, 1 * GI) == 3600
    assert seconds_to_limit(17 * GI, 16 * GI, 1 * GI) == 0
    assert seconds_to_limit(1, None, 1.0) is None and seconds_to_limit(1, 2, 0.0) is None


def test_features_without_an_onset_are_no_leak():
    # growth figures alone (no structural rise found by the agent) never make a leak,
    # however steep: the decision is vramguard_api.trend.trend_verdict's
    th = LeakThresholds.of(budget(per_pod={"vram": "1Gi"}, leak=LEAK).spec.leak_detection)
    features = {k: v for k, v in trend(5000, window_s=7200).items() if k != "onsetSeconds"}
    assert leak_holds(TrendFeatures.model_validate(features), th) is False
    b = budget(per_pod={"vram": "16Gi"}, leak=LEAK)
    events, _, _ = simulate([b], [pod("w0")], [(0, {"w0": vram(8, trend=features)})])
    assert events == []


def test_a_ram_leak_is_watched_when_the_budget_names_ram_and_named_as_ram():
    # VRAM flat, RAM working set rising: a data-loader leak, not a VRAM one
    usage = vram(8, trend=trend(0), ramWorkingSetBytes=20 * GI, ramTrend=trend(500))
    timeline = [(t, {"w0": usage}) for t in range(0, 301, 60)]
    vram_only = budget(per_pod={"vram": "16Gi", "ram": "32Gi"}, leak=LEAK)
    events, _, _ = simulate([vram_only], [pod("w0")], timeline)
    assert ladder_steps(events) == []  # the default watches VRAM only
    ram = budget(per_pod={"vram": "16Gi", "ram": "32Gi"}, leak={**LEAK, "memories": ["RAM"]})
    events, budgets, _ = simulate([ram], [pod("w0")], timeline)
    first = events[0][1]
    assert first.violation.kind == "RAMLeak" and first.event.reason == "LeakDetected"
    assert "RAM grows 500Mi/h" in first.event.message and "VRAM" not in first.event.message
    assert "projected to reach 32Gi" in first.event.message  # perPod.ram is the RAM leak's cap
    assert [v.kind for v in budgets[0].status.violations] == ["RAMLeak"]


def test_both_memories_watched_open_one_violation_each_with_the_same_thresholds():
    usage = leaking(8, 500) | {"ramWorkingSetBytes": 20 * GI, "ramTrend": trend(150)}
    timeline = [(t, {"w0": usage}) for t in range(0, 301, 60)]
    both = budget(per_pod={"vram": "16Gi"}, leak={**LEAK, "memories": ["VRAM", "RAM"]})
    _, budgets, _ = simulate([both], [pod("w0")], timeline)
    assert [v.kind for v in budgets[0].status.violations] == ["Leak"]  # RAM at 150Mi/h is under 200Mi/h
    usage["ramTrend"] = trend(400)
    _, budgets, _ = simulate([both], [pod("w0")], timeline)
    assert sorted(v.kind for v in budgets[0].status.violations) == ["Leak", "RAMLeak"]
