"""Kubernetes quantities and Go-style durations.

Quantities are parsed by the Kubernetes Python client's
``kubernetes.utils.parse_quantity`` (the same grammar as apimachinery's
``resource.Quantity``); durations follow Go's ``time.ParseDuration`` grammar
(``300ms``, ``1.5h``, ``2h45m``).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated

from kubernetes.utils import parse_quantity
from pydantic import AfterValidator, Field

# A non-negative Kubernetes quantity: digits, optional fraction, optional
# binary/decimal SI suffix or exponent (apimachinery's grammar without the sign).
QUANTITY_PATTERN = r"^(\+)?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"

# Go's time.ParseDuration grammar, restricted to non-negative values.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT_SECONDS = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "µs": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}


def quantity_decimal(value: str | int | float) -> Decimal:
    """Return a Kubernetes quantity (``"500m"``, ``"2"``, ``"40Gi"``) as an exact Decimal.

    The one place engine and policy code parse quantities, so that they need
    no Kubernetes client import. Raises ``ValueError`` (or ``TypeError``) from
    ``kubernetes.utils.parse_quantity`` when the value is not a quantity.
    """
    return Decimal(parse_quantity(value))


def quantity_to_bytes(value: str | int, field: str = "quantity") -> int:
    """Return a non-negative quantity (``"40Gi"``, ``"512Mi"``, ``1000``) as whole bytes.

    Fractions of a byte round up, as apimachinery's ``Quantity.Value()`` does.
    Raises ``ValueError`` naming ``field`` and the value when it is not a valid
    non-negative quantity.
    """
    try:
        parsed = parse_quantity(value)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{field}: invalid quantity {value!r}: {err}") from None
    if parsed < 0:
        raise ValueError(f"{field}: quantity {value!r} must not be negative")
    return int(parsed.to_integral_value(rounding="ROUND_CEILING"))


def parse_duration(value: str, field: str = "duration") -> float:
    """Return a Go-style duration string (``"30s"``, ``"1h30m"``) in seconds.

    Raises ``ValueError`` naming ``field`` and the value when it does not match
    Go's ``time.ParseDuration`` grammar or is negative.
    """
    if not isinstance(value, str) or not re.fullmatch(DURATION_PATTERN, value):
        raise ValueError(f"{field}: invalid duration {value!r} (want Go syntax such as 30s, 10m, 1h30m)")
    total = sum(Decimal(n) * _DURATION_UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))
    return float(total)


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


def _check_quantity(value: str) -> str:
    quantity_to_bytes(value)
    return value


def _check_duration(value: str) -> str:
    parse_duration(value)
    return value


Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN, max_length=64),
    AfterValidator(_check_quantity),
]
"""A non-negative Kubernetes quantity string such as ``40Gi``."""

Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, max_length=64),
    AfterValidator(_check_duration),
]
"""A Go-style duration string such as ``30s`` or ``10m``."""
