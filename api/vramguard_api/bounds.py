"""Bounds on the quantities and durations of the API, enforced identically by the
API server (CEL rules in the generated CRDs) and by the models (pydantic).

The bounds and the reasons for them are in docs/bounds.md: VRAM and RAM limits
1Mi to 8Pi (2^53 bytes), ``minGrowthPerHour`` 1Mi to 8Pi, a Throttle step's
``cpuLimit`` 1m to 1024, every delay at most 720h (30 days).

The CEL rules call ``quantity()`` and ``duration()`` only on text that the API
server's parsers hold cheaply: an exponent beyond ±99 (``1e400``) or a duration
part with more digits than any value within the bound could have is decided by
a regular expression first (apimachinery would silently wrap an exponent
beyond int32, or spend seconds on a ten-million-digit number; Go's
``ParseDuration`` fails beyond 2562047h). The Python checks reach the same
verdict on every text, through :mod:`vramguard_api.units`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from .units import (
    DURATION_PATTERN,
    MAX_BYTES,
    MAX_TEXT,
    QUANTITY_PATTERN,
    OutOfRange,
    duration_ns,
    quantity_decimal,
)

# |exponent| >= 100: decided without quantity() (see the module doc).
BIG_EXPONENT = r"[eE][+-]?0*[1-9][0-9]{2,}$"
# With a big exponent, the value is tiny (or zero) when the mantissa is zero or the exponent negative.
TINY_WHEN_BIG = r"^\+?[0.]+[eE]|[eE]-"
# Each duration part with at most as many digits as a value under 30 days can need
# (plus one); anything longer is above 720h, and nothing this regex accepts in 64
# characters overflows Go's int64 nanoseconds (at most ~200000h).
DURATION_DIGITS = (
    r"^(0*[0-9]{1,4}(\.[0-9]+)?h|0*[0-9]{1,6}(\.[0-9]+)?m|0*[0-9]{1,8}(\.[0-9]+)?s"
    r"|0*[0-9]{1,11}(\.[0-9]+)?ms|0*[0-9]{1,14}(\.[0-9]+)?(us|µs)|0*[0-9]{1,17}(\.[0-9]+)?ns)+$"
)


def cel_string(text: str) -> str:
    """A CEL string literal holding ``text`` (CEL accepts JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _matches(pattern: str) -> str:
    return f"self.matches({cel_string(pattern)})"


@dataclass(frozen=True)
class QuantityBound:
    """An inclusive range for a quantity field. ``minimum``/``maximum`` are
    quantities; ``low``/``high`` are the bounds as the messages state them."""

    minimum: str
    maximum: str
    low: str
    high: str
    doc: str

    def problem(self, value: str) -> str | None:
        """The message for a grammatical quantity outside the range, else None."""
        try:
            parsed = quantity_decimal(value)
        except OutOfRange as err:
            return self._above(value) if err.above else self._below(value)
        if parsed < quantity_decimal(self.minimum):
            return self._below(value)
        if parsed > quantity_decimal(self.maximum):
            return self._above(value)
        return None

    def _below(self, value: str) -> str:
        return f"{value} is below the minimum of {self.low}"

    def _above(self, value: str) -> str:
        return f"{value} is above the maximum of {self.high}"

    def rules(self) -> list[Any]:  # list[Any]: pydantic's JsonValue lists are invariant
        """The two CEL rules (``x-kubernetes-validations``) on the string field."""
        skip = f"!{_matches(QUANTITY_PATTERN)}"  # the schema's pattern reports it
        tiny = f"{_matches(TINY_WHEN_BIG)}"
        big = _matches(BIG_EXPONENT)
        at_least = f"quantity(self).compareTo(quantity({cel_string(self.minimum)})) >= 0"
        at_most = f"quantity(self).compareTo(quantity({cel_string(self.maximum)})) <= 0"
        return [
            {
                "rule": f"{skip} || ({big} ? !{tiny} : {at_least})",
                "message": f"must be at least {self.low}",
                "messageExpression": f"self + {cel_string(' is below the minimum of ' + self.low)}",
            },
            {
                "rule": f"{skip} || ({big} ? {tiny} : {at_most})",
                "message": f"must be at most {self.high}",
                "messageExpression": f"self + {cel_string(' is above the maximum of ' + self.high)}",
            },
        ]

    def check(self, value: str) -> str:
        """Pydantic validator: ``value`` unchanged, or ``ValueError`` with the message."""
        message = self.problem(value)
        if message is not None:
            raise ValueError(message)
        return value

    def field(self) -> Any:
        """The schema of the field: pattern, length and the CEL rules."""
        return Field(
            pattern=QUANTITY_PATTERN, max_length=MAX_TEXT, json_schema_extra={"x-kubernetes-validations": self.rules()}
        )


@dataclass(frozen=True)
class DurationBound:
    """An upper bound on a Go-style duration field (the lower bound is 0s)."""

    maximum: str
    high: str
    doc: str

    def problem(self, value: str) -> str | None:
        """The message for a grammatical duration above the maximum, else None."""
        try:
            duration_ns(value, maximum_ns=duration_ns(self.maximum))
        except OutOfRange:
            return f"{value} is above the maximum of {self.high}"
        return None

    def rules(self) -> list[Any]:  # list[Any]: pydantic's JsonValue lists are invariant
        """The CEL rule on the string field."""
        within = f"{_matches(DURATION_DIGITS)} && duration(self) <= duration({cel_string(self.maximum)})"
        return [
            {
                "rule": f"!{_matches(DURATION_PATTERN)} || ({within})",
                "message": f"must be at most {self.high}",
                "messageExpression": f"self + {cel_string(' is above the maximum of ' + self.high)}",
            }
        ]

    def check(self, value: str) -> str:
        """Pydantic validator: ``value`` unchanged, or ``ValueError`` with the message."""
        message = self.problem(value)
        if message is not None:
            raise ValueError(message)
        return value

    def field(self) -> Any:
        """The schema of the field: pattern, length and the CEL rule."""
        return Field(
            pattern=DURATION_PATTERN, max_length=MAX_TEXT, json_schema_extra={"x-kubernetes-validations": self.rules()}
        )


def clamp_limit_bytes(value: int) -> int:
    """``value`` bytes moved into MEMORY_LIMIT's range (1Mi to 8Pi), for limits
    vramguard derives itself (a sharer's grant, a node's share), which are no
    typos to reject: below 1Mi is no room at all, above 8Pi no limit at all."""
    return min(max(value, MIN_LIMIT_BYTES), MAX_BYTES)


def quantity_guard(path: str) -> str:
    """CEL test that quantity field ``self.<path>`` can go through ``quantity()``
    (grammatical, exponent within ±99); use it before comparing two fields."""
    return f"self.{path}.matches({cel_string(QUANTITY_PATTERN)}) && !self.{path}.matches({cel_string(BIG_EXPONENT)})"


def duration_guard(expr: str) -> str:
    """CEL test that duration ``expr`` can go through ``duration()`` without error."""
    return f"{expr}.matches({cel_string(DURATION_PATTERN)}) && {expr}.matches({cel_string(DURATION_DIGITS)})"


MIN_LIMIT_BYTES = 2**20
"""The smallest VRAM or RAM limit, 1Mi."""
_BYTES_MAX = "8Pi (2^53 bytes, the largest byte count every client holds exactly)"

MEMORY_LIMIT = QuantityBound(
    minimum="1Mi",
    maximum="8Pi",
    low="1Mi: a VRAM or RAM limit under 1Mi is rejected as a probable typo (m means milli: 10m is 0.01 bytes, 10Mi is 10 MiB)",
    high=_BYTES_MAX,
    doc="At least 1Mi (a smaller limit is rejected as a probable typo: 10m is 0.01 bytes, 10Mi is 10 MiB) "
    "and at most 8Pi (2^53 bytes).",
)
GROWTH_PER_HOUR = QuantityBound(
    minimum="1Mi",
    maximum="8Pi",
    low="1Mi per hour: slower growth is noise, not a leak (m means milli: 200m is 0.2 bytes, 200Mi is 200 MiB)",
    high=_BYTES_MAX + " per hour",
    doc="At least 1Mi (slower growth is noise; 200m would be 0.2 bytes) and at most 8Pi (2^53 bytes).",
)
THROTTLE_CPU = QuantityBound(
    minimum="1m",
    maximum="1024",
    low="1m (one millicore, the finest CPU amount Kubernetes applies)",
    high="1024 CPUs (a throttle target above it lowers nothing on any node)",
    doc="At least 1m and at most 1024 CPUs.",
)
DELAY = DurationBound(maximum="720h", high="720h (30 days)", doc="At most 720h (30 days).")

MemoryQuantity = Annotated[str, MEMORY_LIMIT.field(), AfterValidator(MEMORY_LIMIT.check)]
"""A VRAM or RAM limit: a quantity string from 1Mi to 8Pi."""
GrowthQuantity = Annotated[str, GROWTH_PER_HOUR.field(), AfterValidator(GROWTH_PER_HOUR.check)]
"""A growth rate per hour: a quantity string from 1Mi to 8Pi."""
CPUQuantity = Annotated[str, THROTTLE_CPU.field(), AfterValidator(THROTTLE_CPU.check)]
"""A throttle CPU limit: a quantity string from 1m to 1024."""
Delay = Annotated[str, DELAY.field(), AfterValidator(DELAY.check)]
"""A Go-style duration from 0s to 720h."""
