"""The device-pressure rule on one device (pure): the kubelet eviction manager's
idea applied to GPU memory (docs/device-pressure.md).

When a device's free memory (usable minus used, from a fresh and complete node
report) is under the largest ``minFree`` of the rules of the pods on it — or
under the room a pod within its share still needs to reach it, when its rule
protects shares (``protectShares``) — the pod most above its share there — ranked by bytes above share, as the kubelet
ranks pods by usage above requests — is the one to act on, at once. Never a
pod within its share; never a second one while a pod on the device is leaving
(terminating, or evicted earlier in the same evaluation) with memory still
held; nothing on a device whose data is stale or incomplete.

``decide(DeviceFacts) -> Verdict`` is the whole rule. Building the facts from
an evaluation is ``pressure_facts``; turning verdicts into decisions, status
entries and device reports is ``pressure_out``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from vramguard_api.pressure import PressureAction
from vramguard_api.steps import Action
from vramguard_api.units import format_bytes
from vramguard_operator.engine.keys import BudgetRef, PodRef

OccupantMode = Literal["Enforce", "DryRun", "Exempt"]
VerdictKind = Literal["NoRule", "Unknown", "Clear", "Waiting", "Act", "NoCandidate"]


@dataclass(frozen=True, slots=True)
class PressureRule:
    """One pod's device-pressure rule: the free memory it wants kept on its
    devices (the larger of ``min_free_fraction`` × usable and ``min_free_bytes``),
    whether the room it needs to reach its share is kept free too
    (``protect_shares``), and the action taken on it. ``source``: where it
    came from (``policy/<name>``, ``budget <ns>/<name>``), for messages."""

    min_free_fraction: float | None = None
    min_free_bytes: int | None = None
    action: PressureAction = Action.EVICT
    source: str = ""
    protect_shares: bool = True

    def min_free(self, usable: int) -> int:
        """The free memory wanted on a device with ``usable`` bytes (bytes)."""
        return max(int(usable * (self.min_free_fraction or 0.0)), self.min_free_bytes or 0)

    def text(self) -> str:
        """``5%``, ``4Gi`` or ``5% or 4Gi`` (the larger applies)."""
        parts = []
        if self.min_free_fraction is not None:
            parts.append(f"{self.min_free_fraction * 100:g}%")
        if self.min_free_bytes is not None:
            parts.append(format_bytes(self.min_free_bytes))
        return " or ".join(parts) or "0"

    @classmethod
    def combine(cls, rules: Iterable[PressureRule]) -> PressureRule | None:
        """The most protective of ``rules``: the largest fraction and the largest
        bytes, shares protected when any protects them; action and source of
        the first. None when there is none."""
        found = list(rules)
        if not found:
            return None
        fractions = [r.min_free_fraction for r in found if r.min_free_fraction is not None]
        sizes = [r.min_free_bytes for r in found if r.min_free_bytes is not None]
        protect = any(r.protect_shares for r in found)
        return cls(max(fractions, default=None), max(sizes, default=None), found[0].action, found[0].source, protect)


@dataclass(frozen=True, slots=True)
class Occupant:
    """A pod on the device: what it holds there (``used``, bytes; None when
    unknown), its share there (bytes; None when unknown), the rule it is
    protected by and subject to (None: none applies), whether vramguard may act
    on it (``mode``), whether it is ``leaving`` (terminating, finished, or
    evicted earlier in this evaluation), the budget whose status records what
    is done to it (``home``; None when no budget selects it) and whether it
    was the device's chosen pod at the previous evaluation (``chosen_before``)."""

    pod: PodRef
    used: int | None
    share: int | None
    rule: PressureRule | None
    mode: OccupantMode
    leaving: bool = False
    home: BudgetRef | None = None
    chosen_before: bool = False

    @property
    def above(self) -> int:
        """Bytes above its share (0 when within it or unknown)."""
        if self.used is None or self.share is None:
            return 0
        return max(0, self.used - self.share)

    @property
    def within(self) -> bool:
        """Whether it is known to hold at most its share."""
        return self.used is not None and self.share is not None and self.used <= self.share

    @property
    def room(self) -> int:
        """What it still needs to reach its share when its rule protects shares
        (bytes; 0 when it is above, leaving, exempt or unprotected)."""
        if self.rule is None or not self.rule.protect_shares or self.mode == "Exempt" or self.leaving:
            return 0
        if self.used is None or self.share is None:
            return 0
        return max(0, self.share - self.used)


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """One physical device (a GPU, or a MIG device: its own memory) as the rule
    sees it: usable and used memory (bytes, from the node report; None when
    unknown), whether its data can be acted on (``known``: a fresh, complete
    report, the device healthy with every process known and attributed to a
    pod and measured; else ``unknown_reason`` says why), and its pods."""

    uuid: str
    node: str
    usable: int | None
    used: int | None
    known: bool
    occupants: tuple[Occupant, ...]
    unknown_reason: str = ""

    @property
    def free(self) -> int | None:
        """Free memory: usable minus used (bytes), None when unknown."""
        if self.usable is None or self.used is None:
            return None
        return max(0, self.usable - self.used)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the rule says about one device.

    ``kind``: ``NoRule`` (no pod on it has a rule), ``Unknown`` (its data
    cannot be acted on), ``Clear`` (free memory at or above ``min_free``),
    ``Waiting`` (under it, but a pod on it is leaving with memory held:
    ``waiting_for``), ``NoCandidate`` (under it, and no pod subject to a rule
    is above its share), ``Act`` (``candidates[0]`` is the pod to act on; the
    others, in rank order, are the fall-backs when it cannot be evicted).
    ``protected``: the pods within their shares. ``min_free``: the free memory
    the device must keep (bytes): the largest ``minFree`` of its pods' rules
    (``rule``), or the room ``room_for`` (a pod within its share whose rule
    protects shares) still needs to reach its share, when that is larger."""

    device: DeviceFacts
    kind: VerdictKind
    min_free: int | None = None
    rule: PressureRule | None = None
    candidates: tuple[Occupant, ...] = ()
    protected: tuple[Occupant, ...] = ()
    waiting_for: tuple[Occupant, ...] = ()
    room_for: Occupant | None = None

    @property
    def chosen(self) -> Occupant | None:
        """The pod to act on (``Act`` only)."""
        return self.candidates[0] if self.kind == "Act" else None


def subject(o: Occupant) -> bool:
    """Whether the rule may choose ``o``: a rule applies to it, its namespace is
    not exempt, it is not leaving, and it is known to be above its share."""
    return o.rule is not None and o.mode != "Exempt" and not o.leaving and o.above > 0


def rank_key(o: Occupant) -> tuple[int, int, str, str, str]:
    """The ranking: the pod chosen at the previous evaluation first while it is
    still a candidate (an eviction in flight is not replaced by another pod's
    while the watch catches up), then most bytes above share, then by
    namespace, name and uid (stable)."""
    return (0 if o.chosen_before else 1, -o.above, o.pod.namespace, o.pod.name, o.pod.uid)


def decide(d: DeviceFacts) -> Verdict:
    """The rule on one device (see the module doc)."""
    ruled = [o for o in d.occupants if o.rule is not None and o.mode != "Exempt"]
    if not ruled:
        return Verdict(d, "NoRule")
    free = d.free
    if not d.known or free is None or d.usable is None:
        return Verdict(d, "Unknown")
    usable = d.usable
    rule = max((o.rule for o in ruled if o.rule is not None), key=lambda r: r.min_free(usable))
    min_free = rule.min_free(usable)
    neediest = max(d.occupants, key=lambda o: (o.room, o.pod.namespace, o.pod.name))
    room_for = neediest if neediest.room > min_free else None
    if room_for is not None:
        min_free = room_for.room
    protected = tuple(o for o in d.occupants if o.within and not o.leaving)

    def verdict(kind: VerdictKind, **more: tuple[Occupant, ...]) -> Verdict:
        return Verdict(d, kind, min_free, rule, protected=protected, room_for=room_for, **more)

    if free >= min_free:
        return verdict("Clear")
    leaving = tuple(o for o in d.occupants if o.leaving and (o.used is None or o.used > 0))
    if leaving:
        return verdict("Waiting", waiting_for=leaving)
    candidates = tuple(sorted((o for o in d.occupants if subject(o)), key=rank_key))
    return verdict("Act", candidates=candidates) if candidates else verdict("NoCandidate")
