"""Leak detection on one VRAM series: a rising floor told apart from a sawtooth.

Pure (numpy only) and shared by the agent (trend features in its node
report) and the operator (leak violations), so that both decide alike. The
method, its parameters and its measured figures are in docs/leak-detection.md.

Outline of :func:`detect_leak`:

1. **Zeros.** A sample near zero is a failed read or a dead process. A run of
   them is a *restart* when the memory after it is lower than before it (the
   leaked memory was freed); the series is cut there and only the last segment
   is judged. Otherwise the run is a *dropout* and is left out.
2. **Floor.** The segment is cut into blocks of ``BLOCK_SECONDS`` (counted back
   from the last sample); each block keeps its lowest sample, at the time it was
   seen. A training sawtooth, eval spikes and request bursts sit above their
   floor; a leak raises the floor itself. Floor points far above their
   neighbours (a block that missed the floor) are left out.
3. **Onset.** A hockey stick (flat, then rising linearly from an onset) is fitted
   to the floor by least squares over every candidate onset.
4. **Growth.** The Theil–Sen slope of the floor since the onset
   (``scipy.stats.theilslopes`` re-stated on numpy in ``robust.py``) with its 95% confidence interval.
5. **Decision.** The rise is *structural* when it is significant (lower bound
   at least ``MIN_LOW_RATIO`` of the growth, rise at least ``MIN_SNR`` times the
   floor's scatter), persists (each half climbs), is still climbing (its tail)
   and has lasted longer than any excursion the segment has already come back
   down from (a cycle's rising half is no leak). A structural rise is a leak when
   it has lasted ``min_window_seconds`` (to its last advance) and grows at
   ``min_growth_bytes_per_hour`` or more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .robust import median
from .robust import theil_sen as theilslopes  # scipy.stats.theilslopes without scipy: see robust.py

if TYPE_CHECKING:
    from .trend import TrendFeatures

MIB = 2**20
HOUR = 3600.0

Samples = Sequence[float] | np.ndarray
"""A series' times (seconds) or values (bytes): a sequence or a 1-D numpy array."""

DEFAULT_MIN_GROWTH_BYTES_PER_HOUR = 200 * MIB
DEFAULT_MIN_WINDOW_SECONDS = 1800.0

ZERO_FRACTION = 0.05
"""A sample at or below this fraction of the series' median (and at least
``ZERO_BYTES``) counts as zero: a failed read or no process."""
ZERO_BYTES = MIB
RESTART_WINDOW_SECONDS = 600.0
"""The memory before and after a run of zeros is compared over this long."""
RESTART_DROP_FRACTION = 0.05
"""A run of zeros is a restart when the lowest memory in the window after it is
below the lowest in the window before it by this fraction and ``RESTART_DROP_BYTES``."""
RESTART_DROP_BYTES = 64 * MIB

BLOCK_SECONDS = 300.0
"""Floor block: long enough to catch a training step's floor and to outlast an
eval spike, short enough to resolve the onset."""
MIN_BLOCK_SAMPLES = 5
"""Blocks widen to hold this many sampling intervals when sampling is sparse."""
OUTLIER_SIGMAS = 4.0
"""A floor point this many robust deviations above the line through its
neighbours missed the floor."""

MIN_RISE_POINTS = 4
CONFIDENCE = 0.95
MIN_LOW_RATIO = 0.25
"""The growth's lower confidence bound must be at least this fraction of the growth:
a rate that is measured, not a drift within the noise."""
MIN_SNR = 3.0
"""The rise (growth times duration) must be this many times the floor's robust
scatter about the Theil–Sen line."""
PERSISTENCE = 0.4
"""Each half of the rise must climb at this fraction of the whole rise's slope."""
TAIL_SECONDS = 600.0
TAIL_FRACTION = 0.25
TAIL_RATIO = 0.25
"""The tail of the rise (its last ``TAIL_SECONDS`` or ``TAIL_FRACTION``, whichever is
longer, with the point before) must climb at this fraction of the rise's slope."""
PLATEAU_GAIN = 0.3
"""A rise-then-plateau fit that lowers the squared error by this fraction ends the
rise at its bend."""


@dataclass(frozen=True)
class LeakResult:
    """The verdict on one VRAM series.

    ``growth_bytes_per_hour``: Theil–Sen slope of the floor in the current
    segment, since the rise's onset when the floor rises steadily;
    ``growth_low_bytes_per_hour``: its lower 95% confidence bound.
    ``onset_t_seconds`` (the input's clock) is set only for a leak.
    ``time_to_limit_seconds``: from the last sample until the recent peak, growing
    at ``growth_bytes_per_hour``, reaches the limit (0 when already there); None
    without a limit or without significant growth. ``samples``: usable samples in
    the current segment.
    """

    leak: bool
    growth_bytes_per_hour: float
    growth_low_bytes_per_hour: float
    onset_t_seconds: float | None
    time_to_limit_seconds: float | None
    samples: int


@dataclass(frozen=True)
class Rise:
    """The floor's rise in the current segment, which the decision is made from.

    The growth is measured since ``onset_t_seconds`` when the rise is structural,
    over the whole segment otherwise; ``rise_seconds`` runs from the onset to the
    rise's last advance; ``end_t_seconds`` is the last sample's time;
    ``peak_bytes`` the recent peak (for the projection to a limit).
    """

    growth_bytes_per_hour: float
    growth_low_bytes_per_hour: float
    onset_t_seconds: float
    end_t_seconds: float
    rise_seconds: float
    structural: bool
    samples: int
    peak_bytes: float


def detect_leak(
    times_s: Samples,
    values_bytes: Samples,
    *,
    limit_bytes: float | None = None,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
) -> LeakResult:
    """Say whether a VRAM series shows a leak, how fast it grows and when it hits a limit.

    ``times_s``: sample times in seconds, strictly increasing (any origin).
    ``values_bytes``: VRAM at those times in bytes, dropouts to zero included as
    they came; NaN marks a missing sample. ``limit_bytes``: optional limit to
    project to. A leak grows at ``min_growth_bytes_per_hour`` or more and has risen
    for ``min_window_seconds`` or more (see the module docstring for the rest).

    Raises ``ValueError`` naming the argument when the lengths differ, a time is
    not finite, the times do not increase, a value is negative or infinite, or a
    threshold is negative.
    """
    if min_growth_bytes_per_hour < 0 or min_window_seconds < 0:
        raise ValueError(
            f"min_growth_bytes_per_hour ({min_growth_bytes_per_hour}) and "
            f"min_window_seconds ({min_window_seconds}) must not be negative"
        )
    t, v = validate_series(times_s, values_bytes)
    st, sv = current_segment(t, v)
    rise = fit_rise(st, sv)
    if rise is None:
        return LeakResult(False, 0.0, 0.0, None, None, int(st.size))
    leak = is_leak(
        rise.structural,
        rise.rise_seconds,
        rise.growth_bytes_per_hour,
        min_growth_bytes_per_hour,
        min_window_seconds,
    )
    return LeakResult(
        leak=leak,
        growth_bytes_per_hour=rise.growth_bytes_per_hour,
        growth_low_bytes_per_hour=rise.growth_low_bytes_per_hour,
        onset_t_seconds=rise.onset_t_seconds if leak else None,
        time_to_limit_seconds=_time_to_limit(rise, limit_bytes),
        samples=rise.samples,
    )


def is_leak(
    structural: bool,
    rise_seconds: float,
    growth_bytes_per_hour: float,
    min_growth: float,
    min_window: float,
) -> bool:
    """The final decision, shared by :func:`detect_leak` and :func:`leak_from_trend`."""
    return structural and rise_seconds >= min_window and growth_bytes_per_hour >= min_growth


def leak_from_trend(
    trend: TrendFeatures,
    *,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
) -> bool:
    """Decide from a node report's trend features alone, with a budget's thresholds.

    Gives the verdict :func:`detect_leak` gives on the agent's history with the
    same thresholds: ``trend.rise_seconds`` (with ``onset_seconds``) is present
    only when the floor rises structurally, and says for how long it has. Features
    that carry only ``onset_seconds`` are judged on it (the rise cannot have
    lasted longer).
    """
    rise_seconds = trend.rise_seconds if trend.rise_seconds is not None else trend.onset_seconds
    if rise_seconds is None or trend.growth_bytes_per_hour is None:
        return False
    return is_leak(
        True,
        rise_seconds,
        trend.growth_bytes_per_hour,
        min_growth_bytes_per_hour,
        min_window_seconds,
    )


# --- input and segments ----------------------------------------------------------


def validate_series(times_s: Samples, values_bytes: Samples) -> tuple[np.ndarray, np.ndarray]:
    """Float arrays of the samples that have a value (NaN values dropped).

    Raises ``ValueError`` naming the argument and index of the first bad entry.
    """
    t = np.asarray(times_s, dtype=float)
    v = np.asarray(values_bytes, dtype=float)
    if t.ndim != 1 or v.ndim != 1 or t.size != v.size:
        raise ValueError(
            f"times_s and values_bytes must be 1-D and of one length: {t.shape} != {v.shape}"
        )
    if not np.all(np.isfinite(t)):
        i = int(np.flatnonzero(~np.isfinite(t))[0])
        raise ValueError(f"times_s[{i}] = {t[i]} is not finite")
    if t.size > 1 and not np.all(np.diff(t) > 0):
        i = int(np.flatnonzero(np.diff(t) <= 0)[0]) + 1
        raise ValueError(f"times_s must increase: times_s[{i}] = {t[i]} follows {t[i - 1]}")
    bad = np.isinf(v) | (v < 0)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"values_bytes[{i}] = {v[i]} is not a byte count")
    keep = ~np.isnan(v)
    return t[keep], v[keep]


def current_segment(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples since the last restart, with zeros (dropouts) left out.

    ``t`` increasing seconds, ``v`` bytes (no NaN). Leading zeros (the process had
    not started) are dropped; trailing zeros are dropped too, since whether they
    end in a restart is not yet known.
    """
    positive = v[v > 0]
    if positive.size == 0:
        return t[:0], v[:0]
    zero = v <= max(ZERO_BYTES, ZERO_FRACTION * median(positive))
    start = 0
    for run_start, run_end in _runs(zero):
        if run_start == 0 or (run_end < t.size and _is_restart(t, v, zero, run_start, run_end)):
            start = run_end
    keep = ~zero[start:]
    return t[start:][keep], v[start:][keep]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) index ranges of the True runs of ``mask``."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(
        zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True)
    )


def _is_restart(
    t: np.ndarray, v: np.ndarray, zero: np.ndarray, run_start: int, run_end: int
) -> bool:
    """Whether the memory after a zero run is lower than before it (the leaked memory was freed)."""
    lo = int(np.searchsorted(t, t[run_start] - RESTART_WINDOW_SECONDS))
    hi = int(np.searchsorted(t, t[run_end - 1] + RESTART_WINDOW_SECONDS, side="right"))
    before, after = v[lo:run_start][~zero[lo:run_start]], v[run_end:hi][~zero[run_end:hi]]
    if before.size == 0 or after.size == 0:
        return False
    floor_before, floor_after = float(before.min()), float(after.min())
    return floor_after < floor_before - max(
        RESTART_DROP_BYTES, RESTART_DROP_FRACTION * floor_before
    )


# --- floor ------------------------------------------------------------------------


def floor_points(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The segment's floor: the lowest sample per block, at the time it was seen.

    Blocks are ``BLOCK_SECONDS`` long (or ``MIN_BLOCK_SAMPLES`` sampling
    intervals when sampling is sparse), counted back from the last sample; the
    oldest block is dropped when it covers less than half a block, since its
    minimum over fewer samples would sit high. ``t`` increasing, ``v`` without
    NaN (``validate_series``'s output).
    """
    dt = median(np.diff(t)) if t.size > 1 else BLOCK_SECONDS
    width = max(BLOCK_SECONDS, MIN_BLOCK_SAMPLES * dt)
    block = np.floor((t[-1] - t) / width).astype(np.int64)
    starts = np.flatnonzero(np.diff(block, prepend=block[0] + 1))
    # The first lowest sample of each block, without a Python loop over blocks
    # (the agent computes this for every pod).
    lengths = np.diff(np.append(starts, t.size))
    hits = np.flatnonzero(v == np.repeat(np.minimum.reduceat(v, starts), lengths))
    idx = hits[np.diff(block[hits], prepend=block[0] + 1) != 0]
    if t[-1] - t[0] < (block[0] + 0.5) * width and idx.size > 1:
        idx = idx[1:]
    return t[idx], v[idx]


def _misread(fv: np.ndarray) -> np.ndarray:
    """Floor points that misread the floor.

    Interior points far above the line through their neighbours (a block that
    missed a sawtooth's floor, a spike covering a whole block); the last point
    far above the line through the two before it. A floor can only read too high,
    and only isolated points count: a run of high points is a level (a step). The
    first points may also read too low (the process was still loading its
    model) and are peeled off while they lie far from the line through the next two.
    """
    out = np.zeros(fv.size, dtype=bool)
    if fv.size < 4:
        return out
    d2 = fv[1:-1] - (fv[:-2] + fv[2:]) / 2
    scale = 1.4826 * median(np.abs(d2 - median(d2)))
    threshold = OUTLIER_SIGMAS * max(scale, median(np.abs(d2)), MIB)
    if abs(fv[0] - (2 * fv[1] - fv[2])) > 2 * threshold:
        out[0] = True
        out[1:] = _misread(fv[1:])
        return out
    out[1:-1] = d2 > threshold
    out[-1] = fv[-1] - (2 * fv[-2] - fv[-3]) > 2 * threshold
    return out


# --- rise -------------------------------------------------------------------------


def fit_rise(
    st: np.ndarray, sv: np.ndarray, floor: tuple[np.ndarray, np.ndarray] | None = None
) -> Rise | None:
    """Fit the floor of one segment (``current_segment``'s output); None when too short.

    ``floor`` is ``floor_points(st, sv)`` when the caller has it already."""
    if st.size < 3:
        return None
    ft, fv = floor if floor is not None else floor_points(st, sv)
    good = ~_misread(fv)
    ft, fv = ft[good], fv[good]
    if ft.size < 3:
        return None
    onset = _onset_index(ft, fv)
    rt, rv = ft[onset:], fv[onset:]
    slope, intercept, low, _ = theilslopes(rv, rt, alpha=CONFIDENCE)
    rise_seconds = _rise_end(rt, rv) - rt[0]
    structural = (
        rt.size >= MIN_RISE_POINTS
        and low >= MIN_LOW_RATIO * slope > 0
        and slope * rise_seconds >= MIN_SNR * _scatter(rv - (intercept + slope * rt))
        and _persists(rt, rv, slope)
        and _still_rising(rt, rv, slope)
        and rise_seconds > _longest_excursion(ft, fv)
    )
    if not structural:  # no rise to measure from: the growth over the whole segment
        slope, _, low, _ = theilslopes(fv, ft, alpha=CONFIDENCE)
    recent = sv[st >= st[-1] - BLOCK_SECONDS]
    return Rise(
        growth_bytes_per_hour=float(slope) * HOUR,
        growth_low_bytes_per_hour=float(low) * HOUR,
        onset_t_seconds=float(rt[0]),
        end_t_seconds=float(st[-1]),
        rise_seconds=float(rise_seconds),
        structural=bool(structural),
        samples=int(st.size),
        peak_bytes=median(np.sort(recent)[-3:]),
    )


def _scatter(resid: np.ndarray) -> float:
    """Robust standard deviation (1.4826 × MAD), at least 1 MiB."""
    return max(1.4826 * median(np.abs(resid - median(resid))), MIB)


def _onset_index(ft: np.ndarray, fv: np.ndarray) -> int:
    """Index of the floor point where a flat-then-rising fit bends.

    Least squares of ``a + r * max(0, t - t_j)`` for every candidate ``t_j`` that
    leaves ``MIN_RISE_POINTS`` after it (closed form, all candidates at once).
    """
    last = max(1, ft.size - MIN_RISE_POINTS + 1)
    g = np.maximum(ft[None, :] - ft[:last, None], 0.0)  # (candidates, points)
    return int(np.argmin(_line_sse(g, fv)))


def _line_sse(g: np.ndarray, fv: np.ndarray) -> np.ndarray:
    """Squared error of the least-squares fit ``fv ≈ a + r * g[k]`` for each row k."""
    dg = g - g.mean(axis=1)[:, None]
    dv = fv - fv.mean()
    sgg = (dg * dg).sum(axis=1)
    r = np.divide((dg * dv).sum(axis=1), sgg, out=np.zeros(sgg.size), where=sgg > 0)
    return ((dv[None, :] - r[:, None] * dg) ** 2).sum(axis=1)


def _rise_end(rt: np.ndarray, rv: np.ndarray) -> float:
    """When the rise last advanced: the bend of a rise-then-plateau fit, or the last point.

    The plateau fit (least squares, bend at each candidate point) replaces the
    straight rise only when it lowers the squared error by ``PLATEAU_GAIN`` or
    more: a cycle's top or a warm-up's plateau bends clearly, a noisy leak does not.
    """
    if rt.size < MIN_RISE_POINTS + 1:
        return float(rt[-1])
    bends = rt[MIN_RISE_POINTS - 1 :]
    g = np.minimum(rt[None, :], bends[:, None]) - rt[0]  # the last row is a straight line
    sse = _line_sse(g, rv)
    best = int(np.argmin(sse))
    return float(bends[best]) if sse[best] <= (1 - PLATEAU_GAIN) * sse[-1] else float(rt[-1])


def _persists(rt: np.ndarray, rv: np.ndarray, slope: float) -> bool:
    """Whether both halves of the rise climb (not one step, nor a rise that stopped)."""
    middle = (rt[0] + rt[-1]) / 2
    return _climbs(rt[rt <= middle], rv[rt <= middle], slope) and _climbs(
        rt[rt >= middle], rv[rt >= middle], slope
    )


def _still_rising(rt: np.ndarray, rv: np.ndarray, slope: float) -> bool:
    """Whether the tail of the rise (its last ``TAIL_SECONDS`` or ``TAIL_FRACTION``,
    whichever is longer, and the point before) climbs.

    A cycle's top, a warm-up's plateau and the level after a step stop climbing;
    a leak's floor keeps climbing, and stairs step again within minutes.
    """
    tail = max(TAIL_SECONDS, TAIL_FRACTION * (rt[-1] - rt[0]))
    first = max(0, int(np.searchsorted(rt, rt[-1] - tail)) - 1)
    return _climbs(rt[first:], rv[first:], slope, TAIL_RATIO)


def _climbs(pt: np.ndarray, pv: np.ndarray, slope: float, ratio: float = PERSISTENCE) -> bool:
    """Whether a part of the rise climbs: at ``ratio`` of the rise's slope, or (with
    ``MIN_RISE_POINTS`` points) significantly above zero, as a leak that slows
    down between bursts of traffic still does."""
    if pt.size < 2:
        return False
    part_slope, _, part_low, _ = theilslopes(pv, pt, alpha=CONFIDENCE)
    return bool(part_slope >= ratio * slope or (pt.size >= MIN_RISE_POINTS and part_low > 0))


def _longest_excursion(ft: np.ndarray, fv: np.ndarray) -> float:
    """Longest time the floor rose clearly and then came back down to where it was, seconds.

    For each floor point: the first later point at or below it (within the
    noise); the excursion counts when the floor rose in between by four times the
    noise (and 32 MiB). A cycle's rise lasts no longer than such an excursion, so
    a rise shorter than the longest one already seen is no evidence of a leak.
    """
    if fv.size < 3:
        return 0.0
    d = np.diff(fv)
    noise = 1.4826 * median(np.abs(d - median(d))) / np.sqrt(2)
    tol, clear = max(noise, MIB), max(4 * noise, 32 * MIB)
    later = np.triu(np.ones((fv.size, fv.size), dtype=bool), 1)
    back = later & (fv[None, :] <= fv[:, None] + tol)
    first = np.argmax(back, axis=1)
    running_max = np.maximum.accumulate(np.where(later, fv[None, :], -np.inf), axis=1)
    peak = running_max[np.arange(fv.size), np.maximum(first - 1, 0)]
    counts = back.any(axis=1) & (peak > fv + clear)
    return float((ft[first] - ft)[counts].max()) if counts.any() else 0.0


def _time_to_limit(rise: Rise, limit_bytes: float | None) -> float | None:
    """The projection from the recent peak, only for significant growth."""
    if rise.growth_low_bytes_per_hour <= 0:
        return None
    return seconds_to_limit(rise.peak_bytes, limit_bytes, rise.growth_bytes_per_hour)


def seconds_to_limit(
    start_bytes: float, limit_bytes: float | None, growth_bytes_per_hour: float | None
) -> float | None:
    """Seconds until memory at ``start_bytes`` reaches ``limit_bytes``, growing
    linearly at ``growth_bytes_per_hour``; 0 when it is already there; None
    without a limit, without positive growth, or when the result is not finite.

    The one exhaustion projection. :func:`detect_leak` projects from the recent
    peak of the series it holds (the OOM comes at the top of a sawtooth); the
    operator's leak rule has only the node report, and projects from the pod's
    latest VRAM.
    """
    if limit_bytes is None or growth_bytes_per_hour is None or growth_bytes_per_hour <= 0:
        return None
    headroom = limit_bytes - start_bytes
    if headroom <= 0:
        return 0.0
    seconds = headroom / growth_bytes_per_hour * HOUR
    return seconds if math.isfinite(seconds) else None
