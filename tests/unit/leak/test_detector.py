"""detect_leak on synthetic series: properties (hypothesis) and behaviour at the edges."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.leak_corpora.tuning import names, trace
from vramguard_api.leak import (
    LeakResult,
    analyse,
    current_segment,
    detect_leak,
    fit_rise,
    needed_seconds,
    seconds_to_limit,
    validate_series,
)
from vramguard_api.leak.rise import staircase_ratio
from vramguard_api.leak.tuning import TUNING
from vramguard_api.trend import compute_trend, trend_verdict, verdict_growth

MIB, GIB, MINUTE, HOUR = 2**20, 2**30, 60.0, 3600.0
PROPERTIES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def series(
    minutes: float,
    *,
    dt: float = 15.0,
    base: float = 20 * GIB,
    rate_mib_h: float = 0.0,
    onset_min: float = 0.0,
    saw_gib: float = 0.0,
    noise_mib: float = 8.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Integer times (s) and whole-MiB bytes: a base, a leak from ``onset_min``, a
    training sawtooth sampled at random phases (a fifth of each step at its floor)
    and allocator noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, minutes * MINUTE + 1, dt)
    leak = np.maximum(t - onset_min * MINUTE, 0) * rate_mib_h * MIB / HOUR
    saw = np.where(rng.uniform(size=t.size) < 0.2, 0.0, rng.uniform(size=t.size)) * saw_gib * GIB
    v = base + leak + saw + rng.normal(0, noise_mib * MIB, t.size)
    return t, np.rint(v / MIB) * MIB


def same_verdict(a: LeakResult, b: LeakResult, scale: float = 1.0) -> None:
    assert a.leak == b.leak
    assert a.samples == b.samples
    assert a.growth_bytes_per_hour * scale == pytest.approx(
        b.growth_bytes_per_hour, rel=1e-6, abs=1.0
    )


# --- basic behaviour ------------------------------------------------------------------


def test_linear_leak_under_a_large_sawtooth_is_found_with_its_rate_and_onset():
    t, v = series(150, rate_mib_h=300, onset_min=60, saw_gib=8, seed=1)
    result = detect_leak(t, v, limit_bytes=40 * GIB)
    assert result.leak
    assert result.growth_bytes_per_hour == pytest.approx(300 * MIB, rel=0.15)
    assert 0 < result.growth_low_bytes_per_hour <= result.growth_bytes_per_hour
    assert result.onset_t_seconds == pytest.approx(60 * MINUTE, abs=10 * MINUTE)
    # Projected from the recent peak (base + leak + sawtooth top) at the growth rate.
    peak = 20 * GIB + 90 / 60 * 300 * MIB + 8 * GIB
    expected = (40 * GIB - peak) / result.growth_bytes_per_hour * HOUR
    assert result.time_to_limit_seconds == pytest.approx(expected, rel=0.1)


def test_flat_sawtooth_is_no_leak_and_gets_no_projection():
    t, v = series(240, saw_gib=8, seed=2)
    result = detect_leak(t, v, limit_bytes=40 * GIB)
    assert not result.leak and result.onset_t_seconds is None
    assert abs(result.growth_bytes_per_hour) < 50 * MIB
    assert result.time_to_limit_seconds is None


def test_thresholds_decide_rate_and_duration():
    t, v = series(120, rate_mib_h=400, seed=3)
    assert detect_leak(t, v).leak
    assert not detect_leak(t, v, min_growth_bytes_per_hour=500 * MIB).leak
    assert not detect_leak(t, v, min_window_seconds=3 * HOUR).leak
    short_t, short_v = series(20, rate_mib_h=400, seed=3)
    assert not detect_leak(short_t, short_v).leak  # 20 minutes is not 30, and no flat floor before it


def test_limit_already_reached_projects_zero():
    t, v = series(90, rate_mib_h=2048, seed=4)
    result = detect_leak(t, v, limit_bytes=20 * GIB)
    assert result.leak and result.time_to_limit_seconds == 0.0


def test_the_projection_is_the_shared_one_from_the_recent_peak():
    t, v = series(150, rate_mib_h=300, onset_min=60, saw_gib=8, seed=1)
    rise = fit_rise(*current_segment(*validate_series(t, v)))
    assert rise is not None
    result = detect_leak(t, v, limit_bytes=40 * GIB)
    shared = seconds_to_limit(rise.peak_bytes, 40 * GIB, rise.growth_bytes_per_hour)
    assert result.time_to_limit_seconds == shared
    assert seconds_to_limit(rise.peak_bytes, float("inf"), rise.growth_bytes_per_hour) is None


def test_empty_and_tiny_series():
    assert detect_leak([], []) == LeakResult(False, 0.0, 0.0, None, None, 0)
    assert detect_leak([0.0, 15.0], [GIB, GIB]).samples == 2
    assert not detect_leak([0.0, 15.0], [GIB, 2 * GIB]).leak


def test_missing_values_are_left_out():
    t, v = series(120, rate_mib_h=600, seed=5)
    holes = v.copy()
    holes[::7] = math.nan
    result = detect_leak(t, holes)
    assert result.leak and result.samples == int(np.isfinite(holes).sum())


@pytest.mark.parametrize(
    ("times", "values", "message"),
    [
        ([0, 1, 2], [1, 2], "one length"),
        ([0, 2, 1], [1, 2, 3], r"times_s\[2\] = 1.0 follows 2.0"),
        ([0, 1, 1], [1, 2, 3], "must increase"),
        ([0, math.inf, 2], [1, 2, 3], r"times_s\[1\]"),
        ([0, 1, 2], [1, -2, 3], r"values_bytes\[1\] = -2.0"),
        ([0, 1, 2], [1, 2, math.inf], r"values_bytes\[2\]"),
    ],
)
def test_bad_input_names_the_argument(times, values, message):
    with pytest.raises(ValueError, match=message):
        detect_leak(times, values)


def test_negative_thresholds_are_refused():
    with pytest.raises(ValueError, match="min_growth_bytes_per_hour"):
        detect_leak([0, 1, 2], [1, 2, 3], min_growth_bytes_per_hour=-1)
    with pytest.raises(ValueError, match=r"min_evidence_seconds \(-1\)"):
        detect_leak([0, 1, 2], [1, 2, 3], min_evidence_seconds=-1)


# --- restarts and dropouts --------------------------------------------------------------


def test_restart_starts_a_new_segment():
    # Leaks for two hours, dies (zeros for two minutes), restarts flat at the base.
    t1, v1 = series(120, rate_mib_h=3000, seed=6)
    t2, v2 = series(60, seed=7)
    t = np.concatenate([t1, t1[-1] + 15 + np.arange(8) * 15.0, t1[-1] + 135 + t2])
    v = np.concatenate([v1, np.zeros(8), v2])
    assert detect_leak(t1, v1).leak
    result = detect_leak(t, v)
    assert not result.leak and result.samples == t2.size


def test_leak_after_a_restart_is_timed_from_the_restart():
    t1, v1 = series(90, rate_mib_h=3000, seed=8)
    t2, v2 = series(60, rate_mib_h=3000, seed=9)
    start = t1[-1] + 120
    t = np.concatenate([t1, t1[-1] + np.arange(1, 8) * 15.0, start + t2])
    v = np.concatenate([v1, np.zeros(7), v2])
    result = detect_leak(t, v)
    assert result.leak and result.samples == t2.size
    assert result.onset_t_seconds is not None and result.onset_t_seconds >= start


def test_zeros_followed_by_the_same_level_are_dropouts_not_restarts():
    t, v = series(120, rate_mib_h=500, seed=10)
    dropped = v.copy()
    dropped[200:206] = 0  # a minute and a half of failed reads mid-leak
    result = detect_leak(t, dropped)
    assert result.leak and result.samples == t.size - 6


def test_leading_and_trailing_zeros_are_ignored():
    t, v = series(120, rate_mib_h=500, seed=11)
    padded = np.concatenate([np.zeros(10), v, np.zeros(3)])
    times = np.arange(padded.size) * 15.0
    result = detect_leak(times, padded)
    assert result.leak and result.samples == v.size


# --- properties ------------------------------------------------------------------------


@PROPERTIES
@given(
    seed=st.integers(0, 10_000),
    rate=st.sampled_from([0.0, 400.0, 2000.0]),
    k=st.sampled_from([2, 4, 8]),
)
def test_scaling_the_bytes_scales_the_growth(seed, rate, k):
    t, v = series(120, rate_mib_h=rate, saw_gib=2, noise_mib=32, seed=seed)
    base = detect_leak(t, v)
    scaled = detect_leak(t, v * k, min_growth_bytes_per_hour=200 * MIB * k)
    same_verdict(base, scaled, scale=k)


@PROPERTIES
@given(
    seed=st.integers(0, 10_000),
    rate=st.sampled_from([0.0, 400.0, 2000.0]),
    offset_gib=st.integers(1, 40),
)
def test_an_offset_changes_nothing(seed, rate, offset_gib):
    t, v = series(120, rate_mib_h=rate, saw_gib=2, seed=seed)
    same_verdict(detect_leak(t, v), detect_leak(t, v + offset_gib * GIB))


@PROPERTIES
@given(
    seed=st.integers(0, 10_000),
    rate=st.sampled_from([0.0, 400.0, 2000.0]),
    shift=st.integers(1, 10**7),
)
def test_the_clock_s_origin_changes_nothing_but_the_onset(seed, rate, shift):
    t, v = series(120, rate_mib_h=rate, onset_min=30, seed=seed)
    a, b = detect_leak(t, v), detect_leak(t + shift, v)
    same_verdict(a, b)
    if a.onset_t_seconds is not None:
        assert b.onset_t_seconds == pytest.approx(a.onset_t_seconds + shift)


@PROPERTIES
@given(
    seed=st.integers(0, 10_000),
    minutes=st.integers(30, 300),
    dt=st.sampled_from([5.0, 15.0, 30.0, 60.0]),
    saw=st.floats(0, 10),
    spikes=st.floats(0, 0.05),
    spike_gib=st.floats(0.5, 20),
    dropouts=st.floats(0, 0.05),
)
def test_outliers_and_dropouts_never_make_a_flat_series_leak(
    seed, minutes, dt, saw, spikes, spike_gib, dropouts
):
    t, v = series(minutes, dt=dt, saw_gib=saw, seed=seed)
    rng = np.random.default_rng(seed + 1)
    v = v + (rng.uniform(size=v.size) < spikes) * spike_gib * GIB
    v[rng.uniform(size=v.size) < dropouts] = 0
    assert not detect_leak(t, v).leak


@PROPERTIES
@given(seed=st.integers(0, 10_000), dropouts=st.floats(0, 0.05), spikes=st.floats(0, 0.03))
def test_outliers_and_dropouts_do_not_hide_a_leak(seed, dropouts, spikes):
    t, v = series(120, rate_mib_h=1000, saw_gib=2, seed=seed)
    rng = np.random.default_rng(seed + 1)
    v = v + (rng.uniform(size=v.size) < spikes) * 10 * GIB
    v[rng.uniform(size=v.size) < dropouts] = 0
    result = detect_leak(t, v)
    assert result.leak
    assert result.growth_bytes_per_hour == pytest.approx(1000 * MIB, rel=0.2)


# --- the fast path: evidence before minWindow -------------------------------------------


def flat_then(minutes_flat: float, minutes: float, shape, *, dt: float = 10.0, seed: int = 0):
    """A flat training loop (a 2 GiB sawtooth sampled at random phases, 8 MiB of noise)
    for ``minutes_flat``, then ``shape(seconds since) -> bytes`` added for ``minutes``."""
    t, v = series(minutes_flat + minutes, dt=dt, saw_gib=2, seed=seed)
    return t, v + np.rint(shape(np.maximum(t - minutes_flat * MINUTE, 0.0)) / MIB) * MIB


def first_leak(t, v, after_s: float, **thresholds) -> float | None:
    """Minutes after ``after_s`` at which a prefix is first called a leak (every minute)."""
    for end in np.arange(after_s + MINUTE, t[-1] + 1, MINUTE):
        if detect_leak(*prefix(t, v, end), **thresholds).leak:
            return (end - after_s) / MINUTE
    return None


def prefix(t, v, end):
    n = int(np.searchsorted(t, end, side="right"))
    return t[:n], v[:n]


def test_a_fast_clean_leak_after_a_flat_floor_is_called_within_minutes():
    t, v = flat_then(60, 40, lambda s: 6 * GIB * s / HOUR)
    found = first_leak(t, v, 60 * MINUTE)
    assert found is not None and 7 <= found <= 12  # minEvidence (7m) on, far before minWindow (30m)
    result = detect_leak(*prefix(t, v, (60 + found) * MINUTE))
    assert result.growth_bytes_per_hour == pytest.approx(6 * GIB, rel=0.2)
    assert result.evidence_seconds is not None and result.evidence_seconds >= 7 * MINUTE
    assert result.onset_t_seconds == pytest.approx(60 * MINUTE, abs=2 * MINUTE)


def test_min_evidence_bounds_the_fast_path_and_at_min_window_turns_it_off():
    t, v = flat_then(60, 40, lambda s: 6 * GIB * s / HOUR)
    assert first_leak(t, v, 60 * MINUTE, min_evidence_seconds=15 * MINUTE) >= 15
    late = first_leak(t, v, 60 * MINUTE, min_evidence_seconds=30 * MINUTE)
    assert late is not None and late >= 30  # the slow path alone


def test_a_slow_leak_needs_longer_than_a_fast_one():
    # 300 MiB/h: its lower bound reaches 200 MiB/h only after a long rise.
    slow_t, slow_v = flat_then(60, 60, lambda s: 300 * MIB * s / HOUR)
    fast_t, fast_v = flat_then(60, 60, lambda s: 3 * GIB * s / HOUR)
    slow, fast = first_leak(slow_t, slow_v, 60 * MINUTE), first_leak(fast_t, fast_v, 60 * MINUTE)
    assert slow is not None and fast is not None and fast + 5 <= slow <= 45


def started(t, v, load_s: float = 90.0):
    """The series as a process that loads its model over ``load_s`` from t = 0."""
    return t, np.rint(v * np.clip(t / load_s, 0.0, 1.0) / MIB) * MIB


def test_the_same_fast_leak_from_the_process_start_waits_for_min_window():
    # No flat floor before it: a warm-up or the first of a cycle's rises look the same.
    t, v = started(*flat_then(0, 60, lambda s: 6 * GIB * s / HOUR))
    found = first_leak(t, v, 0.0)
    assert found is not None and found >= 30
    # ...counted from the process's start: the slow path alone (the fast path off) waits
    # until its own onset, placed late by its 5-minute blocks, is minWindow behind.
    slow = first_leak(t, v, 0.0, min_evidence_seconds=30 * MINUTE)
    assert slow is not None and found < slow
    a = analyse(*prefix(t, v, found * MINUTE))
    assert a.fast is not None and a.fast.from_start


def test_a_cycle_that_starts_with_the_process_and_turns_is_no_leak():
    # Buffers gathered at 6 GiB/h for 26 minutes from the start, then freed: for those
    # 26 minutes the same rise as the leak above; a leak only had it outlasted START_SECONDS.
    t, v = started(*flat_then(0, 100, lambda s: 6 * GIB * np.mod(s, 26 * MINUTE) / HOUR))
    assert first_leak(t, v, 0.0) is None


def two_lives(first_rate: float, rate: float, first_minutes: float = 40.0, minutes: float = 45.0):
    """A process that loads and grows at ``first_rate`` (bytes per hour) for
    ``first_minutes``, is down for 2 minutes (zeros) and starts again, growing at
    ``rate`` from its load; times in seconds, and the second start's."""
    t1, v1 = started(*flat_then(0, first_minutes, lambda s: first_rate * s / HOUR, seed=1))
    t2, v2 = started(*flat_then(0, minutes, lambda s: rate * s / HOUR, seed=2))
    restart = t1[-1] + 2 * MINUTE
    down = np.arange(t1[-1] + 10.0, restart, 10.0)
    return (np.concatenate((t1, down, t2 + restart)), np.concatenate((v1, np.zeros(down.size), v2)), restart)


def test_a_leak_after_a_restart_from_a_leak_need_not_wait_for_a_cycle():
    # The life before ended on a structural rise (an OOM): this workload leaks, and the
    # new life's rise from its start is called once it is measured, not after START_SECONDS.
    t, v, restart = two_lives(6 * GIB, 6 * GIB)
    assert fit_rise(*current_segment(*prefix(t, v, restart - MINUTE))).structural
    after_leak = first_leak(t, v, restart)
    assert after_leak is not None and after_leak < 25
    # After a life whose floor held flat (a rollout), the same rise waits as any rise
    # from the process's start does.
    t, v, restart = two_lives(0.0, 6 * GIB)
    after_flat = first_leak(t, v, restart)
    assert after_flat is not None and after_flat >= 30
    # A life shorter than START_SECONDS may have died in a warm-up or a cycle's first
    # rise (a crash loop, a rollout): it proves nothing either.
    t, v, restart = two_lives(6 * GIB, 6 * GIB, first_minutes=20)
    after_short = first_leak(t, v, restart)
    assert after_short is not None and after_short >= 30


def test_a_rise_after_a_short_hold_is_not_one_from_the_process_start():
    # Flat for 9 minutes from the start (5 after the load and a block), then the leak: too
    # short a baseline for the fast path, and not a rise from the start either.
    t, v = started(*flat_then(9, 40, lambda s: 6 * GIB * s / HOUR))
    for minutes in (31, 35):
        evidence = analyse(*prefix(t, v, minutes * MINUTE)).evidence
        assert evidence is None or not evidence.from_start


@pytest.mark.parametrize("tau_s", [60.0, 120.0, 180.0])
def test_a_cache_that_fills_up_and_stops_is_no_leak(tau_s):
    t, v = flat_then(60, 60, lambda s: 4 * GIB * (1 - np.exp(-s / tau_s)))
    assert first_leak(t, v, 60 * MINUTE) is None


def test_a_step_up_is_no_leak():
    t, v = flat_then(60, 60, lambda s: np.where(s > 0, 3 * GIB, 0.0))
    assert first_leak(t, v, 60 * MINUTE) is None


@pytest.mark.parametrize("apart_min", [20.0, 25.0, 30.0])
def test_two_step_ups_that_stop_are_no_leak(apart_min):
    # Two steps of 2.5 GiB: on 5-minute blocks a rise of two steps reads as a ramp
    # until a staircase of three levels is weighed against the line.
    def steps(s):
        return np.where(s > 0, 2.5 * GIB, 0.0) + np.where(s > apart_min * MINUTE, 2.5 * GIB, 0.0)

    t, v = flat_then(60, 90, steps)
    assert first_leak(t, v, 60 * MINUTE) is None


def test_stairs_of_many_steps_are_still_a_leak_to_the_slow_path():
    # 250 MiB kept every 6 minutes (2.5 GiB/h): stairs, but many more than two steps.
    t, v = flat_then(60, 60, lambda s: 250 * MIB * np.floor(s / (6 * MINUTE)))
    found = first_leak(t, v, 60 * MINUTE, min_evidence_seconds=30 * MINUTE)  # the slow path alone
    assert found is not None and found <= 45
    ft, fv = analyse(*prefix(t, v, (60 + found) * MINUTE)).floor
    rising = ft >= 60 * MINUTE
    assert staircase_ratio(ft[rising], fv[rising]) >= TUNING.steps_ratio
    step_t = np.arange(0.0, 3600.0, 300.0)
    assert staircase_ratio(step_t, np.where(step_t > 1000, 1.0, 0.0) + np.where(step_t > 2500, 1.0, 0.0)) < 0.01


def test_a_rise_out_of_a_trough_is_not_called_early():
    # Falling for 15 minutes, then rising at the same pace: a load cycle, not a flat floor.
    t, v = flat_then(40, 40, lambda s: 4 * GIB * np.abs(s - 15 * MINUTE) / HOUR - 1 * GIB)
    found = first_leak(t, v, 55 * MINUTE)
    assert found is None or found >= 25


def test_counts_must_match_the_times():
    t, v = series(60)
    with pytest.raises(ValueError, match="counts"):
        analyse(t, v, np.ones(t.size - 1))
    with pytest.raises(ValueError, match="counts"):
        analyse(t, v, np.zeros(t.size))


def test_too_short_to_judge_depends_on_the_noise():
    quiet_t, quiet_v = series(6, noise_mib=2)
    noisy_t, noisy_v = series(6, saw_gib=8)
    quiet, noisy = needed_seconds(analyse(quiet_t, quiet_v)), needed_seconds(analyse(noisy_t, noisy_v))
    assert 7 * MINUTE < quiet < noisy <= 30 * MINUTE


# --- the same verdict from a node report ------------------------------------------------

THRESHOLDS = (
    (200 * MIB, 1800.0, 420.0),
    (1 * GIB, 1800.0, 420.0),
    (100 * MIB, 2700.0, 600.0),
    (200 * MIB, 1800.0, 1800.0),  # the fast path off
    (200 * MIB, 3600.0, 300.0),
)


@pytest.mark.parametrize("name", names(leak=True)[::3] + names(leak=False)[::4])
def test_trend_verdict_agrees_with_detect_leak(name):
    tr = trace(name)
    for end in np.arange(1800.0, min(tr.t[-1], 4 * HOUR), 10 * MINUTE):
        t, v = tr.prefix(end)
        t, v = t[t > end - 2 * HOUR], v[t > end - 2 * HOUR]  # the agent keeps two hours
        trend = compute_trend(t.tolist(), v.tolist())
        for growth, window, evidence in THRESHOLDS:
            th = {"min_growth_bytes_per_hour": growth, "min_window_seconds": window, "min_evidence_seconds": evidence}
            direct = detect_leak(t, v, **th)
            assert (trend_verdict(trend, **th) is not None) == direct.leak
            if direct.leak:  # the growth the verdict rests on, as the operator shows and projects it
                assert verdict_growth(trend, trend_verdict(trend, **th))[0] == pytest.approx(direct.growth_bytes_per_hour)
        default = detect_leak(t, v)
        assert trend.leak == default.leak
        if trend.onset_seconds is not None:
            assert trend.rise_seconds is not None and 0 <= trend.rise_seconds <= trend.onset_seconds
        if trend.evidence_seconds is not None:
            assert trend.evidence_growth_low_bytes_per_hour is not None
