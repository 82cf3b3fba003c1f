"""Bounded per-pod history and its trend schedule (vramguard_api.history), shared by
the agent, `vramguard replay` and the leak benchmark."""

from __future__ import annotations

import numpy as np
import pytest

from vramguard_api.history import HistoryStore, PodHistory

MIB = 1 << 20
GIB = 1 << 30


def test_history_is_bounded_in_points_and_time():
    h = PodHistory(window_s=100.0, max_points=10)  # buckets of 10 s
    for t in range(0, 1000, 10):
        h.add(float(t), float(t))
    assert len(h) == 10
    assert h.times[-1] == 990.0 and h.times[0] >= 990.0 - 100.0


def test_samples_in_one_bucket_keep_the_minimum():
    h = PodHistory(window_s=100.0, max_points=10)
    for t, v in [(0.0, 5.0), (3.0, 2.0), (6.0, 9.0), (12.0, 7.0)]:
        h.add(t, v)
    assert list(h.values) == [2.0, 7.0]
    assert list(h.times) == [6.0, 12.0]


def test_unknown_values_are_not_recorded_and_stale_pods_forgotten():
    store = HistoryStore(window_s=60.0, max_points=6)
    store.add(0.0, {"a": GIB, "b": None})
    assert store.trend("b", 0.0) is None and store.trend("a", 0.0).samples == 1
    store.add(30.0, {"b": GIB})
    store.add(61.0, {"b": GIB})
    assert store.trend("a", 61.0) is None  # not seen for a whole window
    assert len(store) == 1


def test_pod_count_is_bounded():
    store = HistoryStore(window_s=60.0, max_points=6, max_pods=2)
    store.add(0.0, {"a": 1, "b": 2, "c": 3})
    assert len(store) == 2


def test_leak_shows_as_growth_and_a_rising_floor():
    store = HistoryStore(window_s=3600.0, max_points=120, trend_interval_s=0.0)
    rate = 2 * GIB  # per hour, under a 512 MiB sawtooth
    for t in range(0, 3600, 10):
        saw = (t % 120) / 120 * 512 * MIB
        store.add(float(t), {"leaky": int(8 * GIB + rate * t / 3600 + saw), "flat": int(8 * GIB + saw)})
    leaky, flat = store.trend("leaky", 3590.0), store.trend("flat", 3590.0)
    assert leaky.growth_bytes_per_hour == pytest.approx(rate, rel=0.1)
    assert leaky.floor_rise_bytes > GIB
    assert abs(flat.growth_bytes_per_hour) < 64 * MIB
    assert leaky.window_seconds >= 3500 and leaky.samples <= 120


def test_trend_is_recomputed_only_after_the_interval():
    store = HistoryStore(window_s=600.0, max_points=60, trend_interval_s=60.0)
    for t in range(0, 100, 10):
        store.add(float(t), {"p": t * MIB})
    first = store.trend("p", 100.0)
    store.add(110.0, {"p": 500 * MIB})
    assert store.trend("p", 130.0) is first
    assert store.trend("p", 161.0) is not first


def test_first_refreshes_are_spread_over_the_interval():
    store = HistoryStore(window_s=600.0, max_points=60, trend_interval_s=100.0, max_refreshes=50)
    uids = [f"pod-{i}" for i in range(50)]
    store.add(0.0, dict.fromkeys(uids, GIB))
    first = store.trends(uids, 0.0)
    refreshed_at = {}
    for t in range(1, 101):
        store.add(float(t), dict.fromkeys(uids, GIB))
        for uid in uids:
            if uid not in refreshed_at and store.trend(uid, float(t)) is not first[uid]:
                refreshed_at[uid] = t
    assert len(refreshed_at) == 50 and max(refreshed_at.values()) <= 100
    assert len(set(refreshed_at.values())) > 10  # not all in the same sample


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="max_points"):
        HistoryStore(window_s=60.0, max_points=2)
    with pytest.raises(ValueError, match="trend_interval_s must be >= 0, got -1"):
        HistoryStore(trend_interval_s=-1.0)


def test_points_count_their_samples():
    h = PodHistory(window_s=100.0, max_points=10)
    for t in (0.0, 3.0, 6.0, 12.0, 21.0):
        h.add(t, GIB)
    assert list(h.counts) == [3, 1, 1]


def refreshes_per_hour(store: HistoryStore, uid: str, value) -> list[float]:
    """Feed an hour of 10-s samples (``value(t)`` bytes) after an hour of flat; the
    times (s) at which the pod's features were recomputed in the second hour."""
    seen, last = [], None
    for t in range(0, 7200, 10):
        store.add(float(t), {uid: int(8 * GIB + (value(t - 3600) if t >= 3600 else 0))})
        features = store.trend(uid, float(t))
        if t >= 3600 and features is not last:
            seen.append(float(t))
        last = features
    return seen


def test_a_quiet_pod_is_refreshed_every_trend_interval():
    times = refreshes_per_hour(HistoryStore(), "quiet", lambda t: (t % 40) * MIB)
    assert 11 <= len(times) <= 13  # every 5 minutes


def test_a_rising_pod_is_watched_and_refreshed_every_minute():
    store = HistoryStore()
    times = refreshes_per_hour(store, "leaky", lambda t: 4 * GIB * t / 3600)
    gaps = np.diff(times)
    assert times[0] - 3600 <= 240  # the cheap check saw the floor rise within minutes
    assert np.median(gaps) <= 60 and len(times) >= 50
    assert store.trend("leaky", 7190.0).leak


def test_the_cheap_check_ignores_a_sawtooth_of_minutes():
    # A 4 GiB sawtooth with a 5-minute period moves a one-minute floor by GiBs.
    times = refreshes_per_hour(HistoryStore(), "saw", lambda t: (t % 300) / 300 * 4 * GIB)
    assert len(times) <= 14


def test_watch_interval_is_checked():
    with pytest.raises(ValueError, match="watch_interval_s must be >= 0, got -1"):
        HistoryStore(watch_interval_s=-1.0)
    assert HistoryStore(trend_interval_s=30.0).watch_interval_s == 30.0  # never slower than quiet pods


def test_refreshes_per_call_are_capped_oldest_first():
    store = HistoryStore(window_s=600.0, max_points=60, trend_interval_s=60.0, max_refreshes=3)
    uids = [f"pod-{i}" for i in range(7)]
    store.add(0.0, dict.fromkeys(uids, GIB))
    first = store.trends(uids, 0.0)
    assert len(first) == 3 and store.refreshes == 3  # the others have none yet
    second = store.trends(uids, 0.0)
    assert len(second) == 6 and store.refreshes == 6
    assert set(first) < set(second)
    with pytest.raises(ValueError, match="max_refreshes must be >= 1, got 0"):
        HistoryStore(max_refreshes=0)


def test_the_cap_does_not_bunch_refreshes_together():
    # 128 quiet pods appear at once: the cap spreads their first computations over
    # 22 samples, and afterwards they keep their staggered slots (about 4.3 per
    # 10-s sample) rather than falling due again 6 at a time.
    store = HistoryStore()
    uids = [f"pod-{i}" for i in range(128)]
    per_call = []
    for step in range(200):
        t = step * 10.0
        store.add(t, {uid: GIB + (step % 5) * MIB for uid in uids})
        before = store.refreshes
        store.trends(uids, t)
        per_call.append(store.refreshes - before)
    steady = per_call[100:]
    assert per_call[:21] == [6] * 21 and max(steady) <= 6
    assert np.median(steady) <= 5 and 3.5 <= np.mean(steady) <= 5.0
