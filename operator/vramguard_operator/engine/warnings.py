"""The warning threshold: limits whose usage is at ``warningThreshold × limit``
or more with no open violation, kept in ``status.warnings``.

A limit enters at the threshold and leaves below ``threshold − recovery margin``
(hysteresis); on unknown data a stored warning is carried over as it is. The
list is bounded; only a warning that is new (and kept) gets a ``Warn`` decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from vramguard_api.budget import LEAK_MEMORY, LimitWarning
from vramguard_operator.engine.keys import ViolationKey
from vramguard_operator.engine.measure import Measure

WarningKey = tuple[str, str | None, str | None]
"""A stored warning's identity: (kind, pod, device)."""


@dataclass(frozen=True, slots=True)
class WarnCandidate:
    """A limit above the warning threshold: its share of the limit, the
    measurement (None when carried over on unknown data) and the stored warning."""

    ratio: float
    key: ViolationKey
    m: Measure | None
    prev: LimitWarning | None


def stored_warnings(warnings: Sequence[LimitWarning] | None) -> dict[WarningKey, LimitWarning]:
    """The warnings in a budget's status by (kind, pod, device)."""
    return {(w.kind, w.pod, w.device): w for w in warnings or ()}


def above_threshold(
    m: Measure, prev: Mapping[WarningKey, LimitWarning], threshold: float, margin: float
) -> WarnCandidate | None:
    """``m`` as a warning when its value is at the threshold or above (at
    ``threshold − margin`` or above for a limit already warned about); None
    otherwise, for a leak, or for an unknown value."""
    if m.key.kind in LEAK_MEMORY or m.observed is None or m.limit <= 0:
        return None
    old = prev.get((m.key.kind, m.key.pod, m.key.device))
    floor = threshold if old is None else threshold - margin
    if m.observed >= floor * m.limit:
        return WarnCandidate(m.observed / m.limit, m.key, m, old)
    return None


def carried(m: Measure, prev: Mapping[WarningKey, LimitWarning]) -> WarnCandidate | None:
    """The stored warning for ``m``'s limit, kept as it is while the data cannot tell."""
    old = prev.get((m.key.kind, m.key.pod, m.key.device))
    if old is None:
        return None
    return WarnCandidate(old.observed_bytes / max(1, old.limit_bytes), m.key, None, old)


def settle(candidates: Sequence[WarnCandidate], bound: int, now: datetime) -> tuple[list[LimitWarning], list[Measure]]:
    """The warnings kept in status (highest share of the limit first, at most
    ``bound``) and the measurements of those that are new, which each get a
    Warn decision. Warnings beyond the bound get no Event: they could not be
    remembered, and would warn at every evaluation."""
    ordered = sorted(candidates, key=lambda c: (-c.ratio, c.key.kind, c.key.pod or "", c.key.device or ""))
    kept: list[LimitWarning] = []
    new: list[Measure] = []
    for c in ordered[:bound]:
        if c.prev is not None and (c.m is None or c.m.observed is None):
            kept.append(c.prev)
            continue
        assert c.m is not None and c.m.observed is not None
        kept.append(
            LimitWarning(
                kind=c.key.kind,
                pod=c.key.pod,
                device=c.key.device,
                observedBytes=c.m.observed,
                limitBytes=c.m.limit,
                since=c.prev.since if c.prev is not None else now,
            )
        )
        if c.prev is None:
            new.append(c.m)
    return kept, new
