"""What the moves of a violation do: the decisions of a fired step (Annotate,
Throttle, Cap, Evict, or DryRunStep when the budget does not act), the
Throttle re-apply, the closing Recover, the Warn, and the records they leave
on pods. The Cap step and what a budget wants of its pods' memory limits are
in ``cap_steps``.

:data:`STEP_FIRING` is the engine's half of the ladder's one table (the API's
half, names, ranks and meaning, is ``vramguard_api.steps.STEPS``): per step,
the decision it builds on a pod, the Event reasons it posts, and whether it is
level-triggered.

Each function works on one budget's ``BudgetWork``; the wording comes from
``messages``, the moves themselves from ``ladder``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from vramguard_api.budget import LEAK_MEMORY
from vramguard_api.steps import Action
from vramguard_operator.engine import cap_steps
from vramguard_operator.engine import ladder as lad
from vramguard_operator.engine import messages as msg
from vramguard_operator.engine.inputs import ContainerFacts, PodFacts
from vramguard_operator.engine.keys import (
    ANNOTATION_ORIGINAL_CPU,
    EVENT_ABOVE_WARNING,
    EVENT_CAP_IMPOSSIBLE,
    EVENT_CAPPED,
    EVENT_DRY_RUN,
    EVENT_EVICTING,
    EVENT_LEAK_DETECTED,
    EVENT_LIMIT_EXCEEDED,
    EVENT_RECOVERED,
    EVENT_THROTTLE_IMPOSSIBLE,
    EVENT_THROTTLED,
    PodRef,
    ViolationKey,
)
from vramguard_operator.engine.measure import Measure, PodData
from vramguard_operator.engine.outputs import (
    Annotate,
    Cap,
    ContainerCPU,
    DecisionBase,
    DryRunStep,
    EventSpec,
    Evict,
    Recover,
    Throttle,
    Warn,
)
from vramguard_operator.engine.records import TOTAL_KINDS, ViolationRecord, throttled
from vramguard_operator.engine.throttle import parse_original, plan_throttle
from vramguard_operator.engine.work import BudgetWork, Fire


def next_of(w: BudgetWork, rec: ViolationRecord, m: Measure | None) -> tuple[Action | None, datetime | None]:
    """The next step of ``rec`` on its budget's ladder, and when it is due."""
    return lad.next_step(rec, w.ladder_for(rec.key), None if m is None else m.projected_evict)


def _text(w: BudgetWork, f: Fire, done: Action | None, cpu: str | None = None) -> str:
    return msg.step_text(w.ref, f.rec, f.m, f.next_step, f.next_time, done, cpu)


def fire(w: BudgetWork, rec: ViolationRecord, m: Measure, rung: lad.LadderStep) -> None:
    """Fire the due ``rung`` of the open ``rec``: at most one step per violation
    per evaluation, as its row of :data:`STEP_FIRING` says. A level-triggered
    step (Evict), when acting, is recorded only once the pod is terminating."""
    targets = _targets(w, rung.action, m)
    firing = STEP_FIRING[rung.action]
    if firing.level_triggered and w.acting:
        if rec.key.kind in TOTAL_KINDS:
            _evict_total(w, rec, m, targets)  # Evict, the one level-triggered step
            return
        for d in targets:
            firing.on_pod(w, Fire(rec, m), d, rung)
        return
    done = lad.fired(rec, rung.action, m, w.now, w.acting)
    w.next_records[rec.key] = done
    f = Fire(done, m, *next_of(w, done, m))
    if not w.acting:
        dry: list[PodData | None] = [*targets] or [None]
        for target in dry:
            text = msg.dry_run_text(rung.action, _text(w, f, None))
            event = EventSpec("Warning", EVENT_DRY_RUN, text, w.event_key(done, f"DryRun{rung.action}"))
            w.emit(DryRunStep, f, target, event, would=rung.action)
        return
    for d in targets:
        firing.on_pod(w, f, d, rung)
        w.fired_on_pod(d.pod.uid, rec, done)


def _annotate(w: BudgetWork, f: Fire, d: PodData, rung: lad.LadderStep) -> None:
    """The Annotate decision for ``d``: its record on the pod and a Warning Event."""
    text = _text(w, f, Action.ANNOTATE)
    event = EventSpec("Warning", _annotate_reason(f.m.key), text, w.event_key(f.rec, Action.ANNOTATE))
    w.emit(Annotate, f, d, event)


def _annotate_reason(key: ViolationKey) -> str:
    return EVENT_LEAK_DETECTED if key.kind in LEAK_MEMORY else EVENT_LIMIT_EXCEEDED


def _targets(w: BudgetWork, action: Action, m: Measure) -> list[PodData]:
    """The pods a step goes to: the measured pod; for a total, every measured pod
    (Annotate) or the largest consumer (Throttle, Cap, Evict; ties by name)."""
    if m.pod is not None:
        return [m.pod]
    attr = "vram" if m.key.kind == "TotalVRAM" else "ram"
    known = [d for d in w.data if getattr(d, attr) is not None]
    if action == Action.ANNOTATE:
        return known
    largest = max(known, key=lambda d: (getattr(d, attr) or 0, d.pod.name), default=None)
    return [] if largest is None else [largest]


def _evict_total(w: BudgetWork, rec: ViolationRecord, m: Measure, targets: list[PodData]) -> None:
    """A total's due Evict: recorded once a pod chosen for it is terminating or
    gone; until then the largest consumer is evicted (level-triggered) and
    recorded as the target, in status and on that pod, before the eviction."""
    chosen = {rec.evict_target_uid} | {
        r.evict_target_uid for _, recs in w.pod_records() if (r := recs.get(rec.key)) is not None
    }
    if any(uid is not None and _gone(w.state.pods_by_uid.get(uid)) for uid in chosen):
        w.next_records[rec.key] = lad.evict_recorded(rec, w.now)
        return
    if not targets:
        return
    d = targets[0]
    aimed = replace(rec, evict_target_uid=d.pod.uid)
    w.next_records[rec.key] = aimed
    # on the pod, its own record of the total (the steps fired on it) gains the target
    own = w.records_on(d.pod.uid).get(rec.key) or replace(rec, step=None, step_time=None)
    w.put_on_pod(d.pod.uid, replace(own, evict_target_uid=d.pod.uid))
    _evict(w, Fire(aimed, m), d)


def _gone(pod: PodFacts | None) -> bool:
    """Whether a pod is terminating, finished or gone."""
    return pod is None or pod.terminating or pod.phase in ("Succeeded", "Failed")


def _evict(w: BudgetWork, f: Fire, d: PodData, rung: lad.LadderStep | None = None) -> None:
    """The Evict decision for ``d`` (``rung``: unused, the table's signature)."""
    if w.evicting(d.pod.uid):
        return  # one Evict per pod per evaluation, whichever violation asks first
    w.start_evicting(d.pod.uid)
    text = _text(w, f, Action.EVICT)
    w.emit(Evict, f, d, EventSpec("Warning", EVENT_EVICTING, text, w.event_key(f.rec, Action.EVICT)), reason=text)


def _throttle(
    w: BudgetWork, f: Fire, d: PodData, rung: lad.LadderStep, reapply: bool = False, repost: bool = False
) -> None:
    """A Throttle decision for ``d``. ``reapply``: the step fired earlier; only
    when something is to resize, or when its Events are to be posted again
    (``repost``: the pod's record says they were not)."""
    # a pod throttled earlier in this evaluation is planned from its new resources
    pod = w.current_pod(d.pod)
    recorded = w.recorded_original(pod.uid) or parse_original(pod.annotations.get(ANNOTATION_ORIGINAL_CPU))
    cpu = rung.cpu_limit or w.config.default_throttle_cpu
    plan = plan_throttle(pod, cpu, recorded)
    key = w.event_key(f.rec, Action.THROTTLE)
    if reapply and not repost:
        if not plan.resize:
            return
        w.throttled_to(resized(pod, plan.resize), plan.original)
        text = msg.throttle_reapplied_text(_text(w, f, None), cpu)
        event = EventSpec("Warning", EVENT_THROTTLED, text, key)
        w.emit(Throttle, f, d, event, resize=plan.resize, original=plan.original, reapply=True)
        return
    if plan.impossible_reason is None and (plan.resize or not reapply):
        w.throttled_to(resized(pod, plan.resize), plan.original)
    if plan.impossible_reason is None:
        text = _text(w, f, Action.THROTTLE, cpu)
        event = EventSpec("Warning", EVENT_THROTTLED, text, key)
    else:
        base = _text(w, f, None)
        text = msg.throttle_impossible_text(base, plan.impossible_reason)
        event = EventSpec("Warning", EVENT_THROTTLE_IMPOSSIBLE, text, key)
    if repost:
        w.explaining(d.pod.uid, f.rec.key)
    w.emit(
        Throttle,
        f,
        d,
        event,
        resize=plan.resize,
        original=plan.original,
        impossible_reason=plan.impossible_reason,
        reapply=reapply and bool(plan.resize),
        repost=repost,
    )


def resized(pod: PodFacts, resize: tuple[ContainerCPU, ...]) -> PodFacts:
    """``pod`` with the CPU resources of ``resize`` applied."""
    new = {c.name: c for c in resize}
    containers: tuple[ContainerFacts, ...] = tuple(
        replace(c, cpu_limit=new[c.name].limit, cpu_request=new[c.name].request or c.cpu_request)
        if c.name in new
        else c
        for c in pod.containers
    )
    return replace(pod, containers=containers)


def reapply_throttle(w: BudgetWork, rec: ViolationRecord, m: Measure) -> None:
    """Throttle is level-triggered: a pod that a fired Throttle step holds but
    whose CPU is not at the step's target (the resize was refused or never
    made, or a container was raised since) is resized again, without a new
    step. Only while the budget enforces, on fresh data (``m`` known)."""
    if not lad.holds_at_throttle(rec, w.acting):
        return
    rung = w.ladder_for(rec.key).rung(Action.THROTTLE)
    if rung is None or rung.cpu_limit is None:
        return
    holders = [m.pod] if m.pod is not None else _total_throttle_holders(w, rec)
    for d in holders:
        if w.evicting(d.pod.uid) or w.explained(d.pod.uid, rec.key):
            continue  # being evicted (no point in resizing it), or its step fired now
        own = w.records_on(d.pod.uid).get(rec.key)
        repost = own is not None and own.step == Action.THROTTLE and not own.events_posted
        _throttle(w, Fire(own or rec, m, *next_of(w, rec, m)), d, rung, reapply=True, repost=repost)


def repost_pending(w: BudgetWork) -> None:
    """Post again the Events of steps fired at an earlier evaluation whose pod
    record says they were not all posted (the operator stopped between the
    record and its Events), unless a decision of this evaluation posts them
    already. Their text is rebuilt from the record (the values when the step
    fired); their Event key is the step's, so an Event that was posted after
    all is updated, not repeated."""
    pods = w.state.pods_by_uid
    for uid, recs in list(w.pod_records()):
        pod = pods.get(uid)
        if pod is None or pod.namespace != w.ref.namespace:
            continue
        for key, rec in recs.items():
            if key.budget != w.ref.name or rec.events_posted or rec.dry_run or w.explained(uid, key):
                continue
            if rec.step not in (Action.ANNOTATE, Action.THROTTLE) or rec.opened_at is None:
                continue
            _repost(w, rec, pod)


def _repost(w: BudgetWork, rec: ViolationRecord, pod: PodFacts) -> None:
    m = Measure(rec.key, rec.observed_bytes, rec.limit_bytes or 0, None, None, None, None)
    d = w.known_pod_data(pod.uid) or PodData(pod, "Fresh", None, None, (), None)
    f = Fire(rec, m, *next_of(w, rec, None))
    if rec.step == Action.ANNOTATE:
        w.explaining(pod.uid, rec.key)
        text = _text(w, f, Action.ANNOTATE)
        event = EventSpec("Warning", _annotate_reason(rec.key), text, w.event_key(rec, Action.ANNOTATE))
        w.emit(Annotate, f, d, event, repost=True)
        return
    rung = w.ladder_for(rec.key).rung(Action.THROTTLE)
    cpu = (rung.cpu_limit if rung else None) or w.config.default_throttle_cpu
    if plan_throttle(w.current_pod(pod), cpu, None).resize:
        return  # not at the target yet: the re-apply on fresh data resizes it, then posts them
    w.explaining(pod.uid, rec.key)
    event = EventSpec("Warning", EVENT_THROTTLED, _text(w, f, Action.THROTTLE, cpu), w.event_key(rec, Action.THROTTLE))
    w.emit(Throttle, f, d, event, resize=(), original={}, repost=True)


def _total_throttle_holders(w: BudgetWork, rec: ViolationRecord) -> list[PodData]:
    """The measured pods that a total's Throttle step was fired on (their annotation says so)."""
    out = []
    for uid, recs in w.pod_records():
        r = recs.get(rec.key)
        d = w.known_pod_data(uid)
        if r is not None and d is not None and d.state == "Fresh" and throttled(r):
            out.append(d)
    return sorted(out, key=lambda d: d.pod.name)


def pending_events(w: BudgetWork, key: ViolationKey) -> bool:
    """Whether a pod's record of ``key`` says its step's Events were not all
    posted: the next step waits until they are (steps are explained in order)."""
    return any(not r.events_posted and not r.dry_run for _, recs in w.pod_records() if (r := recs.get(key)))


def close(w: BudgetWork, rec: ViolationRecord, m: Measure | None, cause: str, ns_pods: list[PodFacts]) -> None:
    """Close an open violation: Recover decisions (for a total, also one per pod
    it throttled, whose CPU comes back) and the record removed from its pods
    (the Events of a step it reached and did not post are posted first)."""
    for uid, recs in list(w.pod_records()):
        own = recs.get(rec.key)
        pod = w.state.pods_by_uid.get(uid)
        if own is not None and pod is not None and not own.events_posted and own.opened_at is not None:
            _repost(w, own, pod)
    w.next_records.pop(rec.key, None)
    observed = (m.observed if m is not None else rec.observed_bytes) or 0
    limit = m.limit if m is not None else (rec.limit_bytes or 0)
    text = msg.recovered_text(w.ref, rec.key, observed, limit, cause)
    pods = [w.state.pods_by_uid[uid] for uid in w.drop_on_pods(rec.key)]
    refs: list[PodRef | None]
    if rec.key.pod is not None:
        pod = next((p for p in ns_pods if p.name == rec.key.pod), None)
        refs = [pod.ref] if pod is not None else [None]
    else:
        refs = [None, *(p.ref for p in pods if ANNOTATION_ORIGINAL_CPU in p.annotations)]
    event = EventSpec("Normal", EVENT_RECOVERED, text, w.event_key(rec, "Recovered"))
    for ref in refs:
        w.decisions.append(
            Recover(
                budget=w.ref,
                violation=rec.key,
                pod=ref,
                time=w.now,
                observed_bytes=observed,
                limit_bytes=limit,
                event=event,
                cause=cause,
            )
        )


def warn(w: BudgetWork, m: Measure, threshold: float) -> None:
    """A Warn decision: ``m`` passed the warning threshold (no violation open)."""
    nxt = w.ladder_for(m.key).next_after(None)
    text = msg.warning_text(w.ref, m, threshold, nxt.action if nxt else None)
    f = Fire(ViolationRecord(m.key, w.ref.uid, w.now), m)
    w.emit(Warn, f, m.pod, EventSpec("Warning", EVENT_ABOVE_WARNING, text), threshold=threshold)


def throttle_impossible(w: BudgetWork, rec: ViolationRecord, m: Measure) -> str | None:
    """Why a fired Throttle step could not resize the pod, for the status message."""
    if rec.step != Action.THROTTLE or m.pod is None or not w.acting:
        return None
    pod = m.pod.pod
    if ANNOTATION_ORIGINAL_CPU in pod.annotations or w.has_new_original(pod.uid):
        return None
    rung = w.ladder.rung(Action.THROTTLE) or w.leak_ladder.rung(Action.THROTTLE)
    return plan_throttle(pod, rung.cpu_limit if rung and rung.cpu_limit else "100m", None).impossible_reason


@dataclass(frozen=True, slots=True)
class StepFiring:
    """The engine's half of a ladder step's row: ``on_pod`` builds its decision
    (``decision``, which the controller's applier carries out) for one target pod
    of the fired step, enforced; ``reasons``: the Event reasons it may post;
    ``level_triggered``: asked again at each evaluation until it took effect
    (recorded only then), not recorded when decided."""

    on_pod: Callable[[BudgetWork, Fire, PodData, lad.LadderStep], None]
    decision: type[DecisionBase]
    reasons: tuple[str, ...]
    level_triggered: bool = False


STEP_FIRING: dict[Action, StepFiring] = {
    Action.ANNOTATE: StepFiring(_annotate, Annotate, (EVENT_LIMIT_EXCEEDED, EVENT_LEAK_DETECTED)),
    Action.THROTTLE: StepFiring(_throttle, Throttle, (EVENT_THROTTLED, EVENT_THROTTLE_IMPOSSIBLE)),
    Action.CAP: StepFiring(cap_steps.cap, Cap, (EVENT_CAPPED, EVENT_CAP_IMPOSSIBLE)),
    Action.EVICT: StepFiring(_evict, Evict, (EVENT_EVICTING,), level_triggered=True),
}
"""Every ladder step's firing, keyed by ``vramguard_api.steps.Action`` (a test
checks that every step has its row)."""
