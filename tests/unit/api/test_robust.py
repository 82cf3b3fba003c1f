"""The numpy Theil–Sen estimator agrees with scipy.stats.theilslopes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import theilslopes

from vramguard_api.robust import theil_sen


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=-50, max_value=50), min_size=2, max_size=60),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.sampled_from([0.95, 0.9, 0.05, 0.99]),
)
def test_matches_scipy_with_ties(ys, seed, alpha):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, len(ys), size=len(ys)).astype(float)  # repeated x: ties
    y = np.asarray(ys, dtype=float)
    ours = theil_sen(y, x, alpha)
    if not np.any(x[:, None] - x > 0):
        assert np.isnan(ours.slope)
        return
    ref = theilslopes(y, x, alpha=alpha)
    assert ours == pytest.approx((ref.slope, ref.intercept, ref.low_slope, ref.high_slope), nan_ok=True)


def test_recovers_a_line_under_outliers():
    x = np.arange(100.0)
    y = 3 * x + 7
    y[::10] += 1000  # one point in ten is an outlier
    fit = theil_sen(y, x)
    assert fit.slope == pytest.approx(3.0)
    assert fit.low_slope <= 3.0 <= fit.high_slope


def test_rejects_bad_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        theil_sen([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2"):
        theil_sen([1], [1])
