"""Memory limit shapes shared by budgets and policies."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from .bounds import MEMORY_LIMIT, MemoryQuantity, quantity_guard
from .meta import APIModel
from .units import quantity_to_bytes


class MemoryLimit(APIModel):
    """VRAM and host RAM limits for a pod, or for the total over a set of pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.vram) || has(self.ram)", "message": "at least one of vram or ram must be set"}
            ]
        }
    )

    vram: MemoryQuantity | None = Field(
        default=None,
        description="GPU memory (VRAM) limit as a Kubernetes quantity, e.g. 40Gi; for a pod, summed over all its "
        f"devices. {MEMORY_LIMIT.doc}",
    )
    ram: MemoryQuantity | None = Field(
        default=None,
        description="Host memory limit on the RAM working set (the kubelet's definition: usage minus inactive file), "
        f"e.g. 64Gi. {MEMORY_LIMIT.doc}",
    )

    @model_validator(mode="after")
    def _one_set(self) -> MemoryLimit:
        if self.vram is None and self.ram is None:
            raise ValueError("at least one of vram or ram must be set")
        return self

    def vram_bytes(self) -> int | None:
        """The VRAM limit in bytes, or None when unset."""
        return None if self.vram is None else quantity_to_bytes(self.vram)

    def ram_bytes(self) -> int | None:
        """The RAM limit in bytes, or None when unset."""
        return None if self.ram is None else quantity_to_bytes(self.ram)


class DeviceLimit(APIModel):
    """A limit on the VRAM one pod holds on each single device (a GPU or a MIG device):
    either bytes or a fraction of the device's usable memory (total minus reserved)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.vram) != has(self.fraction)",
                    "message": "exactly one of vram or fraction must be set",
                },
            ]
        }
    )

    vram: MemoryQuantity | None = Field(
        default=None,
        description=f"VRAM a pod may hold on one device, as a Kubernetes quantity, e.g. 20Gi. {MEMORY_LIMIT.doc}",
    )
    # (0, 1] as OpenAPI bounds: the API server's message then names the value too
    fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Share of the device's usable memory (total minus reserved) a pod may hold on it, in (0, 1].",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceLimit:
        if (self.vram is None) == (self.fraction is None):
            raise ValueError("exactly one of vram or fraction must be set")
        return self

    def bytes_for(self, usable_bytes: int | None) -> int | None:
        """The limit in bytes on a device with ``usable_bytes`` usable memory;
        None when it is a fraction and the device's usable memory is unknown."""
        if self.vram is not None:
            return quantity_to_bytes(self.vram)
        if usable_bytes is None or self.fraction is None:
            return None
        return int(usable_bytes * self.fraction)


def _has(path: str) -> str:
    """CEL presence test for a dotted path: has(self.a) && has(self.a.b)."""
    parts = path.split(".")
    return " && ".join(f"has(self.{'.'.join(parts[: i + 1])})" for i in range(len(parts)))


def le_message(a: str, a_value: str, b: str, b_value: str) -> str:
    """The message of :func:`le_rule`, for the model validators to say the same."""
    return f"{a} ({a_value}) must not be above {b} ({b_value})"


def le_rule(a: str, b: str) -> dict[str, Any]:
    """A CEL rule saying quantity field path ``a`` is at most ``b`` when both are set.

    Quantities compare through Kubernetes' CEL quantity library (``quantity(x).compareTo``),
    only when both can go through it (each field's own rules report the others).
    """
    both = f"{_has(a)} && {_has(b)} && {quantity_guard(a)} && {quantity_guard(b)}"
    rule = f"!({both}) || quantity(self.{a}).compareTo(quantity(self.{b})) <= 0"
    return {
        "rule": rule,
        "message": f"{a} must not be above {b}",
        "messageExpression": f"'{a} (' + self.{a} + ') must not be above {b} (' + self.{b} + ')'",
    }
