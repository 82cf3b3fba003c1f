"""Trend features of a pod's VRAM history, computed by the agent and read by the
operator's leak detection, so that both interpret them the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from .meta import APIModel

if TYPE_CHECKING:
    import numpy as np


class TrendFeatures(APIModel):
    """Features of a VRAM series over a window.

    ``growthBytesPerHour`` is the Theil–Sen slope of the series' lower envelope
    (a robust estimator: insensitive to a sawtooth and to outliers);
    ``growthLowBytesPerHour`` its lower confidence bound; ``floorRiseBytes`` the rise of the
    rolling minimum from the first to the last quarter of the window.
    """

    window_seconds: float = Field(alias="windowSeconds", ge=0, description="Time covered by the history, seconds.")
    samples: int = Field(ge=0, description="Number of samples in the window.")
    growth_bytes_per_hour: float | None = Field(
        default=None, alias="growthBytesPerHour", description="Robust growth rate, bytes per hour."
    )
    growth_low_bytes_per_hour: float | None = Field(
        default=None, alias="growthLowBytesPerHour", description="Lower confidence bound of the growth rate, bytes per hour."
    )
    floor_rise_bytes: float | None = Field(
        default=None, alias="floorRiseBytes", description="Rise of the rolling minimum over the window, bytes."
    )


def compute_trend(times_s: list[float], values_bytes: list[float]) -> TrendFeatures:
    """Compute trend features of one VRAM series.

    ``times_s`` are sample times in seconds (increasing), ``values_bytes`` the
    VRAM in bytes at those times (same length; unknown samples left out by the
    caller). The growth rate is the Theil–Sen slope (``scipy.stats.theilslopes``,
    95% confidence) of the lower envelope: the series' rolling minimum over
    windows of one tenth of the span, which removes a training loop's sawtooth and
    upward spikes. Fewer than 3 samples give no growth figures.
    """
    import numpy as np
    from scipy.stats import theilslopes

    n = len(times_s)
    if n != len(values_bytes):
        raise ValueError(f"times_s and values_bytes differ in length: {n} != {len(values_bytes)}")
    if n == 0:
        return TrendFeatures(windowSeconds=0.0, samples=0)
    t = np.asarray(times_s, dtype=float)
    v = np.asarray(values_bytes, dtype=float)
    window = float(t[-1] - t[0])
    if n < 3 or window <= 0:
        return TrendFeatures(windowSeconds=window, samples=n)
    floor = _rolling_min(t, v, window / 10)
    slope, _, low, _ = theilslopes(floor, t, alpha=0.95)
    quarter = max(1, n // 4)
    rise = float(floor[-quarter:].min() - floor[:quarter].min())
    return TrendFeatures(
        windowSeconds=window,
        samples=n,
        growthBytesPerHour=float(slope) * 3600,
        growthLowBytesPerHour=float(low) * 3600,
        floorRiseBytes=rise,
    )


def _rolling_min(t: "np.ndarray", v: "np.ndarray", width_s: float) -> "np.ndarray":
    """Minimum of ``v`` over the trailing ``width_s`` seconds at each sample."""
    import numpy as np

    start = np.searchsorted(t, t - width_s, side="left")
    return np.array([v[s : i + 1].min() for i, s in enumerate(start)])
