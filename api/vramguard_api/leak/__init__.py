"""Leak detection on one VRAM series: a rising floor told apart from a sawtooth.

Pure (numpy only) and shared by the agent (trend features in its node
report), the operator (leak violations, from those features) and
``vramguard analyze``, so that all decide alike. The method, its parameters and
its measured figures are in docs/leak-detection.md.

Outline of :func:`analyse`, which :func:`detect_leak` and
``vramguard_api.trend.compute_trend`` share:

1. **Zeros** (``series.py``): restarts cut the series, dropouts are left out;
   only the segment since the last restart is judged.
2. **Floor** (``floor.py``): the lowest sample per block of time: a leak raises
   it, a sawtooth, eval spikes and request bursts do not.
3. **Slow path** (``rise.py``): a hockey stick on the 5-minute floor of the whole
   segment gives the onset; the rise is *structural* when it is significant,
   persists, still climbs, outlasts any excursion already seen and is no
   staircase of one or two steps.
4. **Fast path** (``evidence.py``): the last hour's 1-minute floor; a recent
   rise from a flat baseline that is clean, linear and still climbing
   *qualifies*; so does a rise from the process's start once the process has
   run ``tuning.start_seconds``, or at once after a life that ended on a structural
   rise (an OOM restart: ``rise.previous_life_rose``).

:func:`called_by` then calls a leak when the structural rise has lasted
``minWindow`` (and ``minEvidence``) and grows at ``minGrowthPerHour`` or more,
or when a qualifying rise has lasted ``minEvidence`` and the lower 95% bound of
its growth is ``minGrowthPerHour`` or more. ``minWindow`` is thus the longest a
leak that the slow path sees can wait; ``minEvidence`` the least any verdict
rests on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..robust import median
from .evidence import Evidence, baseline_seconds, fast_block_seconds, fit_evidence
from .floor import floor_points
from .rise import Rise, fit_rise, previous_life_rose
from .series import Samples, current_segment, restarts, validate_series
from .tuning import HOUR, MIB, TUNING, LeakTuning

__all__ = [
    "DEFAULT_MIN_EVIDENCE_SECONDS",
    "DEFAULT_MIN_GROWTH_BYTES_PER_HOUR",
    "DEFAULT_MIN_WINDOW_SECONDS",
    "Analysis",
    "Evidence",
    "LeakResult",
    "LeakTuning",
    "Rise",
    "Samples",
    "TUNING",
    "VerdictPath",
    "analyse",
    "called_by",
    "current_segment",
    "detect_leak",
    "fit_rise",
    "floor_points",
    "needed_seconds",
    "seconds_to_limit",
    "validate_series",
    "verdict",
]

# The API's defaults of spec.leakDetection, by the names callers know them by.
DEFAULT_MIN_GROWTH_BYTES_PER_HOUR = TUNING.default_min_growth_bytes_per_hour
DEFAULT_MIN_WINDOW_SECONDS = TUNING.default_min_window_seconds
DEFAULT_MIN_EVIDENCE_SECONDS = TUNING.default_min_evidence_seconds

VerdictPath = Literal["slow", "fast"]
"""Which path calls a leak: the slow path's structural rise, or the fast path's recent one."""


@dataclass(frozen=True)
class LeakResult:
    """The verdict on one VRAM series.

    ``growth_bytes_per_hour``: Theil–Sen slope of the floor in the current
    segment: of the rise the verdict rests on when there is one (the fast path's
    for a leak it called, the slow path's otherwise), of the whole segment when
    the floor does not rise steadily; ``growth_low_bytes_per_hour``: its lower
    95% confidence bound. ``onset_t_seconds`` (the input's clock) is set only
    for a leak. ``time_to_limit_seconds``: from the last sample until the recent
    peak, growing at ``growth_bytes_per_hour``, reaches the limit (0 when already
    there); None without a limit or without significant growth. ``samples``:
    usable samples in the current segment. ``evidence_seconds``: how long the
    rise the verdict rests on has lasted (None without one).
    """

    leak: bool
    growth_bytes_per_hour: float
    growth_low_bytes_per_hour: float
    onset_t_seconds: float | None
    time_to_limit_seconds: float | None
    samples: int
    evidence_seconds: float | None = None


@dataclass(frozen=True)
class Analysis:
    """Everything the decision and a picture of it need, threshold-free.

    ``t``, ``v``: the usable samples (NaN dropped); ``st``, ``sv``: the current
    segment (since the last restart, zeros left out); ``floor``: the slow path's floor points (time,
    bytes); ``rise``: the slow path's fit (None when the segment is too short);
    ``evidence``: the fast path's (None when too short);
    ``raw_interval_seconds``: the time between raw samples.
    """

    t: np.ndarray
    v: np.ndarray
    st: np.ndarray
    sv: np.ndarray
    floor: tuple[np.ndarray, np.ndarray] | None
    rise: Rise | None
    evidence: Evidence | None
    raw_interval_seconds: float

    @property
    def restarts(self) -> list[float]:
        """Times at which a new process started (for a picture: the decision needs
        only the current segment)."""
        return restarts(self.t, self.v)

    @property
    def fast(self) -> Evidence | None:
        """The fast path's rise when it qualifies."""
        return self.evidence if self.evidence is not None and self.evidence.qualified else None


def analyse(times_s: Samples, values_bytes: Samples, counts: Samples | None = None) -> Analysis:
    """Fit both paths on one VRAM series (seconds, bytes; see :func:`detect_leak`).

    ``counts``: how many raw samples each value is the minimum of (the agent's
    1-minute history; None: one each), which sets the fast path's block.
    Raises ``ValueError`` as :func:`validate_series` does, and when ``counts``
    differs in length from the times or holds a count below 1."""
    t, v = validate_series(times_s, values_bytes)
    st, sv = current_segment(t, v)
    floor = floor_points(st, sv) if st.size >= 3 else None
    rise = fit_rise(st, sv, floor) if floor is not None else None
    raw_dt = _raw_interval(t, counts, len(times_s))
    evidence = (fit_evidence(st, sv, rise.excursion_seconds, raw_dt, lambda: previous_life_rose(t, v, TUNING.start_seconds))
                if rise is not None else None)
    return Analysis(t, v, st, sv, floor, rise, evidence, raw_dt)


def _raw_interval(t: np.ndarray, counts: Samples | None, n: int) -> float:
    """Seconds between raw samples: the usable times' median spacing over the median
    count (``n``: how many times the caller gave, which ``counts`` must match)."""
    if counts is not None and len(counts) != n:
        raise ValueError(f"counts must hold one count per time: {len(counts)} for {n}")
    if counts is not None and n and min(counts) < 1:
        raise ValueError(f"counts must be >= 1, got {min(counts)}")
    if t.size < 2:
        return TUNING.fast_block_seconds
    dt = median(t[1:] - t[:-1])
    return dt / median(np.asarray(counts, dtype=float)) if counts is not None else dt


def called_by(
    *,
    structural: bool,
    rise_seconds: float | None,
    growth_bytes_per_hour: float | None,
    evidence_seconds: float | None,
    evidence_low_bytes_per_hour: float | None,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
    min_evidence_seconds: float = DEFAULT_MIN_EVIDENCE_SECONDS,
) -> VerdictPath | None:
    """The verdict, the one place it is derived: which path calls a leak, or None
    (no leak). Used by :func:`verdict` (on a series), ``trend.compute_trend`` (the
    report's ``leak``) and ``trend.trend_verdict`` (the operator's rule).

    Slow path: a structural rise (``rise_seconds`` long, growing at
    ``growth_bytes_per_hour``) that has lasted ``min_window_seconds`` and
    ``min_evidence_seconds``. Fast path: a qualifying rise ``evidence_seconds``
    long whose growth's lower bound is ``evidence_low_bytes_per_hour``. Both must
    reach ``min_growth_bytes_per_hour``. When both call it, the slow path's: its
    figures span the whole rise. NaN or None figures call nothing.
    """
    if (
        structural
        and rise_seconds is not None
        and growth_bytes_per_hour is not None
        and rise_seconds >= max(min_window_seconds, min_evidence_seconds)
        and growth_bytes_per_hour >= min_growth_bytes_per_hour
    ):
        return "slow"
    if (
        evidence_seconds is not None
        and evidence_low_bytes_per_hour is not None
        and evidence_seconds >= min_evidence_seconds
        and evidence_low_bytes_per_hour >= min_growth_bytes_per_hour
    ):
        return "fast"
    return None


def detect_leak(
    times_s: Samples,
    values_bytes: Samples,
    *,
    limit_bytes: float | None = None,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
    min_evidence_seconds: float = DEFAULT_MIN_EVIDENCE_SECONDS,
) -> LeakResult:
    """Say whether a VRAM series shows a leak, how fast it grows and when it hits a limit.

    ``times_s``: sample times in seconds, strictly increasing (any origin).
    ``values_bytes``: VRAM at those times in bytes, dropouts to zero included as
    they came; NaN marks a missing sample. ``limit_bytes``: optional limit to
    project to. The thresholds are a budget's ``spec.leakDetection``: see
    :func:`called_by` and the module docstring.

    Raises ``ValueError`` naming the argument when the lengths differ, a time is
    not finite, the times do not increase, a value is negative or infinite, or a
    threshold is negative.
    """
    for name, value in (
        ("min_growth_bytes_per_hour", min_growth_bytes_per_hour),
        ("min_window_seconds", min_window_seconds),
        ("min_evidence_seconds", min_evidence_seconds),
    ):
        if not value >= 0:
            raise ValueError(f"{name} ({value}) must not be negative")
    return verdict(
        analyse(times_s, values_bytes),
        limit_bytes=limit_bytes,
        min_growth_bytes_per_hour=min_growth_bytes_per_hour,
        min_window_seconds=min_window_seconds,
        min_evidence_seconds=min_evidence_seconds,
    )


def verdict(
    a: Analysis,
    *,
    limit_bytes: float | None = None,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
    min_evidence_seconds: float = DEFAULT_MIN_EVIDENCE_SECONDS,
) -> LeakResult:
    """:func:`detect_leak`'s result from an :class:`Analysis` and the thresholds."""
    rise, fast = a.rise, a.fast
    if rise is None:
        return LeakResult(False, 0.0, 0.0, None, None, int(a.st.size))
    path = called_by(
        structural=rise.structural,
        rise_seconds=rise.rise_seconds,
        growth_bytes_per_hour=rise.growth_bytes_per_hour,
        evidence_seconds=fast.seconds if fast is not None else None,
        evidence_low_bytes_per_hour=fast.growth_low_bytes_per_hour if fast is not None else None,
        min_growth_bytes_per_hour=min_growth_bytes_per_hour,
        min_window_seconds=min_window_seconds,
        min_evidence_seconds=min_evidence_seconds,
    )
    seconds: float | None
    if path == "fast" and fast is not None:  # the recent rise's figures, not the whole segment's
        growth, low, onset, seconds = (fast.growth_bytes_per_hour, fast.growth_low_bytes_per_hour,
                                       fast.onset_t_seconds, fast.seconds)
    else:
        growth, low, onset = rise.growth_bytes_per_hour, rise.growth_low_bytes_per_hour, rise.onset_t_seconds
        seconds = rise.rise_seconds if rise.structural else None
    leak = path is not None
    return LeakResult(
        leak=leak,
        growth_bytes_per_hour=growth,
        growth_low_bytes_per_hour=low,
        onset_t_seconds=onset if leak else None,
        time_to_limit_seconds=_time_to_limit(rise.peak_bytes, growth, low, limit_bytes),
        samples=rise.samples,
        evidence_seconds=seconds,
    )


def needed_seconds(
    a: Analysis,
    *,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
    min_evidence_seconds: float = DEFAULT_MIN_EVIDENCE_SECONDS,
) -> float:
    """The least span of a segment on which a leak could be called at its noise, seconds.

    The fast path needs its baseline and a rise of ``min_evidence_seconds`` (and
    ``tuning.fast_min_points`` floor points), over which a leak growing at twice the
    threshold would have the lower 95% bound of its growth above the threshold:
    with ``n = T / w`` floor points ``w`` seconds apart and a scatter ``s`` about
    the line, the slope's standard error is about ``s * sqrt(12 w) / T**1.5``
    (least squares on evenly spaced points), so ``T = (1.96 s sqrt(12 w) / G)**(2/3)``
    for a threshold of ``G`` bytes per second. The slow path needs
    ``min_window_seconds``. The smaller of the two.
    """
    w = fast_block_seconds(a.raw_interval_seconds)
    s = _floor_scatter(a.st, a.sv, w)
    g = max(min_growth_bytes_per_hour, MIB) / HOUR
    rise = max(min_evidence_seconds, (TUNING.fast_min_points - 1) * w, (1.96 * s * math.sqrt(12 * w) / g) ** (2 / 3))
    return min(baseline_seconds(w) + rise, max(min_window_seconds, min_evidence_seconds))


def _floor_scatter(st: np.ndarray, sv: np.ndarray, w: float) -> float:
    """The fine floor's noise: robust deviation of its second differences / sqrt(6)."""
    if st.size < 3:
        return float(MIB)
    _, fv = floor_points(st, sv, w, 1)
    if fv.size < 3:
        return float(MIB)
    d2 = fv[2:] - 2 * fv[1:-1] + fv[:-2]
    return max(1.4826 * median(np.abs(d2 - median(d2))) / math.sqrt(6), float(MIB))


def _time_to_limit(peak: float, growth: float, low: float, limit_bytes: float | None) -> float | None:
    """The projection from the recent peak, only for significant growth."""
    if low <= 0:
        return None
    return seconds_to_limit(peak, limit_bytes, growth)


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
