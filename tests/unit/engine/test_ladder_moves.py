"""The state machine of one violation (``engine.ladder``), one record and one
measurement at a time: no budget, no pods, no wording."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

import pytest

from vramguard_operator.engine.inputs import PodFacts
from vramguard_operator.engine.keys import ViolationKey
from vramguard_operator.engine.ladder import (
    Ladder,
    LadderStep,
    evicted,
    fired,
    next_step,
    transition,
    unmeasured,
)
from vramguard_operator.engine.measure import limit_measure
from vramguard_operator.engine.records import ViolationRecord

from .builders import GI, at

KEY = ViolationKey("ml", "train", "PodVRAM", "w0")
LEAK_KEY = ViolationKey("ml", "train", "Leak", "w0")
LADDER = Ladder((LadderStep("Annotate", 0), LadderStep("Throttle", 300, "100m"), LadderStep("Evict", 600)))
LIMIT = 40 * GI
T0 = at(0)


def measure(gib: float | None, key: ViolationKey = KEY, overshoot: float = 0.1, margin: float = 0.02):
    return limit_measure(key, None if gib is None else int(gib * GI), LIMIT, overshoot, margin, None)


def move(rec, m, now=T0, tolerance=60.0, ladder=LADDER):
    return transition(rec, m, now, "uid-b", tolerance, ladder)


def opened(since=T0, step=None, step_time=None, key=KEY, **kw):
    return ViolationRecord(key, "uid-b", since, opened_at=since, step=step, step_time=step_time, **kw)


def test_unknown_data_holds_the_record_as_it_is():
    rec = opened(step="Annotate", step_time=at(0))
    assert move(rec, measure(None), now=at(900)) == ("Hold", rec, None)
    assert move(None, measure(None)) == ("Hold", None, None)


def test_below_the_limit_keeps_no_record_and_a_pending_one_falls_back():
    assert move(None, measure(39)) == ("Quiet", None, None)
    pending = ViolationRecord(KEY, "uid-b", at(0))
    assert move(pending, measure(39), now=at(30)) == ("Quiet", None, None)


def test_within_the_tolerance_a_violation_is_pending_since_it_first_went_above():
    t = move(None, measure(41), now=at(0))
    assert t.kind == "Pending" and t.record == ViolationRecord(KEY, "uid-b", at(0))
    # still above 59 s later: pending, since kept
    t = move(t.record, measure(41), now=at(59))
    assert t.kind == "Pending" and t.record.since == at(0) and t.record.opened_at is None
    # the tolerance has passed: open now, since kept, and the first rung is due at once
    t = move(t.record, measure(41), now=at(60))
    assert t.kind == "Open" and (t.record.since, t.record.opened_at) == (at(0), at(60))
    assert t.due == LADDER.steps[0]


def test_above_the_overshoot_opens_at_once_and_a_leak_ignores_the_tolerance():
    t = move(None, measure(45), now=at(0))  # 45Gi > 40Gi x 1.1
    assert t.kind == "Open" and t.record.opened_at == at(0)
    leak = replace(measure(41), key=LEAK_KEY)
    assert move(None, leak, tolerance=3600).kind == "Open"


def test_closes_only_under_the_recovery_margin_and_pauses_between():
    rec = opened(step="Annotate", step_time=at(0))
    assert move(rec, measure(39.5), now=at(900)) == ("Open", rec, None)  # 39.5Gi > 40Gi x 0.98: open, no step
    assert move(rec, measure(40), now=at(900)) == ("Open", rec, None)  # at the limit: no escalation
    assert move(rec, measure(39.2), now=at(900)) == ("Close", rec, None)  # 39.2Gi = 40Gi x 0.98


def test_one_rung_per_evaluation_even_when_several_are_due():
    rec = opened(step="Annotate", step_time=at(0))
    assert move(rec, measure(45), now=at(299)).due is None
    assert move(rec, measure(45), now=at(300)).due == LADDER.steps[1]
    # long past every delay (a pause on unknown data): still only the next rung
    assert move(rec, measure(45), now=at(5000)).due == LADDER.steps[1]
    assert move(opened(step="Evict", step_time=at(600)), measure(45), now=at(5000)).due is None


def test_an_infinite_evict_is_due_only_by_the_projected_exhaustion():
    ladder = Ladder((LadderStep("Annotate", 0), LadderStep("Evict", math.inf)))
    rec = opened(step="Annotate", step_time=at(0), key=LEAK_KEY)
    m = replace(measure(45), key=LEAK_KEY)
    assert move(rec, m, now=at(10**6), ladder=ladder).due is None
    assert next_step(rec, ladder, None) == ("Evict", None)
    m = replace(m, projected_evict=at(100))
    assert move(rec, m, now=at(99), ladder=ladder).due is None
    assert move(rec, m, now=at(100), ladder=ladder).due == ladder.steps[1]
    assert next_step(rec, ladder, at(100)) == ("Evict", at(100))
    # a finite Evict delay is brought forward by the projection, never put back
    assert next_step(rec, LADDER, at(100)) == ("Throttle", at(300))
    rec = replace(rec, step="Throttle")
    assert next_step(rec, LADDER, at(100)) == ("Evict", at(100))
    assert next_step(rec, LADDER, at(10**4)) == ("Evict", at(600))


def test_no_next_step_while_pending_or_once_the_ladder_is_done():
    assert next_step(ViolationRecord(KEY, "uid-b", at(0)), LADDER, None) == (None, None)
    assert next_step(opened(step="Evict"), LADDER, None) == (None, None)
    assert next_step(opened(), LADDER, None) == ("Annotate", at(0))


def test_a_fired_step_records_the_values_and_whether_it_only_would_have_fired():
    m = measure(45)
    rec = fired(opened(), "Annotate", m, at(5), acting=True)
    assert (rec.step, rec.step_time, rec.observed_bytes, rec.limit_bytes, rec.dry_run) == (
        "Annotate",
        at(5),
        45 * GI,
        LIMIT,
        False,
    )
    assert fired(opened(), "Annotate", m, at(5), acting=False).dry_run is True


RUNNING = PodFacts("ml", "w0", "uid-w0")


@pytest.mark.parametrize(
    ("rec", "pod", "selected", "kind"),
    [
        (opened(key=ViolationKey("ml", "train", "TotalVRAM")), None, False, "Keep"),  # a total without data
        (opened(), None, False, "Drop"),  # the pod is gone
        (opened(), replace(RUNNING, phase="Succeeded"), True, "Drop"),
        (opened(), RUNNING, False, "Close"),  # no longer selected
        (ViolationRecord(KEY, "uid-b", at(0)), RUNNING, False, "Drop"),  # pending: no Event
        (opened(), replace(RUNNING, terminating=True), True, "Evicted"),
        (ViolationRecord(KEY, "uid-b", at(0)), replace(RUNNING, terminating=True), True, "Keep"),
        (opened(), replace(RUNNING, phase="Pending"), True, "Keep"),
    ],
)
def test_unmeasured_records(rec, pod, selected, kind):
    assert unmeasured(rec, pod, selected) == kind


def test_a_terminating_pod_records_its_evict_only_when_it_was_due():
    at_throttle = opened(step="Throttle", step_time=at(300))
    assert evicted(at_throttle, LADDER, at(599), acting=True) == at_throttle
    rec = evicted(at_throttle, LADDER, at(600), acting=True)
    assert (rec.step, rec.step_time, rec.dry_run) == ("Evict", at(600), False)
    assert evicted(at_throttle, LADDER, at(600), acting=False).dry_run is True
    # Evict is not the next step: nothing to record
    at_annotate = opened(step="Annotate", step_time=at(0))
    assert evicted(at_annotate, LADDER, at(600) + timedelta(days=1), acting=True) == at_annotate
