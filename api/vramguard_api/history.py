"""Bounded per-pod VRAM history and its trend schedule: the one implementation
that the agent runs live, ``vramguard replay`` runs offline and the leak
benchmark measures, so that all three feed the leak rule the same features.

Each pod keeps at most ``max_points`` points covering at most ``window_s``
seconds. Points are coalesced into buckets of ``window_s / max_points`` seconds
(aligned on multiples of the bucket length from time 0) keeping the bucket's
minimum: the trend features are computed on the lower envelope anyway
(``vramguard_api.trend.compute_trend``), so the minimum is the part of a bucket
that matters, and memory stays bounded whatever the sampling interval.
Histories of pods not seen for a whole window are dropped.

Trend features are recomputed on a schedule per pod (Theil–Sen is quadratic in
the number of points); between refreshes a pod's features are the last ones
computed. The schedule adapts to what the pod does:

- a *quiet* pod is refreshed every ``trend_interval_s`` (5 minutes);
- a *watched* pod every ``watch_interval_s`` (1 minute, the history's
  resolution): one whose last features show a rise (a recent rise that
  qualifies for the fast path, a structural rise, a leak) or a growth whose
  lower bound is above zero and whose rate is at least
  ``WATCH_GROWTH_BYTES_PER_HOUR``, or whose floor of the last 5 minutes stands
  above its floor of 10 to 20 minutes ago (a rise the features may not show yet);
- between refreshes, a cheap check on every sample: when the floor of the last
  ``CHECK_POINTS`` history points has risen above the floor seen at the last
  refresh by ``CHECK_RISE_BYTES``, ``CHECK_RISE_FRACTION`` of it and the spread
  of the last ``CHECK_SPREAD_POINTS`` points then (whichever is most: a
  sawtooth of minutes moves a one-minute floor by its height), the pod is
  refreshed now (at most once per history bucket). A clean leak's first
  minutes are thus seen within a few minutes of its onset rather than up to five.

At most ``max_refreshes`` pods are recomputed per ``trends`` call (the agent's
tick), those due longest first: when many pods rise at once each is refreshed
less often, and the tick keeps its CPU budget.

A pod's first computation is back-dated to its own phase within the interval
(from its uid: CRC-32, a fraction of the interval), so that pods that appeared
together refresh at different samples; so is a refresh that the cap held back
for a whole interval. The schedule depends only on the sample times,
the values and the uid, so a replay of the same series with the same uid
refreshes at the same samples as the agent did.

Pure: no I/O, no clock (times are passed in), no NVML, no Kubernetes.
"""

from __future__ import annotations

import math
import zlib
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .trend import TrendFeatures, compute_trend

DEFAULT_WINDOW_S = 2 * 3600.0
DEFAULT_MAX_POINTS = 120  # one point per minute over the default window
# A quiet pod: the slow path reads the floor in 5-minute blocks, fresher features add little.
DEFAULT_TREND_INTERVAL_S = 300.0
# A watched pod: the fast path reads the 1-minute floor.
DEFAULT_WATCH_INTERVAL_S = 60.0
DEFAULT_MAX_PODS = 1024
# Trend computations per ``trends`` call (one agent tick): about 0.3-0.6 ms each
# on the development VM, so a tick's history step stays near 3 ms however many
# pods leak at once (docs/agent.md, the CPU budget).
DEFAULT_MAX_REFRESHES = 6
WATCH_GROWTH_BYTES_PER_HOUR = 100 * 2**20
"""Half the default minGrowthPerHour: growth near the threshold is watched."""
CHECK_POINTS = 3
CHECK_SPREAD_POINTS = 5
CHECK_RISE_BYTES = 64 * 2**20
CHECK_RISE_FRACTION = 0.01


class PodHistory:
    """One pod's VRAM series: ``times`` (seconds) and ``values`` (bytes), oldest
    first, at most ``max_points`` long and ``window_s`` wide; ``counts``: how many
    samples each point's bucket holds (the detector widens its blocks when few)."""

    __slots__ = ("times", "values", "counts", "bucket_s", "_window_s", "_max_points")

    def __init__(self, window_s: float, max_points: int) -> None:
        self.times: array[float] = array("d")
        self.values: array[float] = array("d")
        self.counts: array[int] = array("I")  # samples in each point's bucket
        self._window_s = window_s
        self._max_points = max_points
        self.bucket_s = window_s / max_points

    def add(self, t: float, value: float) -> None:
        """Add a sample at time ``t`` (seconds, not decreasing) of ``value`` bytes."""
        if self.times and t - self.times[-1] < self.bucket_s and self._bucket_of(t) == self._bucket_of(self.times[-1]):
            # Same bucket: keep its minimum (time of the latest sample).
            self.values[-1] = min(self.values[-1], value)
            self.times[-1] = t
            self.counts[-1] += 1
        else:
            self.times.append(t)
            self.values.append(value)
            self.counts.append(1)
        self._trim(t)

    def _bucket_of(self, t: float) -> int:
        return int(t // self.bucket_s)

    def _trim(self, now: float) -> None:
        drop = 0
        while drop < len(self.times) and (
            now - self.times[drop] > self._window_s or len(self.times) - drop > self._max_points
        ):
            drop += 1
        if drop:
            del self.times[:drop]
            del self.values[:drop]
            del self.counts[:drop]

    def __len__(self) -> int:
        return len(self.times)


@dataclass(frozen=True, slots=True)
class _Computed:
    """A pod's last trend features: when (seconds), what, the floor then and how much
    the last points spread about it (bytes), watched or not."""

    at: float
    features: TrendFeatures
    floor: float
    spread: float
    watched: bool


class HistoryStore:
    """Histories of every pod (keyed by pod uid) and their trend features on the
    schedule described in the module docstring.

    ``window_s`` (seconds, > 0) and ``max_points`` (>= 3) bound each history;
    ``trend_interval_s`` (seconds, >= 0; 0 recomputes on every call) is a quiet
    pod's refresh interval, ``watch_interval_s`` (seconds, >= 0, at most
    ``trend_interval_s``) a watched pod's; ``max_refreshes`` (>= 1) caps the
    recomputations per ``trends`` call; at most ``max_pods`` histories are
    kept (a pod beyond that gets none until others are forgotten). Raises
    ``ValueError`` naming the setting and its value when one is out of range.
    """

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        max_points: int = DEFAULT_MAX_POINTS,
        trend_interval_s: float = DEFAULT_TREND_INTERVAL_S,
        max_pods: int = DEFAULT_MAX_PODS,
        watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S,
        max_refreshes: int = DEFAULT_MAX_REFRESHES,
    ) -> None:
        if window_s <= 0 or max_points < 3:
            raise ValueError(f"history: window_s must be > 0 and max_points >= 3, got {window_s}, {max_points}")
        if trend_interval_s < 0:
            raise ValueError(f"history: trend_interval_s must be >= 0, got {trend_interval_s}")
        if watch_interval_s < 0:
            raise ValueError(f"history: watch_interval_s must be >= 0, got {watch_interval_s}")
        if max_refreshes < 1:
            raise ValueError(f"history: max_refreshes must be >= 1, got {max_refreshes}")
        self.window_s = window_s
        self.max_points = max_points
        self.trend_interval_s = trend_interval_s
        self.watch_interval_s = min(watch_interval_s, trend_interval_s)
        self.max_pods = max_pods
        self.max_refreshes = max_refreshes
        self._histories: dict[str, PodHistory] = {}
        self._last_seen: dict[str, float] = {}
        self._trends: dict[str, _Computed] = {}
        self.refreshes = 0  # trend computations so far (the agent benchmark counts them)

    def add(self, t: float, values: Mapping[str, int | None]) -> None:
        """Record one sample at time ``t`` (seconds, not decreasing): pod uid →
        VRAM bytes. None means unknown: the pod counts as seen, nothing is recorded."""
        for uid, value in values.items():
            self._last_seen[uid] = t
            if value is None:
                continue
            history = self._histories.get(uid)
            if history is None:
                if len(self._histories) >= self.max_pods:
                    continue
                history = self._histories[uid] = PodHistory(self.window_s, self.max_points)
            history.add(t, float(value))
        self._forget(t)

    def _forget(self, now: float) -> None:
        for uid in [u for u, seen in self._last_seen.items() if now - seen > self.window_s]:
            self._last_seen.pop(uid, None)
            self._histories.pop(uid, None)
            self._trends.pop(uid, None)

    def trend(self, uid: str, now: float) -> TrendFeatures | None:
        """The pod's trend features at time ``now`` (seconds): recomputed when due
        (module docstring), else the cached ones; None without history. Raises
        ``ValueError`` as ``compute_trend`` does."""
        history = self._histories.get(uid)
        if history is None or not len(history):
            return None
        cached = self._trends.get(uid)
        if cached is not None and not self._due(cached, history, now):
            return cached.features
        return self._refresh(uid, history, cached, now)

    def _refresh(self, uid: str, history: PodHistory, cached: _Computed | None, now: float) -> TrendFeatures:
        features = compute_trend(list(history.times), list(history.values), list(history.counts))
        self.refreshes += 1
        spread = max(history.values[-CHECK_SPREAD_POINTS:]) - min(history.values[-CHECK_SPREAD_POINTS:])
        watched = _watched(features) or _floor_rising(history)
        self._trends[uid] = _Computed(self._slot(uid, cached, now), features, _recent_floor(history), spread, watched)
        return features

    def _slot(self, uid: str, cached: _Computed | None, now: float) -> float:
        """When a refresh at ``now`` counts as made. A pod has its own phase within
        the interval (from its uid): its first refresh, and one that the cap on
        refreshes per call held back for a whole interval, count as made at the
        last time of that phase, so that pods that appeared together, or were held
        back together, fall due apart. One held back less keeps the time it was
        due. Any other (the cheap check's) counts as made ``now``."""
        interval = self.trend_interval_s
        if cached is not None:
            due = cached.at + (self.watch_interval_s if cached.watched else interval)
            if now < due:
                return now
            if now < due + interval:
                return due
        if interval <= 0:
            return now
        phase = (zlib.crc32(uid.encode()) % 1000) / 1000 * interval
        return now - (now - phase) % interval

    def _due(self, cached: _Computed, history: PodHistory, now: float) -> bool:
        age = now - cached.at
        if age >= (self.watch_interval_s if cached.watched else self.trend_interval_s):
            return True
        # The cheap check: has the floor risen since? At most once per history bucket.
        rise = _recent_floor(history) - cached.floor
        margin = max(CHECK_RISE_BYTES, CHECK_RISE_FRACTION * cached.floor, cached.spread)
        return age >= history.bucket_s and rise >= margin

    def trends(self, uids: Iterable[str], now: float) -> dict[str, TrendFeatures]:
        """Trend features (``trend``) of each pod in ``uids`` that has a history, with
        at most ``max_refreshes`` recomputations in this call (the agent calls it once
        per tick): the pods due longest are refreshed first, the others keep their
        last features (a new pod has none yet) and are due again next call."""
        result: dict[str, TrendFeatures] = {}
        due: list[tuple[float, str, PodHistory, _Computed | None]] = []
        for uid in uids:
            history = self._histories.get(uid)
            if history is None or not len(history):
                continue
            cached = self._trends.get(uid)
            if cached is not None and not self._due(cached, history, now):
                result[uid] = cached.features
            else:
                due.append((-math.inf if cached is None else cached.at, uid, history, cached))
        due.sort(key=lambda d: (d[0], d[1]))
        for i, (_, uid, history, cached) in enumerate(due):
            if i < self.max_refreshes:
                result[uid] = self._refresh(uid, history, cached, now)
            elif cached is not None:
                result[uid] = cached.features
        return result

    def __len__(self) -> int:
        return len(self._histories)


def _recent_floor(history: PodHistory) -> float:
    """The lowest of the last ``CHECK_POINTS`` points: the recent floor, in O(1)."""
    return min(history.values[-CHECK_POINTS:])


def _floor_rising(history: PodHistory) -> bool:
    """Whether the floor of the last ``CHECK_SPREAD_POINTS`` points is above the floor
    of the ten points before the five before them, by ``CHECK_RISE_BYTES`` and
    ``CHECK_RISE_FRACTION``: a rise the features may not show yet."""
    values = history.values
    if len(values) < 20:
        return False
    recent, before = min(values[-CHECK_SPREAD_POINTS:]), min(values[-20:-10])
    return recent - before >= max(CHECK_RISE_BYTES, CHECK_RISE_FRACTION * before)


def _watched(features: TrendFeatures) -> bool:
    """Whether features show a rise worth refreshing every minute (module docstring)."""
    if features.leak or features.evidence_seconds is not None or features.rise_seconds is not None:
        return True
    growth, low = features.growth_bytes_per_hour, features.growth_low_bytes_per_hour
    return growth is not None and low is not None and low > 0 and growth >= WATCH_GROWTH_BYTES_PER_HOUR
