"""Bounded per-pod VRAM history and its trend features.

Each pod keeps at most ``max_points`` points covering at most ``window_s``
seconds. Points are coalesced into buckets of ``window_s / max_points`` seconds
keeping the bucket's minimum: the trend features are computed on the lower
envelope anyway (``vramguard_api.trend.compute_trend``), so the minimum is the
part of a bucket that matters, and memory stays bounded whatever the sampling
interval. Histories of pods not seen for a whole window are dropped.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable

from vramguard_api.trend import TrendFeatures, compute_trend

DEFAULT_WINDOW_S = 2 * 3600.0
DEFAULT_MAX_POINTS = 120  # one point per minute over the default window
# The leak detector reads the floor in 5-minute blocks: fresher features add little.
DEFAULT_TREND_INTERVAL_S = 300.0


class PodHistory:
    """One pod's VRAM series: times (seconds) and values (bytes), oldest first."""

    __slots__ = ("times", "values", "_bucket_s", "_window_s", "_max_points")

    def __init__(self, window_s: float, max_points: int) -> None:
        self.times: array[float] = array("d")
        self.values: array[float] = array("d")
        self._window_s = window_s
        self._max_points = max_points
        self._bucket_s = window_s / max_points

    def add(self, t: float, value: float) -> None:
        """Add a sample at time ``t`` (seconds, not decreasing) of ``value`` bytes."""
        if self.times and t - self.times[-1] < self._bucket_s and self._bucket_of(t) == self._bucket_of(self.times[-1]):
            # Same bucket: keep its minimum (time of the latest sample).
            self.values[-1] = min(self.values[-1], value)
            self.times[-1] = t
        else:
            self.times.append(t)
            self.values.append(value)
        self._trim(t)

    def _bucket_of(self, t: float) -> int:
        return int(t // self._bucket_s)

    def _trim(self, now: float) -> None:
        drop = 0
        while drop < len(self.times) and (
            now - self.times[drop] > self._window_s or len(self.times) - drop > self._max_points
        ):
            drop += 1
        if drop:
            del self.times[:drop]
            del self.values[:drop]

    def __len__(self) -> int:
        return len(self.times)


class HistoryStore:
    """Histories of every pod, and their trend features, recomputed every
    ``trend_interval_s`` seconds per pod (Theil–Sen is quadratic in the number
    of points, so it is not run on every sample). Pods' recomputations are
    spread over the interval, so that pods that appeared together do not all
    recompute in the same sample."""

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        max_points: int = DEFAULT_MAX_POINTS,
        trend_interval_s: float = DEFAULT_TREND_INTERVAL_S,
        max_pods: int = 1024,
    ) -> None:
        if window_s <= 0 or max_points < 3:
            raise ValueError(f"history: window_s must be > 0 and max_points >= 3, got {window_s}, {max_points}")
        self.window_s = window_s
        self.max_points = max_points
        self.trend_interval_s = trend_interval_s
        self.max_pods = max_pods
        self._histories: dict[str, PodHistory] = {}
        self._last_seen: dict[str, float] = {}
        self._trends: dict[str, tuple[float, TrendFeatures]] = {}

    def add(self, t: float, values: dict[str, int | None]) -> None:
        """Record one sample: pod uid → VRAM bytes (None when unknown: not recorded)."""
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
        """The pod's trend features (cached for ``trend_interval_s``), None without history."""
        history = self._histories.get(uid)
        if history is None or not len(history):
            return None
        cached = self._trends.get(uid)
        if cached is not None and now - cached[0] < self.trend_interval_s:
            return cached[1]
        features = compute_trend(list(history.times), list(history.values))
        # The first computation is back-dated by a per-pod offset: refreshes spread out.
        offset = (zlib.crc32(uid.encode()) % 1000) / 1000 * self.trend_interval_s if cached is None else 0.0
        self._trends[uid] = (now - offset, features)
        return features

    def trends(self, uids: Iterable[str], now: float) -> dict[str, TrendFeatures]:
        """Trend features of each pod in ``uids`` that has a history."""
        result: dict[str, TrendFeatures] = {}
        for uid in uids:
            features = self.trend(uid, now)
            if features is not None:
                result[uid] = features
        return result

    def __len__(self) -> int:
        return len(self._histories)
