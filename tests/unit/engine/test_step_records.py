"""A step counts only when it is on the pod, and its Events survive a crash
(issue 17, items 3 and 4): a fired step's record is written with its Events
marked unposted and marked posted once they are; the budget's status has a
variant without the step, written when the pod's write fails; a record whose
Events were not posted gets them posted again, under the same Event key,
before any later step fires."""

from __future__ import annotations

import json
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_operator.engine.types import (
    ANNOTATION_VIOLATIONS,
    Annotate,
    EngineOutput,
    PodFacts,
    Recover,
    Throttle,
)

from .builders import apply, at, budget, pod, report, run, vram

LADDER = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "5m"},
          {"action": "Evict", "after": "10m"}]


def over(t: float, gib: float = 41) -> list[Any]:
    return [report("node-a", at(t), {"w0": vram(gib)})]


def records(p: PodFacts) -> list[dict[str, Any]]:
    return json.loads(p.annotations.get(ANNOTATION_VIOLATIONS) or "[]")


def crash_after_the_state(out: EngineOutput, budgets: list[GPUMemoryBudget], pods: list[PodFacts]) -> Any:
    """Apply ``out`` as an operator killed right after writing the pods' state:
    the annotation patches; not the actions, the marks that the Events were
    posted, nor the statuses."""
    state_only = EngineOutput(
        decisions=(),
        pod_patches=tuple(type(p)(p.pod, p.annotations) for p in out.pod_patches),
        statuses=(),
    )
    return apply(state_only, budgets, pods)


def start() -> tuple[list[GPUMemoryBudget], list[PodFacts]]:
    return [budget(per_pod={"vram": "40Gi"}, ladder=LADDER)], [pod("w0")]


def test_a_fired_step_is_written_unposted_then_marked_posted():
    budgets, pods = start()
    out = run(budgets, pods, over(0), at(0))
    (patch,) = out.pod_patches
    (written,) = json.loads(patch.annotations[ANNOTATION_VIOLATIONS])
    assert (written["step"], written["eventsPosted"]) == ("Annotate", False)
    assert patch.explained is not None
    (marked,) = json.loads(patch.explained[ANNOTATION_VIOLATIONS])
    assert marked["step"] == "Annotate" and "eventsPosted" not in marked


def test_the_status_has_a_variant_without_the_steps_fired_now():
    budgets, pods = start()
    out = run(budgets, pods, over(0), at(0))
    (upd,) = out.statuses
    assert upd.pods == {"uid-w0"} and upd.unwritten is not None
    assert upd.status.violations[0].step == "Annotate"
    before = upd.unwritten.violations[0]
    assert (before.step, before.next_step, before.opened_at) == (None, "Annotate", at(0))
    budgets, pods = apply(out, budgets, pods)
    quiet = run(budgets, pods, over(60), at(60))
    assert quiet.statuses[0].unwritten is None and quiet.statuses[0].pods == frozenset()


def test_a_write_that_failed_fires_the_step_again_and_the_ladder_waits():
    budgets, pods = start()
    out = run(budgets, pods, over(0), at(0))
    # the pod's write was refused: the status written is the unwritten variant
    budgets = [budgets[0].model_copy(update={"status": out.statuses[0].unwritten})]
    late = run(budgets, pods, over(400), at(400))  # Throttle would be due, but Annotate is not on the pod
    assert [type(d) for d in late.decisions] == [Annotate]
    assert late.decisions[0].event.key == out.decisions[0].event.key


def test_events_lost_in_a_crash_are_posted_again_once_and_before_the_next_step():
    budgets, pods = start()
    out = run(budgets, pods, over(0), at(0))
    budgets, pods = crash_after_the_state(out, budgets, pods)
    assert records(pods[0])[0]["eventsPosted"] is False
    again = run(budgets, pods, over(400), at(400))  # restarted late: Throttle is due
    (repost,) = again.decisions
    assert isinstance(repost, Annotate) and repost.repost
    assert repost.event.key == out.decisions[0].event.key  # the same Event, updated if it was posted
    assert repost.event.reason == "LimitExceeded" and "Annotated. Next: Throttle" in repost.event.message
    (patch,) = again.pod_patches
    assert patch.annotations == {} and "eventsPosted" not in patch.explained[ANNOTATION_VIOLATIONS]
    budgets, pods = apply(again, budgets, pods)
    then = run(budgets, pods, over(401), at(401))
    assert [(type(d), d.repost) for d in then.decisions] == [(Throttle, False)]


def test_a_throttle_whose_events_were_lost_is_explained_once_the_pod_is_at_its_target():
    budgets, pods = start()
    budgets, pods = apply(run(budgets, pods, over(0), at(0)), budgets, pods)
    out = run(budgets, pods, over(300), at(300))
    budgets, pods = crash_after_the_state(out, budgets, pods)  # before the resize, too
    again = run(budgets, pods, over(310), at(310))
    (t,) = again.decisions
    assert isinstance(t, Throttle) and t.repost and t.reapply and t.resize  # resize, then post
    assert t.event.key == out.decisions[0].event.key
    budgets, pods = apply(again, budgets, pods)
    assert run(budgets, pods, over(320), at(320)).decisions == ()


def test_a_throttle_resized_before_the_crash_is_explained_without_another_resize():
    budgets, pods = start()
    budgets, pods = apply(run(budgets, pods, over(0), at(0)), budgets, pods)
    out = run(budgets, pods, over(300), at(300))
    resized = EngineOutput(decisions=out.decisions, pod_patches=tuple(
        type(p)(p.pod, p.annotations) for p in out.pod_patches), statuses=())
    budgets, pods = apply(resized, budgets, pods)  # state and resize done, Events lost
    (t,) = run(budgets, pods, over(310), at(310)).decisions
    assert isinstance(t, Throttle) and t.repost and not t.reapply and t.resize == ()


def test_a_violation_closing_with_unposted_events_posts_them_before_recovering():
    budgets, pods = start()
    out = run(budgets, pods, over(0), at(0))
    budgets, pods = crash_after_the_state(out, budgets, pods)
    closing = run(budgets, pods, over(60, gib=1), at(60))
    assert [(type(d), d.repost) for d in closing.decisions] == [(Annotate, True), (Recover, False)]


def test_recovered_has_the_same_event_key_when_decided_again():
    budgets, pods = start()
    budgets, pods = apply(run(budgets, pods, over(0), at(0)), budgets, pods)
    first = run(budgets, pods, over(60, gib=1), at(60))
    second = run(budgets, pods, over(70, gib=1), at(70))  # the removal did not land: decided again
    (a,), (b,) = first.decisions, second.decisions
    assert isinstance(a, Recover) and a.event.key == b.event.key and a.event.key.endswith("|Recovered")
