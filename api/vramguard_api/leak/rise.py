"""The floor's rise in a segment (the slow path): onset, growth and whether it is
structural. See docs/leak-detection.md, "The detector".

A hockey stick (flat, then rising linearly from an onset) is fitted to the
floor; the Theil–Sen slope since the onset, with its 95% confidence interval, is
the growth. The rise is *structural* when it is significant (lower bound at
least ``tuning.min_low_ratio`` of the growth, rise at least ``tuning.slow_min_snr`` times the
floor's scatter), persists (each half climbs), is still climbing (its tail),
has lasted longer than any excursion the segment has already come back down
from (a cycle's rising half is no leak), and is not a staircase of one or two
steps (``staircase``: step-ups that stopped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..robust import median
from ..robust import theil_sen as theilslopes  # scipy.stats.theilslopes without scipy: see robust.py
from .floor import floor_points, misread
from .series import previous_segment
from .tuning import HOUR, MIB
from .tuning import TUNING as T


@dataclass(frozen=True)
class Rise:
    """The floor's rise in the current segment, which the slow path decides from.

    The growth (bytes per hour, with its 95% interval) is measured since
    ``onset_t_seconds`` when the rise is structural, over the whole segment
    otherwise, as ``intercept_bytes + growth * t / 3600``; ``rise_seconds`` runs
    from the onset to the rise's last advance; ``end_t_seconds`` is the last
    sample's time; ``peak_bytes`` the recent peak (for the projection to a
    limit); ``excursion_seconds`` the longest excursion the floor came back from.
    """

    growth_bytes_per_hour: float
    growth_low_bytes_per_hour: float
    growth_high_bytes_per_hour: float
    intercept_bytes: float
    onset_t_seconds: float
    end_t_seconds: float
    rise_seconds: float
    structural: bool
    samples: int
    peak_bytes: float
    excursion_seconds: float


def fit_rise(
    st: np.ndarray, sv: np.ndarray, floor: tuple[np.ndarray, np.ndarray] | None = None
) -> Rise | None:
    """Fit the floor of one segment (``current_segment``'s output); None when too short.

    ``floor`` is ``floor_points(st, sv)`` when the caller has it already."""
    if st.size < 3:
        return None
    ft, fv = floor if floor is not None else floor_points(st, sv)
    good = ~misread(fv)
    ft, fv = ft[good], fv[good]
    if ft.size < 3:
        return None
    onset = onset_index(ft, fv, T.slow_min_rise_points)
    rt, rv = ft[onset:], fv[onset:]
    fit = theilslopes(rv, rt, alpha=T.confidence)
    rise_seconds = rise_end(rt, rv) - rt[0]
    excursion = longest_excursion(ft, fv)
    structural = (
        rt.size >= T.slow_min_rise_points
        and fit.low_slope >= T.min_low_ratio * fit.slope > 0
        and fit.slope * rise_seconds >= T.slow_min_snr * scatter(rv - (fit.intercept + fit.slope * rt))
        and persists(rt, rv, fit.slope)
        and still_rising(rt, rv, fit.slope)
        and rise_seconds > excursion
        and staircase_ratio(rt, rv) >= T.steps_ratio
    )
    if not structural:  # no rise to measure from: the growth over the whole segment
        fit = theilslopes(fv, ft, alpha=T.confidence)
    recent = sv[st >= st[-1] - T.slow_block_seconds]
    return Rise(
        growth_bytes_per_hour=float(fit.slope) * HOUR,
        growth_low_bytes_per_hour=float(fit.low_slope) * HOUR,
        growth_high_bytes_per_hour=float(fit.high_slope) * HOUR,
        intercept_bytes=float(fit.intercept),
        onset_t_seconds=float(rt[0]),
        end_t_seconds=float(st[-1]),
        rise_seconds=float(rise_seconds),
        structural=bool(structural),
        samples=int(st.size),
        peak_bytes=median(np.sort(recent)[-3:]),
        excursion_seconds=excursion,
    )


def previous_life_rose(t: np.ndarray, v: np.ndarray, min_life_seconds: float) -> bool:
    """Whether the process life before the current segment of a series (seconds,
    bytes: ``validate_series``'s output) lasted ``min_life_seconds`` or more and
    ended on a structural rise (threshold-free): it leaked until it restarted (an
    OOM). A shorter life may have died in a warm-up or in a cycle's first rise (a
    crash loop, a rollout), which proves nothing. False without a restart."""
    pt, pv = previous_segment(t, v)
    if pt.size < 3 or pt[-1] - pt[0] < min_life_seconds:
        return False
    rise = fit_rise(pt, pv)
    return rise is not None and rise.structural


def scatter(resid: np.ndarray) -> float:
    """Robust standard deviation (1.4826 × MAD), at least 1 MiB."""
    return max(1.4826 * median(np.abs(resid - median(resid))), MIB)


def onset_index(ft: np.ndarray, fv: np.ndarray, min_after: int, first: int = 0) -> int:
    """Index of the floor point where a flat-then-rising fit bends.

    Least squares of ``a + r * max(0, t - t_j)`` for every candidate ``t_j`` from
    index ``first`` on that leaves ``min_after`` points after it (closed form,
    all candidates at once).
    """
    last = max(first + 1, ft.size - min_after + 1)
    g = np.maximum(ft[None, :] - ft[first:last, None], 0.0)  # (candidates, points)
    return first + int(np.argmin(line_sse(g, fv)))


def line_sse(g: np.ndarray, fv: np.ndarray) -> np.ndarray:
    """Squared error of the least-squares fit ``fv ≈ a + r * g[k]`` for each row k."""
    dg = g - g.mean(axis=1)[:, None]
    dv = fv - fv.mean()
    sgg = (dg * dg).sum(axis=1)
    r = np.divide((dg * dv).sum(axis=1), sgg, out=np.zeros(sgg.size), where=sgg > 0)
    return ((dv[None, :] - r[:, None] * dg) ** 2).sum(axis=1)


def rise_end(rt: np.ndarray, rv: np.ndarray, gain: float = T.plateau_gain) -> float:
    """When the rise last advanced: the bend of a rise-then-plateau fit, or the last point.

    The plateau fit (least squares, bend at each candidate point) replaces the
    straight rise only when it lowers the squared error by ``gain`` or more: a
    cycle's top or a warm-up's plateau bends clearly, a noisy leak does not.
    """
    if rt.size < T.slow_min_rise_points + 1:
        return float(rt[-1])
    bends = rt[T.slow_min_rise_points - 1 :]
    g = np.minimum(rt[None, :], bends[:, None]) - rt[0]  # the last row is a straight line
    sse = line_sse(g, rv)
    best = int(np.argmin(sse))
    return float(bends[best]) if sse[best] <= (1 - gain) * sse[-1] else float(rt[-1])


def persists(rt: np.ndarray, rv: np.ndarray, slope: float, ratio: float = T.slow_persistence, strict: bool = False) -> bool:
    """Whether both halves of the rise climb (not one step, nor a rise that stopped)."""
    middle = (rt[0] + rt[-1]) / 2
    return climbs(rt[rt <= middle], rv[rt <= middle], slope, ratio, strict) and climbs(
        rt[rt >= middle], rv[rt >= middle], slope, ratio, strict
    )


def still_rising(rt: np.ndarray, rv: np.ndarray, slope: float) -> bool:
    """Whether the tail of the rise (its last ``tuning.tail_seconds`` or ``tuning.tail_fraction``,
    whichever is longer, and the point before) climbs.

    A cycle's top, a warm-up's plateau and the level after a step stop climbing;
    a leak's floor keeps climbing, and stairs step again within minutes.
    """
    tail = max(T.tail_seconds, T.tail_fraction * (rt[-1] - rt[0]))
    first = max(0, int(np.searchsorted(rt, rt[-1] - tail)) - 1)
    return climbs(rt[first:], rv[first:], slope, T.tail_ratio)


def climbs(pt: np.ndarray, pv: np.ndarray, slope: float, ratio: float = T.slow_persistence, strict: bool = False) -> bool:
    """Whether a part of the rise climbs: at ``ratio`` of the rise's slope, or (with
    ``tuning.slow_min_rise_points`` points, unless ``strict``) significantly above zero, as a
    leak that slows down between bursts of traffic still does."""
    if pt.size < 2:
        return False
    part = theilslopes(pv, pt, alpha=T.confidence)
    return bool(part.slope >= ratio * slope or (not strict and pt.size >= T.slow_min_rise_points and part.low_slope > 0))


def staircase_ratio(rt: np.ndarray, rv: np.ndarray) -> float:
    """Squared error of the best staircase of at most two steps (three levels, each
    the mean of its points) over that of the least-squares line, both fitted to the
    rise's floor points; 1.0 when the line fits exactly, 0.0 with 3 points or
    fewer (three levels fit them exactly: such a rise, a logger gap in it,
    cannot be told from two steps).

    A leak's floor, even in stairs of many small steps, is closer to a line than to
    three levels; one or two step-ups (a cache, a bigger batch, a rollout) are three
    levels."""
    return staircase(rt, rv)[0]


def staircase(rt: np.ndarray, rv: np.ndarray) -> tuple[float, float]:
    """(``staircase_ratio``, seconds the best staircase's middle level lasts: from its
    first point to the first point of the level above). All pairs of breaks at once,
    from cumulative sums (a few hundred pairs: the agent's 2-hour history holds 24
    slow-path floor points, and the fast path's hour 60)."""
    n = rv.size
    if n <= 3:
        return 0.0, 0.0  # three levels fit three points exactly
    x = rv - rv.mean()  # centred: the sums of squares stay exact in floating point
    line = x - np.polyval(np.polyfit(rt - rt.mean(), x, 1), rt - rt.mean())
    line_sse = float(line @ line)
    if line_sse <= 0:
        return 1.0, 0.0
    s1, s2 = np.concatenate(([0.0], np.cumsum(x))), np.concatenate(([0.0], np.cumsum(x * x)))
    i, j = np.triu_indices(n, 1)  # the middle level is [i, j): a level on each side
    i, j = i[i >= 1], j[i >= 1]

    def sse(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        return s2[b] - s2[a] - (s1[b] - s1[a]) ** 2 / (np.asarray(b) - a)

    total = sse(0, i) + sse(i, j) + sse(j, n)
    best = int(np.argmin(total))
    return float(max(total[best], 0.0) / line_sse), float(rt[j[best]] - rt[i[best]])


def longest_excursion(ft: np.ndarray, fv: np.ndarray, smooth: bool = False) -> float:
    """Longest time the floor rose clearly and then came back down to where it was, seconds.

    For each floor point: the first later point at or below it (within the
    noise); the excursion counts when the floor rose in between by four times the
    noise (and 32 MiB). A cycle's rise lasts no longer than such an excursion, so
    a rise shorter than the longest one already seen is no evidence of a leak.
    The noise is the robust deviation of the floor's differences, or with
    ``smooth`` of its second differences, which a smooth wave (a load cycle, an
    aliased sawtooth on a fine floor) does not inflate.
    """
    if fv.size < 3:
        return 0.0
    d = np.diff(fv, n=2 if smooth else 1)
    noise = 1.4826 * median(np.abs(d - median(d))) / np.sqrt(6 if smooth else 2)
    tol, clear = max(noise, MIB), max(T.excursion_sigmas * noise, T.clear_bytes)
    later = np.triu(np.ones((fv.size, fv.size), dtype=bool), 1)
    back = later & (fv[None, :] <= fv[:, None] + tol)
    first = np.argmax(back, axis=1)
    running_max = np.maximum.accumulate(np.where(later, fv[None, :], -np.inf), axis=1)
    peak = running_max[np.arange(fv.size), np.maximum(first - 1, 0)]
    counts = back.any(axis=1) & (peak > fv + clear)
    return float((ft[first] - ft)[counts].max()) if counts.any() else 0.0
