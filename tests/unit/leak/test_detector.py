"""detect_leak on synthetic series: properties (hypothesis) and behaviour at the edges."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramguard_api.leak import (
    LeakResult,
    current_segment,
    detect_leak,
    fit_rise,
    leak_from_trend,
    seconds_to_limit,
    validate_series,
)
from vramguard_api.trend import compute_trend

from .corpus import names, trace

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
    assert not detect_leak(short_t, short_v).leak  # 20 minutes is not 30


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


# --- the same verdict from a node report ------------------------------------------------


@pytest.mark.parametrize("name", names(leak=True)[::3] + names(leak=False)[::4])
def test_leak_from_trend_agrees_with_detect_leak(name):
    tr = trace(name)
    for end in np.arange(1800.0, min(tr.t[-1], 4 * HOUR), 20 * MINUTE):
        t, v = tr.prefix(end)
        t, v = t[t > end - 2 * HOUR], v[t > end - 2 * HOUR]  # the agent keeps two hours
        trend = compute_trend(t.tolist(), v.tolist())
        for growth, window in ((200 * MIB, 1800.0), (1 * GIB, 1800.0), (100 * MIB, 2700.0)):
            direct = detect_leak(t, v, min_growth_bytes_per_hour=growth, min_window_seconds=window)
            assert (
                leak_from_trend(trend, min_growth_bytes_per_hour=growth, min_window_seconds=window)
                == direct.leak
            )
        default = detect_leak(t, v)
        assert trend.leak == default.leak
        # Too few samples since a restart: no figures in the report, zero from detect_leak.
        assert (trend.growth_bytes_per_hour or 0.0) == pytest.approx(default.growth_bytes_per_hour)
        if trend.onset_seconds is not None:
            assert trend.rise_seconds is not None and 0 <= trend.rise_seconds <= trend.onset_seconds
