"""How each ``GPUMemoryPolicy`` field is read and how the applying policies'
values combine (``merge.merge``): a reader per field returns one policy's value
(None when unset) and a combiner picks the winner (``_smallest`` for limits,
``_largest`` for device-pressure thresholds, ``_first`` for opt-ins).
``FIELD_PATHS`` names each field as status and docs do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vramguard_api.policy import GPUMemoryPolicy

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Sourced(Generic[T]):
    """A merged value and the name of the policy it came from."""

    value: T
    policy: str

    @property
    def source(self) -> str:
        """``policy/<name>``, as status and annotations show it."""
        return f"policy/{self.policy}"


def _default_pod_vram(p: GPUMemoryPolicy) -> int | None:
    d = p.spec.defaults
    return None if d is None or d.per_pod is None else d.per_pod.vram_bytes()


def _default_pod_ram(p: GPUMemoryPolicy) -> int | None:
    d = p.spec.defaults
    return None if d is None or d.per_pod is None else d.per_pod.ram_bytes()


def _default_device_vram(p: GPUMemoryPolicy) -> int | None:
    d = p.spec.defaults
    if d is None or d.per_device is None or d.per_device.vram is None:
        return None
    return d.per_device.bytes_for(None)


def _default_device_fraction(p: GPUMemoryPolicy) -> float | None:
    d = p.spec.defaults
    return None if d is None or d.per_device is None else d.per_device.fraction


def _share_from_node(p: GPUMemoryPolicy) -> bool | None:
    # A policy's own explicit perDevice default replaces its node share (API field doc).
    d = p.spec.defaults
    if d is None:
        # devicePressure measures every pod against its share: without defaults, a
        # pressure rule gives pods no budget selects the node's (docs/device-pressure.md)
        return True if p.spec.device_pressure is not None else None
    return True if d.share_from_node and d.per_device is None else None


def _pressure_fraction(p: GPUMemoryPolicy) -> float | None:
    dp = p.spec.device_pressure
    return None if dp is None else dp.min_free_fraction()


def _pressure_bytes(p: GPUMemoryPolicy) -> int | None:
    dp = p.spec.device_pressure
    return None if dp is None else dp.min_free_bytes()


def _pressure_protect(p: GPUMemoryPolicy) -> bool | None:
    dp = p.spec.device_pressure
    return None if dp is None else dp.protect_shares


def _pressure_action(p: GPUMemoryPolicy) -> str | None:
    dp = p.spec.device_pressure
    return None if dp is None else dp.action


def _ceiling(level: str, kind: str) -> Callable[[GPUMemoryPolicy], int | None]:
    """Reader of ``ceilings.<level>.<kind>`` in bytes (level per_pod or total: a
    MemoryLimit; per_device with kind vram: a DeviceLimit given in bytes)."""

    def read(p: GPUMemoryPolicy) -> int | None:
        c = p.spec.ceilings
        limit = None if c is None else getattr(c, level)
        if limit is None:
            return None
        if level == "per_device":
            return None if limit.vram is None else limit.bytes_for(None)
        return limit.vram_bytes() if kind == "vram" else limit.ram_bytes()

    return read


def _ceiling_fraction(p: GPUMemoryPolicy) -> float | None:
    c = p.spec.ceilings
    return None if c is None or c.per_device is None else c.per_device.fraction


def _smallest(
    applying: Sequence[GPUMemoryPolicy], read: Callable[[GPUMemoryPolicy], T | None]
) -> Sourced[T] | None:
    best: Sourced[T] | None = None
    for p in applying:  # sorted by name: the first of equal values wins
        value = read(p)
        if value is not None and (best is None or value < best.value):  # type: ignore[operator]
            best = Sourced(value, p.metadata.name or "")
    return best


def _largest(
    applying: Sequence[GPUMemoryPolicy], read: Callable[[GPUMemoryPolicy], T | None]
) -> Sourced[T] | None:
    best: Sourced[T] | None = None
    for p in applying:  # sorted by name: the first of equal values wins
        value = read(p)
        if value is not None and (best is None or value > best.value):  # type: ignore[operator]
            best = Sourced(value, p.metadata.name or "")
    return best


def _first(
    applying: Sequence[GPUMemoryPolicy], read: Callable[[GPUMemoryPolicy], T | None]
) -> Sourced[T] | None:
    for p in applying:
        value = read(p)
        if value is not None:
            return Sourced(value, p.metadata.name or "")
    return None


Reader = Callable[[GPUMemoryPolicy], Any]
Combiner = Callable[[Sequence[GPUMemoryPolicy], Reader], Any]

FIELDS: dict[str, tuple[Reader, Combiner]] = {
    "default_pod_vram": (_default_pod_vram, _smallest),
    "default_pod_ram": (_default_pod_ram, _smallest),
    "default_device_vram": (_default_device_vram, _smallest),
    "default_device_fraction": (_default_device_fraction, _smallest),
    "share_from_node": (_share_from_node, _first),
    "ceiling_pod_vram": (_ceiling("per_pod", "vram"), _smallest),
    "ceiling_pod_ram": (_ceiling("per_pod", "ram"), _smallest),
    "ceiling_device_vram": (_ceiling("per_device", "vram"), _smallest),
    "ceiling_device_fraction": (_ceiling_fraction, _smallest),
    "ceiling_total_vram": (_ceiling("total", "vram"), _smallest),
    "ceiling_total_ram": (_ceiling("total", "ram"), _smallest),
    "eviction_per_minute": (lambda p: p.spec.eviction_rate_limit.per_minute, _smallest),
    "eviction_burst": (lambda p: p.spec.eviction_rate_limit.burst, _smallest),
    "inject_framework_caps": (lambda p: p.spec.inject_framework_caps or None, _first),
    # the most protective threshold wins: the largest of each kind (docs/device-pressure.md)
    "pressure_min_free_fraction": (_pressure_fraction, _largest),
    "pressure_min_free_bytes": (_pressure_bytes, _largest),
    "pressure_protect_shares": (_pressure_protect, _largest),  # True beats False
    "pressure_action": (_pressure_action, _first),
    # Share wins: a guarantee for the pods within their share (like injectFrameworkCaps, opt-in by any policy)
    "soft_limits": (lambda p: True if p.spec.soft_limits == "Share" else None, _first),
    # off when the first policy that says anything says off (unset: on; docs/oom.md)
    "termination_message_fallback": (lambda p: p.spec.termination_message_fallback, _first),
}
"""MergedPolicy field -> (reader of one policy's value or None, combiner)."""

FIELD_PATHS = {
    "mode": "mode",
    "default_pod_vram": "defaults.perPod.vram",
    "default_pod_ram": "defaults.perPod.ram",
    "default_device_vram": "defaults.perDevice.vram",
    "default_device_fraction": "defaults.perDevice.fraction",
    "share_from_node": "defaults.shareFromNode",
    "ceiling_pod_vram": "ceilings.perPod.vram",
    "ceiling_pod_ram": "ceilings.perPod.ram",
    "ceiling_device_vram": "ceilings.perDevice.vram",
    "ceiling_device_fraction": "ceilings.perDevice.fraction",
    "ceiling_total_vram": "ceilings.total.vram",
    "ceiling_total_ram": "ceilings.total.ram",
    "eviction_per_minute": "evictionRateLimit.perMinute",
    "eviction_burst": "evictionRateLimit.burst",
    "inject_framework_caps": "injectFrameworkCaps",
    "pressure_min_free_fraction": "devicePressure.minFree",
    "pressure_min_free_bytes": "devicePressure.minFree",
    "pressure_protect_shares": "devicePressure.protectShares",
    "pressure_action": "devicePressure.action",
    "soft_limits": "softLimits",
    "termination_message_fallback": "terminationMessageFallback",
}
"""MergedPolicy field -> the spec path it comes from, as status and docs name it."""
