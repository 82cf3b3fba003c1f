"""Measurement (``engine.measure``) and warnings (``engine.warnings``): node
reports read at ``now``, limits checked, the fast path, the leak projection."""

from __future__ import annotations

from datetime import timedelta

from vramguard_api.budget import LimitWarning
from vramguard_api.trend import TrendFeatures
from vramguard_operator.engine import warnings as warn
from vramguard_operator.engine.keys import ViolationKey
from vramguard_operator.engine.measure import (
    BudgetLimits,
    Measure,
    PodData,
    budget_measures,
    leak_measure,
    limit_measure,
    pod_data,
    read_nodes,
    vram_cap,
)

from .builders import GI, MI, TWO_GPUS, at, budget, pod, report, vram

KEY = ViolationKey("ml", "train", "PodVRAM", "w0")


def test_limit_flags_at_their_boundaries():
    limit = 100 * GI
    at_limit = limit_measure(KEY, limit, limit, 0.1, 0.02, None)
    assert (at_limit.over, at_limit.pause, at_limit.clear) == (False, True, False)
    above = limit_measure(KEY, limit + 1, limit, 0.1, 0.02, None)
    assert (above.over, above.hard, above.pause) == (True, False, False)
    hard = limit_measure(KEY, int(limit * 1.1) + 1, limit, 0.1, 0.02, None)
    assert hard.hard is True
    clear = limit_measure(KEY, int(limit * 0.98), limit, 0.1, 0.02, None)
    assert clear.clear is True
    unknown = limit_measure(KEY, None, limit, 0.1, 0.02, None)
    assert (unknown.over, unknown.hard, unknown.clear, unknown.pause) == (None, None, None, None)


def test_reports_are_stale_beyond_the_bound_either_way_and_missing_without_status():
    now = at(100)
    reps = {
        "fresh": report("fresh", now - timedelta(seconds=60), {}),
        "old": report("old", now - timedelta(seconds=61), {}),
        "ahead": report("ahead", now + timedelta(seconds=61), {}),
        "cut": report("cut", now, {}, truncated=True),
    }
    nodes = read_nodes(reps, now, 60)
    assert {n: v.state for n, v in nodes.items()} == {
        "fresh": "Fresh",
        "old": "Stale",
        "ahead": "Stale",
        "cut": "Fresh",
    }
    assert nodes["fresh"].complete and not nodes["cut"].complete
    # a pod absent from a complete report holds no VRAM; from an incomplete one, unknown
    assert pod_data(pod("w0", node="fresh"), nodes).vram == 0
    assert pod_data(pod("w0", node="cut"), nodes).vram is None
    assert pod_data(pod("w0", node="old"), nodes).state == "Stale"
    assert pod_data(pod("w0", node="nowhere"), nodes).state == "Missing"


def data_of(name: str, gib: float, **extra) -> PodData:
    nodes = read_nodes({"node-a": report("node-a", at(0), {name: vram(gib, **extra)}, devices=TWO_GPUS)}, at(0), 60)
    return pod_data(pod(name), nodes)


def test_quiet_pods_below_the_warning_threshold_build_no_measurement():
    b = budget(per_pod={"vram": "40Gi"}, total={"vram": "100Gi"}, warning=0.8)
    lim = BudgetLimits.of(b.spec, 0.02, {})
    data = [data_of("w0", 31), data_of("w1", 33)]  # 77.5% and 82.5% of 40Gi
    keys = [m.key for m in budget_measures(lim, "ml", "train", data, set(), at(0))]
    assert keys == [ViolationKey("ml", "train", "PodVRAM", "w1"), ViolationKey("ml", "train", "TotalVRAM")]
    # a pod with state in the budget is always measured
    keys = [m.key for m in budget_measures(lim, "ml", "train", data, {"w0"}, at(0))]
    assert ViolationKey("ml", "train", "PodVRAM", "w0") in keys


def test_named_device_limits_replace_per_device_and_apply_without_it():
    devices = [{"uuid": "GPU-0", "usedBytes": 20 * GI}, {"uuid": "GPU-1", "usedBytes": 20 * GI}]
    d = data_of("w0", 40, devices=devices)
    named = {"GPU-1": 10 * GI}

    def device_limits(**kw):
        lim = BudgetLimits.of(budget(**kw).spec, 0.02, named)
        measures = budget_measures(lim, "ml", "train", [d], {"w0"}, at(0))
        return {m.key.device: m.limit for m in measures if m.key.kind == "DeviceVRAM"}

    assert device_limits(per_device={"vram": "30Gi"}) == {"GPU-0": 30 * GI, "GPU-1": 10 * GI}
    assert device_limits(total={"vram": "1Ti"}) == {"GPU-1": 10 * GI}


def test_a_total_with_an_unknown_member_shows_its_partial_sum_and_decides_nothing():
    b = budget(total={"vram": "10Gi"})
    lim = BudgetLimits.of(b.spec, 0.02, {})
    unknown = data_of("w1", 1, attribution="Unknown")
    (m,) = budget_measures(lim, "ml", "train", [data_of("w0", 20), unknown], set(), at(0))
    assert (m.observed, m.over, m.clear) == (20 * GI, None, None)


def trend(growth_gib_per_h: float) -> dict:
    return TrendFeatures(
        windowSeconds=3600,
        samples=240,
        growthBytesPerHour=growth_gib_per_h * GI,
        growthLowBytesPerHour=GI / 2,
        riseSeconds=3600,
        onsetSeconds=3600,
    ).to_api()


def test_leak_projection_runs_from_the_latest_vram_to_the_cap():
    b = budget(per_pod={"vram": "16Gi"}, leak={"enabled": True, "evictBefore": "30m"})
    lim = BudgetLimits.of(b.spec, 0.02, {})
    d = data_of("w0", 14, trend=trend(1))
    m = leak_measure(ViolationKey("ml", "train", "Leak", "w0"), d, lim, at(0))
    assert (m.over, m.observed, m.limit) == (True, GI, 200 * MI)
    assert m.leak is not None and (m.leak.cap, m.leak.seconds_left) == (16 * GI, 7200)
    assert m.projected_evict == at(7200 - 1800)
    # shrinking: no projection, so no Evict brought forward
    m = leak_measure(ViolationKey("ml", "train", "Leak", "w0"), data_of("w0", 14, trend=trend(-1)), lim, at(0))
    assert m.projected_evict is None and m.leak.seconds_left is None


def test_vram_cap_of_a_pod_on_two_devices_is_shifted_by_the_other_device():
    usage = {
        "vramBytes": 30 * GI,
        "devices": [{"uuid": "GPU-0", "usedBytes": 20 * GI}, {"uuid": "GPU-1", "usedBytes": 10 * GI}],
    }
    devices = [
        {"uuid": u, "index": i, "memory": {"totalBytes": 80 * GI, "usableBytes": 80 * GI}}
        for i, u in enumerate(["GPU-0", "GPU-1"])
    ]
    nodes = read_nodes({"node-a": report("node-a", at(0), {"w0": usage}, devices=devices)}, at(0), 60)
    d = pod_data(pod("w0"), nodes)

    def cap(named=None, **kw):
        return vram_cap(BudgetLimits.of(budget(**kw).spec, 0.02, named or {}), d)

    assert cap(per_pod={"vram": "40Gi"}) == 40 * GI
    # GPU-0 (most used) may hold 50% of 80Gi; the 10Gi on GPU-1 come on top
    assert cap(per_device={"fraction": 0.5}) == 40 * GI + 10 * GI
    assert cap(total={"vram": "1Ti"}) == 80 * GI + 10 * GI
    # a limit granted on the named device replaces perDevice there, and applies without it
    assert cap({"GPU-0": 30 * GI}, per_device={"fraction": 0.5}) == 30 * GI + 10 * GI
    assert cap({"GPU-0": 30 * GI}, total={"vram": "1Ti"}) == 30 * GI + 10 * GI
    assert cap({"GPU-1": 30 * GI}, total={"vram": "1Ti"}) == 80 * GI + 10 * GI


def test_warning_hysteresis_and_carry_over():
    m = limit_measure(KEY, 34 * GI - GI // 2, 40 * GI, 0.1, 0.02, None)  # 83.75%
    assert warn.above_threshold(m, {}, 0.85, 0.02) is None
    prev = LimitWarning(kind="PodVRAM", pod="w0", observedBytes=35 * GI, limitBytes=40 * GI, since=at(0))
    stored = warn.stored_warnings([prev])
    cand = warn.above_threshold(m, stored, 0.85, 0.02)  # 83.75% >= 85% - 2%: still warned
    assert cand is not None and cand.prev is prev and cand.ratio == 33.5 / 40
    assert warn.above_threshold(limit_measure(KEY, 32 * GI, 40 * GI, 0.1, 0.02, None), stored, 0.85, 0.02) is None
    unknown = limit_measure(KEY, None, 40 * GI, 0.1, 0.02, None)
    assert warn.carried(unknown, stored).prev is prev and warn.carried(unknown, {}) is None


def test_settle_keeps_the_highest_shares_and_warns_only_for_new_ones():
    def cand(pod: str, gib: float, prev: LimitWarning | None = None) -> warn.WarnCandidate:
        m = Measure(ViolationKey("ml", "t", "PodVRAM", pod), int(gib * GI), 40 * GI, False, False, False, True)
        return warn.WarnCandidate(gib / 40, m.key, m, prev)

    old = LimitWarning(kind="PodVRAM", pod="a", observedBytes=35 * GI, limitBytes=40 * GI, since=at(0))
    kept, new = warn.settle([cand("c", 35), cand("a", 36, old), cand("b", 39)], 2, at(60))
    assert [(w.pod, w.since) for w in kept] == [("b", at(60)), ("a", at(0))]
    assert [m.key.pod for m in new] == ["b"]  # "c" is beyond the bound: no Event it could not remember
