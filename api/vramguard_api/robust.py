"""The Theil–Sen slope estimator with Sen's confidence interval, on numpy alone.

This is ``scipy.stats.theilslopes`` (method ``"separate"``) re-stated: the node
agent computes trend features on every node, and importing ``scipy.stats``
alone costs it about 60 MiB of resident memory, most of its 80 MiB budget. A
unit test checks that the two agree on random and tied data; the operator and
the tests may keep using scipy.

Sources: Sen, P. K. (1968), "Estimates of the regression coefficient based on
Kendall's tau", JASA 63, eq. 2.6 (the variance with ties); Theil (1950).
"""

from __future__ import annotations

import functools
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
import numpy.typing as npt


class TheilSen(NamedTuple):
    """Median slope, intercept (median(y) − slope × median(x)) and the
    confidence interval of the slope, in y units per x unit."""

    slope: float
    intercept: float
    low_slope: float
    high_slope: float


def theil_sen(y: npt.ArrayLike, x: npt.ArrayLike, alpha: float = 0.95) -> TheilSen:
    """Theil–Sen fit of ``y`` against ``x`` (1-D, same length ≥ 2).

    ``alpha`` is the confidence level of the slope's interval (0.95, or 0.05:
    both mean a 95% interval, as in scipy). Raises ``ValueError`` when the
    lengths differ or are below 2. All-identical ``x`` gives NaN figures.
    """
    yv = np.asarray(y, dtype=float).ravel()
    xv = np.asarray(x, dtype=float).ravel()
    if yv.size != xv.size:
        raise ValueError(f"x and y differ in length: {xv.size} != {yv.size}")
    if yv.size < 2:
        raise ValueError("x and y must have at least 2 points")
    dx = xv[:, np.newaxis] - xv
    dy = yv[:, np.newaxis] - yv
    rising = dx > 0
    slopes = np.sort(dy[rising] / dx[rising])
    if slopes.size == 0:
        return TheilSen(float("nan"), float("nan"), float("nan"), float("nan"))
    # Medians from sorted arrays: the agent runs this for every pod, and np.median's
    # overhead on a few dozen points is most of the cost.
    slope = _median_of_sorted(slopes)
    intercept = _median_of_sorted(np.sort(yv)) - slope * _median_of_sorted(np.sort(xv))
    z = _normal_quantile((1.0 - alpha if alpha > 0.5 else alpha) / 2)
    n, nt = yv.size, slopes.size
    variance = (n * (n - 1) * (2 * n + 5) - _tie_term(xv) - _tie_term(yv)) / 18.0
    if not variance >= 0:  # heavy ties: no interval, as scipy
        return TheilSen(slope, intercept, float("nan"), float("nan"))
    sigma = np.sqrt(variance)
    upper = min(int(np.round((nt - z * sigma) / 2.0)), nt - 1)
    lower = max(int(np.round((nt + z * sigma) / 2.0)) - 1, 0)
    return TheilSen(slope, intercept, float(slopes[lower]), float(slopes[upper]))


def median_slope(y: np.ndarray, x: np.ndarray) -> float:
    """The Theil–Sen slope alone (the median of the pairwise slopes), without its
    interval: for tests that only compare slopes. ``x`` increasing, 1-D float
    arrays of one length; NaN with fewer than 2 points."""
    dx = x[None, :] - x[:, None]
    rising = dx > 0
    if not rising.any():
        return float("nan")
    return median((y[None, :] - y[:, None])[rising] / dx[rising])


def median(values: np.ndarray) -> float:
    """``np.median`` of a non-empty 1-D float array without NaN, by sorting: the
    same value, at a fraction of np.median's overhead on a few dozen points."""
    return _median_of_sorted(np.sort(values))


def _median_of_sorted(values: np.ndarray) -> float:
    """The median of a sorted, non-empty 1-D array (the mean of the middle two when even, as np.median)."""
    middle = values.size // 2
    if values.size % 2:
        return float(values[middle])
    return float((values[middle - 1] + values[middle]) / 2)


@functools.lru_cache(maxsize=8)
def _normal_quantile(p: float) -> float:
    return NormalDist().inv_cdf(p)


def _tie_term(values: np.ndarray) -> float:
    """Sum of k(k−1)(2k+5) over groups of k > 1 equal values (Sen 1968, eq. 2.6)."""
    ordered = np.sort(values)
    differs = ordered[1:] != ordered[:-1]
    if differs.all():  # no ties, the usual case for sample times
        return 0.0
    edges = np.flatnonzero(np.concatenate(([True], differs, [True])))
    k = np.diff(edges).astype(float)
    k = k[k > 1]
    return float(np.sum(k * (k - 1) * (2 * k + 5)))
