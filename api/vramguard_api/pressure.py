"""Device pressure: the free memory a GPU must keep, and what is done when it
falls under it (``devicePressure`` in a GPUMemoryPolicy and, as an override
for the pods it selects, in a GPUMemoryBudget).

The kubelet's eviction manager applied to GPU memory: when a device's free
memory (usable minus used, from its node's report) is under ``minFree`` — or,
with ``protectShares``, under the room a pod within its share still needs to
reach it — the pod on it most above its share is acted on at once, bypassing
the ladder's delays (docs/device-pressure.md). ``minFree`` is a percentage of the device's
usable memory (``"5%"``, as kubelet thresholds such as ``memory.available<10%``
are written) or a quantity (``"4Gi"``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from .bounds import MEMORY_LIMIT, cel_string
from .meta import APIModel
from .steps import Action
from .units import MAX_TEXT, QUANTITY_PATTERN, quantity_to_bytes

PressureAction = Literal[Action.EVICT]
"""What is done to the pod most above its share: ``Evict`` (the Eviction API).
An enum so that later actions (a driver-enforced cap, issue 14) fit beside it."""

DEFAULT_MIN_FREE = "5%"
MAX_MIN_FREE_PERCENT = Decimal(50)
"""Keeping more than half a device free is idling it, not protecting its pods."""

PERCENT_PATTERN = r"^[0-9]{1,3}(\.[0-9]{1,3})?%$"
MIN_FREE_PATTERN = f"({PERCENT_PATTERN})|({QUANTITY_PATTERN})"
_PERCENT = re.compile(PERCENT_PATTERN)
_ZERO_PERCENT = r"^0+(\.0+)?%$"
_OVER_FIFTY = r"^0*(50\.0*[1-9][0-9]*|5[1-9](\.[0-9]+)?|[6-9][0-9](\.[0-9]+)?|[1-9][0-9]{2}(\.[0-9]+)?)%$"
_MIN_FREE_DOC = (
    "A percentage of the device's usable memory (above 0% and at most 50%: keeping more free idles the device), "
    f"or a quantity: {MEMORY_LIMIT.doc}"
)


def min_free_problem(value: str) -> str | None:
    """Why ``value`` is no valid ``minFree`` (the API server's message), else None."""
    if value.endswith("%"):
        if not _PERCENT.match(value):
            return f"{value} is not a percentage such as 5% or 2.5%"
        try:
            pct = Decimal(value[:-1])
        except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
            return f"{value} is not a percentage"
        if pct <= 0:
            return f"{value} must be above 0%"
        if pct > MAX_MIN_FREE_PERCENT:
            return f"{value} is above the maximum of 50%: keeping more free idles the device"
        return None
    return MEMORY_LIMIT.problem(value)


def _check(value: str) -> str:
    message = min_free_problem(value)
    if message is not None:
        raise ValueError(message)
    return value


def _rules() -> list[Any]:
    """CEL rules: a percentage in (0, 50]; a quantity within MEMORY_LIMIT's bound
    (its rules skip text that is no quantity, such as a percentage)."""
    pct = "self.endsWith('%')"
    return [
        {
            "rule": f"!{pct} || !self.matches({cel_string(_ZERO_PERCENT)})",
            "message": "a percentage must be above 0%",
            "messageExpression": f"self + {cel_string(' must be above 0%')}",
        },
        {
            "rule": f"!{pct} || !self.matches({cel_string(_OVER_FIFTY)})",
            "message": "a percentage must be at most 50%",
            "messageExpression": f"self + {cel_string(' is above the maximum of 50%: keeping more free idles the device')}",
        },
        *MEMORY_LIMIT.rules(),
    ]


MinFree = Annotated[
    str,
    Field(pattern=MIN_FREE_PATTERN, max_length=MAX_TEXT, json_schema_extra={"x-kubernetes-validations": _rules()}),
    AfterValidator(_check),
]
"""``minFree``: ``"5%"`` (of usable memory, in (0, 50]) or a quantity from 1Mi to 8Pi."""


class DevicePressure(APIModel):
    """Free memory a device must keep, and what is done when it falls under it."""

    min_free: MinFree = Field(
        default=DEFAULT_MIN_FREE,
        alias="minFree",
        description="Free memory (usable minus used, from the node's report) each device must keep. "
        + _MIN_FREE_DOC
        + f" Default {DEFAULT_MIN_FREE}.",
    )
    protect_shares: bool = Field(
        default=True,
        alias="protectShares",
        description="Also keep free the room the pod within its share furthest below it needs to reach it, so that "
        "any pod within its share can always grow to its share: a device is then under pressure while its free "
        "memory is under minFree or under that room. false: minFree alone (the kubelet's rule).",
    )
    action: PressureAction = Field(
        default=Action.EVICT,
        description="What is done, at once (bypassing the escalation ladder's delays), to the pod on the device "
        "most above its share when free memory falls under minFree: Evict (the Eviction API; "
        "PodDisruptionBudgets and the eviction rate limit respected). Never a pod within its share.",
    )

    def min_free_fraction(self) -> float | None:
        """``minFree`` as a fraction of usable memory, None when it is a quantity."""
        if not self.min_free.endswith("%"):
            return None
        return float(Decimal(self.min_free[:-1]) / 100)

    def min_free_bytes(self) -> int | None:
        """``minFree`` in bytes, None when it is a percentage."""
        if self.min_free.endswith("%"):
            return None
        return quantity_to_bytes(self.min_free, "devicePressure.minFree")
