"""Trend features of a pod's VRAM history, computed by the agent and read by the
operator's leak detection, so that both interpret them the same way.

The features come from the leak detector (:mod:`vramguard_api.leak`): the
operator decides a budget's leak violation from them alone with
:func:`trend_verdict`, through the detector's one verdict
(:func:`vramguard_api.leak.called_by`). The detector knows nothing of these
features (this module imports it, never the reverse).
"""

from __future__ import annotations

import math
from typing import Annotated

import numpy as np
from pydantic import BeforeValidator, Field

from .leak import (
    DEFAULT_MIN_EVIDENCE_SECONDS,
    DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    DEFAULT_MIN_WINDOW_SECONDS,
    Samples,
    VerdictPath,
    analyse,
    called_by,
)
from .meta import APIModel
from .units import GO_DURATION_MAX_NS, MAX_BYTES

MAX_REPORT_SECONDS = GO_DURATION_MAX_NS / 1e9
"""Largest time span in a report, seconds: Go's largest duration (2562047h47m16.854775807s)."""


def _finite_or_none(value: object) -> object:
    # Theil–Sen gives NaN for heavy ties: unknown, which the report says with None
    # (a NaN could not be sent anyway: APIModel.to_api turns it into None).
    return None if isinstance(value, float) and not math.isfinite(value) else value


Figure = Annotated[float | None, BeforeValidator(_finite_or_none)]
"""An optional figure; NaN or infinite means unknown (None)."""


class TrendFeatures(APIModel):
    """Features of a VRAM series over a window.

    ``growthBytesPerHour`` is the Theil–Sen slope of the series' floor (its
    lowest sample per 5-minute block: insensitive to a training sawtooth and to
    spikes) in the current segment (since the last restart), since the rise's
    onset when the floor rises steadily; ``growthLowBytesPerHour`` its lower
    95% confidence bound; ``floorRiseBytes`` the rise of the floor from the
    first to the last quarter of the segment. ``riseSeconds`` and
    ``onsetSeconds`` are present only when the floor rises steadily (a leak's
    signature, whatever its rate); ``leak`` is the verdict at the default
    thresholds. :func:`trend_verdict` decides with others.
    """

    window_seconds: float = Field(
        alias="windowSeconds",
        ge=0,
        le=MAX_REPORT_SECONDS,
        allow_inf_nan=False,
        description="Time covered by the history, seconds; at most 9223372036.854775807 (Go's largest duration).",
    )
    samples: int = Field(ge=0, le=2**31 - 1, description="Number of samples in the window.")
    growth_bytes_per_hour: Figure = Field(
        default=None,
        alias="growthBytesPerHour",
        ge=-MAX_BYTES,
        le=MAX_BYTES,
        description="Robust growth rate of the VRAM floor since the last restart (since the "
        "rise's onset when the floor rises steadily), bytes per hour; within ±2^53.",
    )
    growth_low_bytes_per_hour: Figure = Field(
        default=None,
        alias="growthLowBytesPerHour",
        ge=-MAX_BYTES,
        le=MAX_BYTES,
        description="Lower 95% confidence bound of the growth rate, bytes per hour; within ±2^53.",
    )
    floor_rise_bytes: Figure = Field(
        default=None,
        alias="floorRiseBytes",
        ge=-MAX_BYTES,
        le=MAX_BYTES,
        description="Rise of the VRAM floor over the window (since the last restart), bytes; within ±2^53.",
    )
    rise_seconds: Figure = Field(
        default=None,
        alias="riseSeconds",
        ge=0,
        le=MAX_REPORT_SECONDS,
        description="How long the floor has risen steadily, from the onset to its latest advance, seconds; "
        "absent when it does not rise steadily. At most 9223372036.854775807.",
    )
    onset_seconds: Figure = Field(
        default=None,
        alias="onsetSeconds",
        ge=0,
        le=MAX_REPORT_SECONDS,
        description="How long before the window's last sample the steady rise began, seconds; "
        "absent when the floor does not rise steadily. At most 9223372036.854775807.",
    )
    evidence_seconds: Figure = Field(
        default=None,
        alias="evidenceSeconds",
        ge=0,
        le=MAX_REPORT_SECONDS,
        description="How long the recent rise of the floor (1-minute floor, from a flat baseline or from the "
        "process's start, clean and still climbing) has lasted, seconds; absent when there is none. At most 9223372036.854775807.",
    )
    evidence_growth_bytes_per_hour: Figure = Field(
        default=None,
        alias="evidenceGrowthBytesPerHour",
        ge=-MAX_BYTES,
        le=MAX_BYTES,
        description="Robust growth rate of that recent rise, bytes per hour; within ±2^53.",
    )
    evidence_growth_low_bytes_per_hour: Figure = Field(
        default=None,
        alias="evidenceGrowthLowBytesPerHour",
        ge=-MAX_BYTES,
        le=MAX_BYTES,
        description="Lower 95% confidence bound of that recent rise's growth rate, bytes per hour; within ±2^53.",
    )
    leak: bool | None = Field(
        default=None,
        description="Whether the window shows a leak at the default thresholds (growth of 200Mi per hour "
        "or more, rising for 30m or more; or a recent rise of 7m or more whose lower bound grows at "
        "200Mi per hour or more); absent with fewer than 3 samples.",
    )


def compute_trend(times_s: Samples, values_bytes: Samples, counts: Samples | None = None) -> TrendFeatures:
    """Compute trend features of one VRAM series.

    ``times_s`` are sample times in seconds (increasing), ``values_bytes`` the
    VRAM in bytes at those times (same length; unknown samples left out by the
    caller, zeros from failed reads or restarts kept); ``counts``: how many raw
    samples each value is the minimum of (the agent's history buckets; None: one
    each). Fewer than 3 samples, or fewer than 3 since the last restart, give no
    growth figures. Raises ``ValueError`` as :func:`vramguard_api.leak.detect_leak` does.
    """
    n = len(times_s)
    window = float(times_s[-1] - times_s[0]) if n else 0.0
    a = analyse(times_s, values_bytes, counts)
    if a.t.size < 3 or window <= 0:
        return TrendFeatures(windowSeconds=window, samples=n)
    rise, fast = a.rise, a.fast
    if rise is None:
        return TrendFeatures(windowSeconds=window, samples=n, leak=False)
    rise_seconds = rise.rise_seconds if rise.structural else None
    evidence_seconds = fast.seconds if fast is not None else None
    evidence_low = fast.growth_low_bytes_per_hour if fast is not None else None
    return TrendFeatures(
        windowSeconds=window,
        samples=n,
        growthBytesPerHour=rise.growth_bytes_per_hour,
        growthLowBytesPerHour=rise.growth_low_bytes_per_hour,
        floorRiseBytes=_floor_rise(*a.floor) if a.floor is not None else None,
        riseSeconds=rise_seconds,
        onsetSeconds=rise.end_t_seconds - rise.onset_t_seconds if rise.structural else None,
        evidenceSeconds=evidence_seconds,
        evidenceGrowthBytesPerHour=fast.growth_bytes_per_hour if fast is not None else None,
        evidenceGrowthLowBytesPerHour=evidence_low,
        leak=called_by(
            structural=rise.structural,
            rise_seconds=rise_seconds,
            growth_bytes_per_hour=_finite(rise.growth_bytes_per_hour),
            evidence_seconds=evidence_seconds,
            evidence_low_bytes_per_hour=_finite(evidence_low),
        )
        is not None,
    )


def _finite(value: float | None) -> float | None:
    """None for NaN, as the report's fields hold it (``Figure``)."""
    return value if value is not None and math.isfinite(value) else None


def _floor_rise(ft: np.ndarray, fv: np.ndarray) -> float:
    """Lowest floor point in the last quarter of the segment less the lowest in the first."""
    quarter = (ft[-1] - ft[0]) / 4
    return float(fv[ft >= ft[-1] - quarter].min() - fv[ft <= ft[0] + quarter].min())


def trend_verdict(
    trend: TrendFeatures,
    *,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
    min_evidence_seconds: float = DEFAULT_MIN_EVIDENCE_SECONDS,
) -> VerdictPath | None:
    """:func:`vramguard_api.leak.called_by` on a node report's features: which path
    calls a leak with a budget's thresholds, or None.

    Gives the verdict ``detect_leak`` gives on the agent's history with the same
    thresholds: ``trend.rise_seconds`` (with ``onset_seconds``) is present only
    when the floor rises structurally, ``evidence_seconds`` (with
    ``evidence_growth_low_bytes_per_hour``) only when a recent rise qualifies.
    Features that carry only ``onset_seconds`` (older agents) are judged on it
    (the rise cannot have lasted longer).
    """
    rise_seconds = trend.rise_seconds if trend.rise_seconds is not None else trend.onset_seconds
    return called_by(
        structural=rise_seconds is not None,
        rise_seconds=rise_seconds,
        growth_bytes_per_hour=trend.growth_bytes_per_hour,
        evidence_seconds=trend.evidence_seconds,
        evidence_low_bytes_per_hour=trend.evidence_growth_low_bytes_per_hour,
        min_growth_bytes_per_hour=min_growth_bytes_per_hour,
        min_window_seconds=min_window_seconds,
        min_evidence_seconds=min_evidence_seconds,
    )


def verdict_growth(trend: TrendFeatures, path: VerdictPath | None) -> tuple[float | None, float | None]:
    """(growth, its lower 95% bound), bytes per hour, of the rise a verdict
    (``path``, :func:`trend_verdict`'s) rests on: the recent rise's when the fast
    path calls the leak (the slow path's growth then spans the flat floor before
    it and understates the rate), the slow path's otherwise. For the figures an
    Event shows and the projection to the limit."""
    if path == "fast":
        return trend.evidence_growth_bytes_per_hour, trend.evidence_growth_low_bytes_per_hour
    return trend.growth_bytes_per_hour, trend.growth_low_bytes_per_hour
