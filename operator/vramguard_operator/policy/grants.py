"""Limits in bytes with their source, and the memory a scheduler or device
plugin granted a pod on each of its devices.

A grant is what another system booked for the pod: a DRA claim's consumed
memory capacity (``dra.py``) or a GPU sharer's allocation annotation
(``sharers.py``). It names the devices by UUID where it can (``devices``), or
applies to each of the pod's devices where it cannot (``each``). Several
grants on one device: the strictest wins. Malformed inputs become
``PodProblem``s, never a partial grant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vramguard_api.units import format_bytes

EVENT_MALFORMED_ALLOCATION = "MalformedAllocation"
"""Event reason: a grant's annotation or claim could not be read; it is ignored."""
EVENT_ALLOCATED_DEVICE_MISSING = "AllocatedDeviceMissing"
"""Event reason: a claim's allocated device is in no ResourceSlice; no limit is set from it."""


@dataclass(frozen=True, slots=True)
class EffectiveLimit:
    """A limit in bytes, where it came from (``source``: ``node/time-slicing:4``,
    ``dra/<claim>``, ...; docs/allocations.md lists them) and a short human
    explanation of the arithmetic (``detail``)."""

    bytes: int
    source: str
    detail: str = ""

    def describe(self) -> str:
        """``19.8Gi from node/time-slicing:4 (79.2Gi usable / 4)``."""
        extra = f" ({self.detail})" if self.detail else ""
        return f"{format_bytes(self.bytes)} from {self.source}{extra}"


def strictest(*limits: EffectiveLimit | None) -> EffectiveLimit | None:
    """The smallest of the given limits (the first of equal ones); None when all are None."""
    return min((x for x in limits if x is not None), key=lambda x: x.bytes, default=None)


@dataclass(frozen=True, slots=True)
class PodProblem:
    """A problem with one pod's grants, for a Warning Event on the pod: the
    Event ``reason`` and a ``message`` naming the annotation or claim and the value."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Grant:
    """Memory one system granted a pod: by device UUID (``devices``) and/or on
    each of its devices (``each``, when the grant does not name them)."""

    devices: Mapping[str, EffectiveLimit] = field(default_factory=dict)
    each: EffectiveLimit | None = None


@dataclass(frozen=True, slots=True)
class Grants:
    """Every grant of one pod, and the problems met reading them."""

    grants: tuple[Grant, ...] = ()
    problems: tuple[PodProblem, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.grants)

    def each_device(self) -> EffectiveLimit | None:
        """The strictest limit that applies to each of the pod's devices."""
        return strictest(*(g.each for g in self.grants))

    def by_device(self) -> dict[str, EffectiveLimit]:
        """The strictest named limit per device UUID (``each`` limits not included)."""
        out: dict[str, EffectiveLimit] = {}
        for g in self.grants:
            for uuid, limit in g.devices.items():
                best = strictest(out.get(uuid), limit)
                assert best is not None
                out[uuid] = best
        return out

    def plus(self, other: Grants) -> Grants:
        """Both sets of grants and problems."""
        return Grants(self.grants + other.grants, self.problems + other.problems)


def combine(parts: Iterable[Grants]) -> Grants:
    """All ``parts`` as one ``Grants``."""
    out = Grants()
    for p in parts:
        out = out.plus(p)
    return out
