"""Memory limit shapes shared by budgets and policies."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from .meta import APIModel
from .units import Quantity, quantity_to_bytes


class MemoryLimit(APIModel):
    """VRAM and host RAM limits for a pod, or for the total over a set of pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.vram) || has(self.ram)", "message": "at least one of vram or ram must be set"}
            ]
        }
    )

    vram: Quantity | None = Field(
        default=None,
        description="GPU memory (VRAM) limit as a Kubernetes quantity, e.g. 40Gi; for a pod, summed over all its devices.",
    )
    ram: Quantity | None = Field(
        default=None,
        description="Host memory limit on the RAM working set (the kubelet's definition: usage minus inactive file), e.g. 64Gi.",
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
                {
                    "rule": "!has(self.fraction) || (self.fraction > 0.0 && self.fraction <= 1.0)",
                    "message": "fraction must be in (0, 1]",
                    "fieldPath": ".fraction",
                },
            ]
        }
    )

    vram: Quantity | None = Field(
        default=None, description="VRAM a pod may hold on one device, as a Kubernetes quantity, e.g. 20Gi."
    )
    fraction: float | None = Field(
        default=None,
        description="Share of the device's usable memory (total minus reserved) a pod may hold on it, in (0, 1].",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> DeviceLimit:
        if (self.vram is None) == (self.fraction is None):
            raise ValueError("exactly one of vram or fraction must be set")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"fraction: {self.fraction} must be in (0, 1]")
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


def le_rule(a: str, b: str, message: str) -> dict[str, Any]:
    """A CEL rule saying quantity field path ``a`` is at most ``b`` when both are set.

    Quantities compare through Kubernetes' CEL quantity library (``quantity(x).compareTo``).
    """
    rule = f"!({_has(a)} && {_has(b)}) || quantity(self.{a}).compareTo(quantity(self.{b})) <= 0"
    return {"rule": rule, "message": message}
