"""The regular expressions that stand in for the API server's quantity() and
duration() on hostile text (vramguard_api.bounds) never disagree with exact
arithmetic: the CEL rules and the models reach the same verdict on every text."""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from vramguard_api.bounds import (
    BIG_EXPONENT,
    DELAY,
    DURATION_DIGITS,
    GROWTH_PER_HOUR,
    MEMORY_LIMIT,
    THROTTLE_CPU,
    TINY_WHEN_BIG,
    QuantityBound,
)
from vramguard_api.units import DURATION_PATTERN, QUANTITY_PATTERN, OutOfRange, duration_ns, quantity_decimal

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


def _exact(text: str) -> Fraction:
    """The value apimachinery gives ``text`` (exact, rounded up to a nano); exponents of any size."""
    m = re.fullmatch(r"\+?([0-9.]+)(?:([KMGTPE]i|[numkMGTPE])|[eE]([+-]?[0-9]+))?", text)
    assert m is not None
    mantissa = Fraction(Decimal(m.group(1) if m.group(1) != "." else "0"))
    value = mantissa * (Fraction(10) ** int(m.group(3)) if m.group(3) else _SUFFIX[m.group(2) or ""])
    nanos = value * 10**9
    return Fraction(-((-nanos.numerator) // nanos.denominator), 10**9)


def _cel_accepts(bound: QuantityBound, text: str) -> tuple[bool, bool]:
    """(at least the minimum, at most the maximum) as the two CEL rules decide,
    quantity() taken as exact arithmetic; CEL's matches() is a regex search."""
    if re.search(BIG_EXPONENT, text):
        tiny = re.search(TINY_WHEN_BIG, text) is not None
        return not tiny, tiny
    value = _exact(text)
    return value >= _exact(bound.minimum), value <= _exact(bound.maximum)


quantity_text = st.builds(
    lambda plus, whole, frac, tail: f"{plus}{whole}{frac}{tail}",
    st.sampled_from(["", "+"]),
    st.one_of(
        st.just("0"),
        st.integers(0, 20).flatmap(lambda digits: st.integers(0, 10**digits)).map(str),
        st.text("0123456789", min_size=1, max_size=30),
    ),
    st.one_of(st.just(""), st.text("0123456789", max_size=15).map(lambda d: "." + d)),
    st.one_of(
        st.sampled_from(sorted(_SUFFIX)),
        st.builds(
            lambda e, sign, zeros, n: f"{e}{sign}{'0' * zeros}{n}",
            st.sampled_from("eE"),
            st.sampled_from(["", "+", "-"]),
            st.integers(0, 3),
            st.integers(0, 10**12),
        ),
    ),
).filter(lambda t: len(t) <= 64 and re.fullmatch(QUANTITY_PATTERN, t) is not None)


@given(quantity_text, st.sampled_from([MEMORY_LIMIT, GROWTH_PER_HOUR, THROTTLE_CPU]))
@example("0e400", MEMORY_LIMIT)
@example("0.000e+0400", MEMORY_LIMIT)
@example("+.0E999", THROTTLE_CPU)
@example("1e-400", MEMORY_LIMIT)
@example("1e400", MEMORY_LIMIT)
@example("1E99", THROTTLE_CPU)
@example("0.00000000000000000000000000000000000000000000001e100", MEMORY_LIMIT)
@example("1048575.9999999999", MEMORY_LIMIT)
@example("9007199254740992.000000001", MEMORY_LIMIT)
@example("0.0009999999999", THROTTLE_CPU)
def test_the_cel_rules_and_the_models_agree_on_every_quantity(text, bound):
    at_least, at_most = _cel_accepts(bound, text)
    problem = bound.problem(text)
    if at_least and at_most:
        assert problem is None
    elif not at_least:
        assert problem == f"{text} is below the minimum of {bound.low}"
    else:
        assert problem == f"{text} is above the maximum of {bound.high}"


duration_text = (
    st.lists(
        st.builds(
            lambda zeros, whole, frac, unit: f"{'0' * zeros}{whole}{frac}{unit}",
            st.integers(0, 3),
            st.integers(0, 20).flatmap(lambda digits: st.integers(0, 10**digits)),
            st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=12).map(lambda d: "." + d)),
            st.sampled_from(["ns", "us", "µs", "ms", "s", "m", "h"]),
        ),
        min_size=1,
        max_size=5,
    )
    .map("".join)
    .filter(lambda t: len(t) <= 64)
)


@given(duration_text)
@example("720h")
@example("719h59m59.999999999s")
@example("43200m")
@example("2592000s")
@example("2592000000ms")
@example("2592000000000us")
@example("2592000000000µs")
@example("2592000000000000ns")
@example("0000720h0000m")
@example("721h")
@example("9999h" * 12)
@example("99999999s" * 7)
def test_the_duration_guard_never_hides_a_value_within_30_days_and_never_lets_go_overflow(text):
    assert re.fullmatch(DURATION_PATTERN, text)
    guarded = re.search(DURATION_DIGITS, text) is not None
    exact = duration_ns(text, maximum_ns=10**40)
    if guarded:
        assert exact <= 200_000 * 3600 * 10**9  # far from Go's int64 limit: duration() cannot fail
    else:
        assert exact > 720 * 3600 * 10**9  # the rule's answer without duration() is right
    cel_accepts = guarded and exact <= 720 * 3600 * 10**9
    assert (DELAY.problem(text) is None) is cel_accepts


def test_out_of_range_needs_no_conversion():
    """A value far beyond any bound is classified by its text alone."""
    with pytest.raises(OutOfRange):
        quantity_decimal("9" * 40 + "e" + "9" * 22)
