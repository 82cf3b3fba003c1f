"""The escalation ladder and the state machine of one violation.

A violation's record moves through: none → pending (above the limit, within
the tolerance) → open → steps fired one by one along the ladder (Annotate,
Throttle, Cap, Evict) → closed (usage back under the limit with the recovery
margin). Unknown data holds it as it is. The functions here decide each move
from one record and one measurement; they return values, word nothing and
touch no pod: the budget's evaluation (``engine.budget``) turns them into
decisions (``engine.steps``) and text (``engine.messages``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal, NamedTuple

from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudgetSpec
from vramguard_api.limits import DeviceLimit
from vramguard_api.steps import Action
from vramguard_operator.engine.inputs import PodFacts
from vramguard_operator.engine.measure import Measure
from vramguard_operator.engine.records import ViolationRecord, step_rank, throttled


@dataclass(frozen=True, slots=True)
class LadderStep:
    """One rung: the action, its delay after the violation opened (seconds;
    ``inf`` for a leak's Evict that only the exhaustion projection brings
    forward), for Throttle the CPU limit to set, and for Cap the level of the
    hard limit per device (None: the violated limit, ``engine.caps``)."""

    action: Action
    after_seconds: float
    cpu_limit: str | None = None
    hard_limit: DeviceLimit | None = None


@dataclass(frozen=True, slots=True)
class Ladder:
    """The escalation ladder of a budget, ordered Annotate, Throttle, Cap, Evict."""

    steps: tuple[LadderStep, ...]

    def next_after(self, step: Action | None) -> LadderStep | None:
        """The first rung after ``step`` (the first rung when ``step`` is None)."""
        rank = step_rank(step)
        for rung in self.steps:
            if step_rank(rung.action) > rank:
                return rung
        return None

    def rung(self, action: Action) -> LadderStep | None:
        """The rung for ``action``, if the ladder has one."""
        return next((r for r in self.steps if r.action == action), None)


def ladder_of(spec: GPUMemoryBudgetSpec, default_cpu: str, leak: bool = False) -> Ladder:
    """The ladder of a budget spec. For ``leak`` with ``evictBefore`` set and no
    Evict rung, an Evict rung with an infinite delay is added: only the
    projected exhaustion makes it due. Raises ``ValueError`` naming the field
    on a bad ``after``."""
    steps = [
        LadderStep(
            s.action,
            s.after_seconds(),
            (s.cpu_limit or default_cpu) if s.action == Action.THROTTLE else None,
            s.hard_limit if s.action == Action.CAP else None,
        )
        for s in spec.enforcement.escalation
    ]
    ld = spec.leak_detection
    if leak and ld is not None and ld.evict_before is not None and all(s.action != Action.EVICT for s in steps):
        steps.append(LadderStep(Action.EVICT, math.inf))
    return Ladder(tuple(steps))


# --- one violation's moves -----------------------------------------------------------

TransitionKind = Literal["Hold", "Quiet", "Pending", "Close", "Open"]


class Transition(NamedTuple):
    """What one measurement does to one violation's record.

    ``Hold``: the data cannot tell; ``record`` (the stored one, or None) is kept
    as it is. ``Quiet``: not above the limit and not open; no record is kept.
    ``Pending``: above the limit within the tolerance; ``record`` has no
    ``opened_at``. ``Close``: the open violation ``record`` closes. ``Open``:
    ``record`` is open (perhaps opened just now) and stays; ``due`` is the rung
    that is due now, if any (at most one per evaluation; none while usage is at
    or under the limit)."""

    kind: TransitionKind
    record: ViolationRecord | None
    due: LadderStep | None = None


# the most frequent moves (most limits are neither known to be over nor held),
# made once: the engine moves hundreds of thousands of violations per evaluation
_QUIET = Transition("Quiet", None)
_HOLD_NOTHING = Transition("Hold", None)


def transition(
    rec: ViolationRecord | None,
    m: Measure,
    now: datetime,
    budget_uid: str,
    tolerance_seconds: float,
    ladder: Ladder,
) -> Transition:
    """The move of the violation ``m.key`` (stored state ``rec``) on measurement ``m``.

    Opens at once above ``limit × (1 + overshoot)`` (``m.hard``), else after
    ``tolerance_seconds`` above the limit since ``rec.since`` (a Leak ignores
    the tolerance); closes when ``m.clear``."""
    if m.over is None:
        return _HOLD_NOTHING if rec is None else Transition("Hold", rec)
    if rec is None or rec.opened_at is None:
        if not m.over:
            return _QUIET
        since = rec.since if rec is not None else now
        tolerance = 0.0 if m.key.kind in LEAK_MEMORY else tolerance_seconds
        if not (m.hard or (now - since).total_seconds() >= tolerance):
            return Transition("Pending", ViolationRecord(m.key, budget_uid, since))
        rec = ViolationRecord(m.key, budget_uid, since, opened_at=now)
    if m.clear:
        return Transition("Close", rec)
    return Transition("Open", rec, None if m.pause else due_rung(rec, ladder, m.projected_evict, now))


def due_time(rec: ViolationRecord, rung: LadderStep, projected_evict: datetime | None) -> datetime | None:
    """When ``rung`` is due for the open ``rec``: its delay after ``opened_at``, or
    for Evict the projected exhaustion's time if earlier (None: never, so far)."""
    assert rec.opened_at is not None
    due = None
    if rung.after_seconds != math.inf:
        due = rec.opened_at + timedelta(seconds=rung.after_seconds)
    if rung.action == Action.EVICT and projected_evict is not None:
        due = projected_evict if due is None else min(due, projected_evict)
    return due


def due_rung(
    rec: ViolationRecord, ladder: Ladder, projected_evict: datetime | None, now: datetime
) -> LadderStep | None:
    """The rung after ``rec.step`` when it is due at ``now``, else None."""
    rung = ladder.next_after(rec.step)
    if rung is None:
        return None
    due = due_time(rec, rung, projected_evict)
    return None if due is None or now < due else rung


def next_step(
    rec: ViolationRecord, ladder: Ladder, projected_evict: datetime | None
) -> tuple[Action | None, datetime | None]:
    """The ladder's next step for ``rec`` and when it is due (both None while
    pending or once the ladder is exhausted; the time None when only a leak's
    projected exhaustion can make it due)."""
    rung = ladder.next_after(rec.step)
    if rung is None or rec.opened_at is None:
        return None, None
    return rung.action, due_time(rec, rung, projected_evict)


def fired(rec: ViolationRecord, action: Action, m: Measure, now: datetime, acting: bool) -> ViolationRecord:
    """``rec`` once ``action`` fired at ``now`` on measurement ``m`` (only would
    have fired when the budget is not ``acting``)."""
    return replace(rec, step=action, step_time=now, observed_bytes=m.observed, limit_bytes=m.limit, dry_run=not acting)


def evict_recorded(rec: ViolationRecord, now: datetime) -> ViolationRecord:
    """A total's Evict recorded once the pod chosen for it is terminating or gone."""
    return replace(rec, step=Action.EVICT, step_time=now, evict_target_uid=None)


def holds_at_throttle(rec: ViolationRecord, acting: bool) -> bool:
    """Whether ``rec`` holds its pods at Throttle for real (so a resize that did
    not happen is re-applied)."""
    return acting and throttled(rec)


UnmeasuredKind = Literal["Keep", "Drop", "Close", "Evicted"]


def unmeasured(rec: ViolationRecord, pod: PodFacts | None, selected: bool) -> UnmeasuredKind:
    """The move of a record whose violation was not measured this time: its pod
    (``pod``, None when gone) is terminating, finished, gone, no longer
    ``selected``, or not running; a total had no data.

    ``Keep``: kept as it is. ``Drop``: removed without an Event (the pod is
    gone or finished, or a pending violation's pod is no longer selected).
    ``Close``: an open violation's pod is no longer selected. ``Evicted``: the
    pod is terminating: see ``evicted``."""
    if rec.key.pod is None:
        return "Keep"
    if pod is None or pod.phase in ("Succeeded", "Failed"):
        return "Drop"
    if not selected:
        return "Close" if rec.opened_at is not None else "Drop"
    if pod.terminating and rec.opened_at is not None:
        return "Evicted"
    return "Keep"


def evicted(rec: ViolationRecord, ladder: Ladder, now: datetime, acting: bool) -> ViolationRecord:
    """``rec`` of a terminating pod: its Evict recorded when it was the next step
    and due (the pod terminating is the record that the eviction fired)."""
    rung = ladder.next_after(rec.step)
    if rung is not None and rung.action == Action.EVICT:
        due = due_time(rec, rung, None)
        if due is not None and now >= due:
            return replace(rec, step=Action.EVICT, step_time=now, dry_run=not acting)
    return rec
