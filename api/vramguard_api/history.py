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

Trend features are recomputed at most every ``trend_interval_s`` seconds per
pod (Theil–Sen is quadratic in the number of points); between refreshes a pod's
features are the last ones computed. A pod's first computation is back-dated by
an offset derived from its uid (CRC-32, a fraction of the interval), so that
pods that appeared together refresh at different samples. The schedule depends
only on the sample times and the uid, so a replay of the same series with the
same uid refreshes at the same samples as the agent did.

Pure: no I/O, no clock (times are passed in), no NVML, no Kubernetes.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Mapping

from .trend import TrendFeatures, compute_trend

DEFAULT_WINDOW_S = 2 * 3600.0
DEFAULT_MAX_POINTS = 120  # one point per minute over the default window
# The leak detector reads the floor in 5-minute blocks: fresher features add little.
DEFAULT_TREND_INTERVAL_S = 300.0
DEFAULT_MAX_PODS = 1024


class PodHistory:
    """One pod's VRAM series: ``times`` (seconds) and ``values`` (bytes), oldest
    first, at most ``max_points`` long and ``window_s`` wide."""

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
    """Histories of every pod (keyed by pod uid) and their trend features on the
    schedule described in the module docstring.

    ``window_s`` (seconds, > 0) and ``max_points`` (>= 3) bound each history;
    ``trend_interval_s`` (seconds, >= 0; 0 recomputes on every call) is the
    refresh interval; at most ``max_pods`` histories are kept (a pod beyond
    that gets none until others are forgotten). Raises ``ValueError`` naming
    the setting and its value when one is out of range.
    """

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        max_points: int = DEFAULT_MAX_POINTS,
        trend_interval_s: float = DEFAULT_TREND_INTERVAL_S,
        max_pods: int = DEFAULT_MAX_PODS,
    ) -> None:
        if window_s <= 0 or max_points < 3:
            raise ValueError(f"history: window_s must be > 0 and max_points >= 3, got {window_s}, {max_points}")
        if trend_interval_s < 0:
            raise ValueError(f"history: trend_interval_s must be >= 0, got {trend_interval_s}")
        self.window_s = window_s
        self.max_points = max_points
        self.trend_interval_s = trend_interval_s
        self.max_pods = max_pods
        self._histories: dict[str, PodHistory] = {}
        self._last_seen: dict[str, float] = {}
        self._trends: dict[str, tuple[float, TrendFeatures]] = {}

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
        """The pod's trend features at time ``now`` (seconds): recomputed when the
        last computation is ``trend_interval_s`` old, else the cached ones; None
        without history. Raises ``ValueError`` as ``compute_trend`` does."""
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
        """Trend features (``trend``) of each pod in ``uids`` that has a history."""
        result: dict[str, TrendFeatures] = {}
        for uid in uids:
            features = self.trend(uid, now)
            if features is not None:
                result[uid] = features
        return result

    def __len__(self) -> int:
        return len(self._histories)
