"""Kubernetes quantities and Go-style durations, parsed within bounds.

Quantities follow apimachinery's ``resource.Quantity`` grammar (checked here,
see ``QUANTITY_GRAMMAR``) and are converted by the Kubernetes Python client's
``kubernetes.utils.parse_quantity``, then rounded up to a whole nano as
``resource.ParseQuantity`` does. ``parse_quantity`` alone accepts Python's
Decimal syntax (``NaN``, ``Infinity``, ``1_000``, `` 1``) and an exponent of any
size, which ``int()`` then turns into a number with millions of digits
(``1e9999999``): the text is checked first, and a value beyond the bound is
rejected before anything is converted.

Durations follow Go's ``time.ParseDuration``, its grammar (restricted to
non-negative values with units, ``DURATION_PATTERN``) and its arithmetic:
whole nanoseconds, fractions through float64 as Go computes them, so that the
API server's CEL ``duration()`` and this module agree on every value. They
are written back the same way (``format_duration``; ``format_seconds`` for
people), and bytes with ``format_bytes``.

Bounds on API fields (VRAM limits, delays) live in :mod:`vramguard_api.bounds`.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import ROUND_CEILING, ROUND_UP, Decimal, localcontext

from kubernetes.utils import parse_quantity

# A non-negative Kubernetes quantity: digits, optional fraction, optional
# binary/decimal SI suffix or exponent (apimachinery's grammar without the sign).
QUANTITY_PATTERN = r"^(\+)?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
# apimachinery's grammar with the sign: groups sign, mantissa, suffix, exponent.
QUANTITY_GRAMMAR = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([KMGTPE]i|[numkMGTPE])|[eE]([+-]?[0-9]+))?")

# Go's time.ParseDuration grammar, restricted to non-negative values with units.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+)(?:\.([0-9]+))?(ns|us|µs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
_DURATION = re.compile(DURATION_PATTERN)

MAX_TEXT = 64
"""Longest quantity or duration text accepted (the API fields' maxLength)."""
MAX_BYTES = 2**53
"""Largest byte count anywhere in the API: every client (float64, JavaScript) holds it exactly."""
QUANTITY_MAX = Decimal(2**63 - 1)
"""Largest quantity magnitude: what apimachinery's ``Quantity.Value()`` (int64) holds."""
GO_DURATION_MAX_NS = 2**63 - 1
"""Largest Go ``time.Duration`` (2562047h47m16.854775807s)."""
EXPONENT_LIMIT = 99
"""An exponent beyond ±99 decides the value's side of every bound without converting it."""

_NANO = Decimal("1e-9")
_PRECISION = 200  # digits: exact for a 64-character mantissa times any suffix


class OutOfRange(ValueError):
    """A value that parses but lies beyond a bound; ``above`` says on which side."""

    def __init__(self, message: str, above: bool) -> None:
        super().__init__(message)
        self.above = above


def show(value: object) -> str:
    """``repr(value)`` cut to 80 characters, so that an error never echoes a huge input."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} characters)"


def quantity_decimal(value: str | int | float | Decimal, field: str = "quantity") -> Decimal:
    """Return a Kubernetes quantity (``"500m"``, ``"2"``, ``"40Gi"``) as an exact Decimal.

    The one place engine, policy and agent code parse quantities. The value is
    rounded up (away from zero) to a whole nano, as apimachinery does. Raises
    ``ValueError`` naming ``field`` and the value when it is not a quantity or
    longer than ``MAX_TEXT`` characters, and ``OutOfRange`` (a ``ValueError``)
    when its magnitude is above ``QUANTITY_MAX``; nothing is converted first.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise ValueError(f"{field}: invalid quantity {show(value)}: want a string such as 500m, 2 or 40Gi")
    if isinstance(value, int):
        return _within_max(Decimal(value) if abs(value) <= QUANTITY_MAX else None, value, field, value > 0)
    if not isinstance(value, str):
        if not Decimal(value).is_finite():
            raise ValueError(f"{field}: invalid quantity {show(value)}: not a finite number")
        return _round_nano(_within_max(Decimal(value), value, field, value > 0))
    if len(value) > MAX_TEXT:
        raise ValueError(f"{field}: quantity {show(value)} is longer than {MAX_TEXT} characters")
    return _text_quantity(value, field)


# Specs, policies and implicit budgets repeat a few texts ("20Gi", "500m")
# thousands of times a pass; a Decimal is immutable, so a parse can be shared.
# Errors are not cached (lru_cache caches only returns).
@functools.lru_cache(maxsize=4096)
def _text_quantity(value: str, field: str) -> Decimal:
    """A quantity's text (at most ``MAX_TEXT`` characters) as an exact Decimal (see ``quantity_decimal``)."""
    match = QUANTITY_GRAMMAR.fullmatch(value)
    if match is None:
        hint = quantity_hint(value)
        raise ValueError(f"{field}: invalid quantity {show(value)}: want a Kubernetes quantity such as 500m, 2 or 40Gi"
                         + (f"; {hint}" if hint else ""))
    sign, mantissa, _suffix, exponent = match.groups()
    if exponent is not None and abs(int(exponent)) > EXPONENT_LIMIT:
        if not mantissa.strip("0."):
            return Decimal(0)
        if exponent.startswith("-"):
            # apimachinery rounds a non-zero value up to the smallest it holds, 1n
            return -_NANO if sign == "-" else _NANO
        return _within_max(None, value, field, sign != "-")
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        parsed = parse_quantity(value)
    return _round_nano(_within_max(parsed, value, field, sign != "-"))


_SUFFIXES = {"k": "k", "m": "M", "g": "G", "t": "T", "p": "P", "e": "E"}


def quantity_hint(text: str) -> str | None:
    """What the user likely meant by a quantity ``text`` that does not parse, or None.

    ``20GB`` / ``20gb``: ``write 20G (10^9 bytes) or 20Gi (2^30 bytes)``; ``20gi``:
    ``write 20Gi``; ``20 Gi``: ``write 20Gi (no space)``; ``-20Gi``: ``must not be
    negative``. Suffixes follow apimachinery's resource.Quantity (decimal k M G T P E,
    binary Ki Mi Gi Ti Pi Ei)."""
    s = text.strip()
    if s.startswith("-"):
        return "must not be negative"
    if " " in s:
        joined = s.replace(" ", "")
        return f"write {joined} (no space)" if re.fullmatch(QUANTITY_PATTERN, joined) else None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)\s*([kKmMgGtTpPeE])(i?)([bB]?)", s)
    if m is None:
        return None
    number, prefix, binary, byte = m.groups()
    decimal, iec = f"{number}{_SUFFIXES[prefix.lower()]}", f"{number}{prefix.upper()}i"
    if binary:
        return f"write {iec}"
    if byte:
        return f"write {decimal} (10^{3 * (list(_SUFFIXES).index(prefix.lower()) + 1)} bytes) or {iec} (2^" \
               f"{10 * (list(_SUFFIXES).index(prefix.lower()) + 1)} bytes)"
    return None


def _within_max(parsed: Decimal | None, value: object, field: str, positive: bool) -> Decimal:
    """``parsed`` when its magnitude is at most ``QUANTITY_MAX``; None means beyond."""
    if parsed is None or abs(parsed) > QUANTITY_MAX:
        raise OutOfRange(
            f"{field}: quantity {show(value)} is beyond ±(2^63-1), the largest quantity Kubernetes holds",
            above=positive,
        )
    return parsed


def _round_nano(parsed: Decimal) -> Decimal:
    exponent = parsed.as_tuple().exponent
    if not isinstance(exponent, int) or exponent >= -9:
        return parsed
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        return parsed.quantize(_NANO, rounding=ROUND_UP)


def _parse_quantity(value: str | int, field: str = "quantity", *, maximum: int = MAX_BYTES) -> int:
    """Return a non-negative quantity (``"40Gi"``, ``"512Mi"``, ``1000``) as whole bytes.

    Fractions of a byte round up, as apimachinery's ``Quantity.Value()`` does.
    Raises ``ValueError`` naming ``field`` and the value when it is not a valid
    non-negative quantity, and ``OutOfRange`` when it is above ``maximum``
    bytes (default ``MAX_BYTES``, 8Pi), checked before any integer is built.
    """
    try:
        parsed = quantity_decimal(value, field)
    except OutOfRange as err:
        if not err.above:
            raise ValueError(f"{field}: quantity {show(value)} must not be negative") from None
        parsed = None
    if parsed is not None and parsed < 0:
        raise ValueError(f"{field}: quantity {show(value)} must not be negative")
    if parsed is None or parsed > maximum:
        bound = (
            "8Pi (2^53 bytes, the largest byte count every client holds exactly)"
            if maximum == MAX_BYTES
            else f"{maximum} bytes"
        )
        raise OutOfRange(f"{field}: {show(value)} is above the maximum of {bound}", above=True)
    return int(parsed.to_integral_value(rounding=ROUND_CEILING))


def _parse_duration(value: str, field: str = "duration", *, maximum_ns: int = GO_DURATION_MAX_NS) -> int:
    """Return a Go-style duration string (``"30s"``, ``"1h30m"``) in whole nanoseconds.

    The arithmetic is Go's ``time.ParseDuration``: whole units exactly, a
    fraction as ``int64(float64(f) * (float64(unit) / scale))``. Raises
    ``ValueError`` naming ``field`` and the value when the text is not in that
    grammar (non-negative, units required) or longer than ``MAX_TEXT``, and
    ``OutOfRange`` when it is above ``maximum_ns`` (default: Go's largest duration).
    """
    if not isinstance(value, str) or len(value) > MAX_TEXT or not _DURATION.fullmatch(value):
        raise ValueError(f"{field}: invalid duration {show(value)} (want Go syntax such as 30s, 10m, 1h30m)")
    total = 0
    for whole, fraction, unit in _DURATION_PART.findall(value):
        total += int(whole) * _UNIT_NS[unit]
        if fraction:
            digits, scale = _leading_fraction(fraction)
            total += int(float(digits) * (float(_UNIT_NS[unit]) / scale))
    if total > maximum_ns:
        raise OutOfRange(
            f"{field}: duration {show(value)} is above the maximum of {format_duration(maximum_ns)}", above=True
        )
    return total


def _leading_fraction(digits: str) -> tuple[int, float]:
    """Go's ``time.leadingFraction``: the fraction's digits as an integer and
    its scale, ignoring digits once the integer would overflow int64."""
    x, scale = 0, 1.0
    for c in digits:
        if x > (2**63 - 1) // 10:
            break
        y = x * 10 + int(c)
        if y > 2**63:
            break
        x, scale = y, scale * 10
    return x, scale


def parse_duration(value: str, field: str = "duration", *, maximum_ns: int = GO_DURATION_MAX_NS) -> float:
    """Return a Go-style duration string (``"30s"``, ``"1h30m"``) in seconds.

    As :func:`duration_ns` (same errors), divided by 10^9.
    """
    return duration_ns(value, field, maximum_ns=maximum_ns) / 1_000_000_000


def format_duration(ns: int) -> str:
    """Format whole nanoseconds as a compact Go-style duration (``"720h"``, ``"1h30m"``, ``"0s"``)."""
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    seconds = f"{Decimal(rest) / 10**9:f}" if rest else ""
    if "." in seconds:  # only a fraction's trailing zeros go: 30s stays 30s
        seconds = seconds.rstrip("0").rstrip(".")
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{seconds}s" if seconds else "")
    return text or "0s"


def format_seconds(seconds: float) -> str:
    """Format a duration in seconds for people: :func:`format_duration`'s text of
    it truncated to whole minutes from an hour up, to whole seconds below
    (``"1h2m"``, ``"4m30s"``, ``"42s"``, ``"0s"``).

    The one way vramguard shows a duration (Events, ``vramguard analyze``, the
    demo); truncated, so a projected time to a limit is never rounded up.
    Raises ``ValueError`` naming the value when it is negative or not finite.
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration: want a finite number of seconds >= 0, got {seconds!r}")
    s = int(seconds)
    return format_duration((s - s % 60 if s >= 3600 else s) * 1_000_000_000)


def format_bytes(value: int | float | None) -> str:
    """Format bytes as a short binary quantity (``"41.5Gi"``); ``"-"`` for None."""
    if value is None:
        return "-"
    amount = float(value)
    for suffix in ("", "Ki", "Mi", "Gi", "Ti", "Pi"):
        if abs(amount) < 1024 or suffix == "Pi":
            text = f"{amount:.1f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
        amount /= 1024
    raise AssertionError("unreachable")


# Budgets and ladders are parsed at every evaluation and hold few distinct
# strings, so their values are cached; only plain str and int are (an
# unhashable value, a list, must still raise the clear ValueError, and True
# must not hit the entry of 1).
_quantity_cached = functools.lru_cache(maxsize=4096)(_parse_quantity)
_duration_cached = functools.lru_cache(maxsize=4096)(_parse_duration)


def quantity_to_bytes(value: str | int, field: str = "quantity", *, maximum: int = MAX_BYTES) -> int:
    """A non-negative quantity as whole bytes: ``_parse_quantity`` (the
    grammar, rounding and the ValueError/OutOfRange raised are documented
    there), cached for plain str and int values."""
    if type(value) in (str, int):
        return _quantity_cached(value, field, maximum=maximum)
    return _parse_quantity(value, field, maximum=maximum)


def duration_ns(value: str, field: str = "duration", *, maximum_ns: int = GO_DURATION_MAX_NS) -> int:
    """A Go-style duration in whole nanoseconds: ``_parse_duration`` (the
    grammar and the ValueError/OutOfRange raised are documented there), cached
    for plain str values."""
    if type(value) is str:
        return _duration_cached(value, field, maximum_ns=maximum_ns)
    return _parse_duration(value, field, maximum_ns=maximum_ns)
