from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_api.units import (
    GO_DURATION_MAX_NS,
    MAX_BYTES,
    QUANTITY_MAX,
    OutOfRange,
    duration_ns,
    format_bytes,
    format_duration,
    format_seconds,
    parse_duration,
    quantity_decimal,
    quantity_to_bytes,
)


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
        ("8Pi", MAX_BYTES),
        (str(MAX_BYTES), MAX_BYTES),
        ("0", 0),
        ("0e400", 0),
        ("1e-400", 1),  # a non-zero value rounds up to 1n, as apimachinery does; then to a whole byte
    ],
)
def test_quantity_to_bytes(text, expected):
    assert quantity_to_bytes(text) == expected


@pytest.mark.parametrize("bad", ["-1Gi", "40GB", "", "Gi", "1.2.3", "NaN", "Infinity", "1_000", " 1", "1e5Ki", "١"])
def test_quantity_errors_name_field_and_value(bad):
    with pytest.raises(ValueError) as err:
        quantity_to_bytes(bad, "spec.limits.perPod.vram")
    assert "spec.limits.perPod.vram" in str(err.value) and repr(bad) in str(err.value)


@pytest.mark.parametrize(
    "huge",
    [
        "1e9999999",  # a ten-million-digit integer if converted
        "9e999999999999999999",  # beyond Python's own Decimal exponent range
        "1e400",
        "2e308",
        "1E400",
        "1.0000000000000000001e9999999",
        "9007199254740993",  # 2^53 + 1
        "8.000000000000001Pi",
        "9Ei",
        2**53 + 1,
        10**400,
    ],
)
def test_bytes_above_the_bound_are_refused_before_conversion(huge):
    with pytest.raises(OutOfRange) as err:
        quantity_to_bytes(huge, "perPod.vram")
    assert err.value.above
    assert "perPod.vram" in str(err.value) and "8Pi" in str(err.value)


def test_a_custom_maximum_names_itself():
    with pytest.raises(OutOfRange, match="above the maximum of 1000 bytes"):
        quantity_to_bytes("1001", maximum=1000)
    assert quantity_to_bytes("1k", maximum=1000) == 1000


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("500m", Decimal("0.5")),
        ("1.0000000001", Decimal("1.000000001")),  # rounded up to a whole nano, as apimachinery does
        ("-1.0000000001", Decimal("-1.000000001")),  # away from zero
        ("1e-9", Decimal("1e-9")),
        ("-1e-400", Decimal("-1e-9")),
        (0.25, Decimal("0.25")),
        (Decimal("3"), Decimal(3)),
        (str(2**63 - 1), QUANTITY_MAX),
        ("1.0000000000000000000000000000000001Ki", Decimal("1024.000000001")),  # no 28-digit rounding
    ],
)
def test_quantity_decimal(value, expected):
    assert quantity_decimal(value) == expected


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), Decimal("NaN"), True, None, [1], "1" * 65])
def test_quantity_decimal_rejects_non_quantities(bad):
    with pytest.raises(ValueError) as err:
        quantity_decimal(bad, "resources.cpu")
    assert "resources.cpu" in str(err.value)
    assert len(str(err.value)) < 200  # a long input is not echoed in full


@pytest.mark.parametrize(
    ("value", "above"), [(str(2**63), True), ("-9.3e18", False), ("-1e400", False), (-(2**64), False)]
)
def test_quantity_decimal_beyond_int64(value, above):
    with pytest.raises(OutOfRange) as err:
        quantity_decimal(value)
    assert err.value.above is above


_SUFFIX = {
    "": 1,
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def _exact_nano_up(x: Fraction) -> Fraction:
    """apimachinery: a value is rounded up (away from zero) to a whole nano."""
    scaled = x * 10**9
    whole = -((-abs(scaled)) // 1)  # ceil of the magnitude
    return Fraction(int(whole) * (1 if x >= 0 else -1), 10**9)


@given(
    st.integers(min_value=0, max_value=10**20),
    st.integers(min_value=0, max_value=12),
    st.one_of(st.sampled_from(sorted(_SUFFIX)), st.integers(min_value=-130, max_value=130)),
    st.booleans(),
)
def test_quantity_decimal_is_exact_math(digits, decimals, suffix, negative):
    """An independent oracle (fractions): every grammatical quantity converts to
    its exact value rounded up to a nano, or is OutOfRange exactly when its
    magnitude exceeds 2^63-1, whatever its exponent."""
    mantissa = Fraction(digits, 10**decimals)
    text = f"{'-' if negative else ''}{Decimal(digits).scaleb(-decimals):f}"
    if isinstance(suffix, int):
        text += f"e{suffix}"
        value = mantissa * Fraction(10) ** suffix
    else:
        text += suffix
        value = mantissa * _SUFFIX[suffix]
    value = -value if negative else value
    if abs(value) > 2**63 - 1:
        with pytest.raises(OutOfRange):
            quantity_decimal(text)
        return
    assert Fraction(quantity_decimal(text)) == _exact_nano_up(value)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("300ms", 0.3), ("0s", 0), ("2h45m10s", 9910)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0.1h", 360 * 10**9),
        ("1.0000000001s", 10**9),  # Go truncates below a nanosecond
        ("1.9999999999s", 1_999_999_999),
        ("1m1m", 120 * 10**9),  # Go adds repeated units
        ("1µs1us1ns", 2001),
        ("0." + "9" * 40 + "h", 3_600_000_000_000),  # digits beyond int64 ignored, then float64 rounding (Go)
        ("2562047h47m16.854775807s", GO_DURATION_MAX_NS),
    ],
)
def test_duration_ns_is_go_arithmetic(text, ns):
    """Expected values are what Go 1.26's time.ParseDuration returns for the same text."""
    assert duration_ns(text) == ns


@pytest.mark.parametrize("huge", ["2562047h47m16.854775808s", "99999999999999h", "9" * 60 + "h", "2562048h"])
def test_durations_beyond_go_are_out_of_range(huge):
    with pytest.raises(
        OutOfRange, match=r"escalation.after: duration .* is above the maximum of 2562047h47m16.854775807s"
    ):
        parse_duration(huge, "escalation.after")


def test_duration_maximum():
    assert duration_ns("720h", maximum_ns=720 * 3600 * 10**9) == 720 * 3600 * 10**9
    with pytest.raises(OutOfRange, match="above the maximum of 720h"):
        duration_ns("720h0.000000001s", maximum_ns=720 * 3600 * 10**9)


@pytest.mark.parametrize("bad", ["5 minutes", "-1s", "10", "1d", "", "m", ".5s", "1" * 64 + "s", None])
def test_duration_errors_name_field(bad):
    with pytest.raises(ValueError, match="tolerance.duration"):
        parse_duration(bad, "tolerance.duration")


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (720 * 3600 * 10**9, "720h"),
        (5400 * 10**9, "1h30m"),
        (1_500_000_000, "1.5s"),
        (30 * 10**9, "30s"),
        (90 * 10**9, "1m30s"),
        (3610 * 10**9, "1h10s"),
        (10_500_000_000, "10.5s"),
        (GO_DURATION_MAX_NS, "2562047h47m16.854775807s"),
    ],
)
def test_format_duration(ns, text):
    assert format_duration(ns) == text
    assert duration_ns(text) == ns


@given(st.integers(min_value=0, max_value=2**50))
def test_format_bytes_round_trips_within_rounding(n):
    text = format_bytes(n)
    assert quantity_to_bytes(text) == pytest.approx(n, rel=0.05, abs=1)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m"),
        (270.5, "4m30s"),
        (3599.99, "59m59s"),
        (3600, "1h"),
        (3725.9, "1h2m"),
        (60470.2, "16h47m"),
        (100 * 3600 + 59, "100h"),
    ],
)
def test_format_seconds_truncates_for_people(seconds, text):
    assert format_seconds(seconds) == text
    # a Go duration, the one format_duration writes, never more than the time it stands for
    assert parse_duration(text) <= seconds
    assert format_duration(duration_ns(text)) == text


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_format_seconds_refuses_what_is_no_duration(bad):
    with pytest.raises(ValueError, match="duration"):
        format_seconds(bad)
