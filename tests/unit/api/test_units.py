from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_api.units import format_bytes, parse_duration, quantity_to_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40Gi", 40 * 2**30),
        ("512Mi", 512 * 2**20),
        ("1G", 10**9),
        ("1000", 1000),
        ("1.5Ki", 1536),
        ("100m", 1),
        ("1e3", 1000),
        (2048, 2048),
    ],
)
def test_quantity_to_bytes(text, expected):
    assert quantity_to_bytes(text) == expected


@pytest.mark.parametrize("bad", ["-1Gi", "40GB", "", "Gi", "1.2.3"])
def test_quantity_errors_name_field_and_value(bad):
    with pytest.raises(ValueError) as err:
        quantity_to_bytes(bad, "spec.limits.perPod.vram")
    assert "spec.limits.perPod.vram" in str(err.value) and repr(bad) in str(err.value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("300ms", 0.3), ("0s", 0), ("2h45m10s", 9910)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5 minutes", "-1s", "10", "1d", "", "m"])
def test_duration_errors_name_field(bad):
    with pytest.raises(ValueError, match="tolerance.duration"):
        parse_duration(bad, "tolerance.duration")


@given(st.integers(min_value=0, max_value=2**50))
def test_format_bytes_round_trips_within_rounding(n):
    text = format_bytes(n)
    assert quantity_to_bytes(text) == pytest.approx(n, rel=0.05, abs=1)
