"""When each budget, pod or node report next needs a look without any event
(pure): the time-based steps of incremental evaluation.

The engine decides at whole seconds (``now`` is truncated), so every time
here is the first whole second at which the engine's answer can change:

- an open violation's next step (``status.violations[].nextStepTime``);
- a pending violation opening once its tolerance has passed (``since`` +
  ``tolerance.duration``);
- a node report turning stale (``sampleTime`` + freshness), or fresh again
  after a clock ahead of the operator's (``sampleTime`` − freshness).

A unit is looked at when its time comes and its next time is then computed
again; a time that has passed without a step firing (escalation paused on
unknown data or in the hysteresis band) waits for the next change instead.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable
from datetime import datetime, timedelta

from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudget, GPUMemoryBudgetStatus

_SECOND = timedelta(seconds=1)


def ceil_second(t: datetime) -> datetime:
    """The first whole second at or after ``t``."""
    whole = t.replace(microsecond=0)
    return whole if whole == t else whole + _SECOND


def next_step_due(budget: GPUMemoryBudget, status: GPUMemoryBudgetStatus | None, now: datetime) -> datetime | None:
    """The first whole second after ``now`` at which a violation of ``budget``
    (its status as the engine wrote it) may open or take its next step; None
    when none can without a change of data."""
    if status is None or not status.violations:
        return None
    tolerance = budget.spec.tolerance.seconds()
    times = []
    for v in status.violations:
        if v.opened_at is None:
            times.append(v.since + timedelta(seconds=0.0 if v.kind in LEAK_MEMORY else tolerance))
        elif v.next_step_time is not None:
            times.append(v.next_step_time)
    later = [ceil_second(t) for t in times if ceil_second(t) > now]
    return min(later, default=None)


def staleness_change(sample_time: datetime | None, freshness: float, now: datetime) -> datetime | None:
    """The first whole second after ``now`` at which a report sampled at
    ``sample_time`` turns stale or fresh for the engine (``engine.evaluate``:
    stale when the whole-second age is beyond ``freshness`` either way)."""
    if sample_time is None:
        return None
    fresh_from = ceil_second(sample_time - timedelta(seconds=freshness))
    late = sample_time + timedelta(seconds=freshness)
    stale_from = late.replace(microsecond=0) + _SECOND
    later = [t for t in (fresh_from, stale_from) if t > now]
    return min(later, default=None)


class TimerQueue:
    """Units (any hashable) with the time each next needs a look; one time per
    unit (arming again replaces it)."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, Hashable]] = []
        self._due: dict[Hashable, datetime] = {}
        self._seq = 0

    def arm(self, unit: Hashable, when: datetime | None) -> None:
        """Look at ``unit`` at ``when`` (None: no look without an event)."""
        if when is None:
            self._due.pop(unit, None)
            return
        if self._due.get(unit) == when:
            return
        self._due[unit] = when
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, unit))

    def pop_due(self, now: datetime) -> list[Hashable]:
        """The units whose time has come (each once), removed."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            when, _, unit = heapq.heappop(self._heap)
            if self._due.get(unit) == when:
                del self._due[unit]
                out.append(unit)
        return out

    def next_time(self) -> datetime | None:
        """The earliest time armed (None when nothing is)."""
        while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def forget(self, units: Iterable[Hashable]) -> None:
        """Disarm these units."""
        for u in units:
            self._due.pop(u, None)

    def __len__(self) -> int:
        return len(self._due)


def seconds_until(when: datetime | None, now: datetime, cap: float) -> float:
    """Seconds from ``now`` to ``when``, at most ``cap`` (``cap`` when None), never negative."""
    if when is None:
        return cap
    left = (when - now).total_seconds()
    return max(0.0, min(cap, left if math.isfinite(left) else cap))
