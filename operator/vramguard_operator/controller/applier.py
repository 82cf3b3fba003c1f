"""Carrying out the policy engine's decisions through the Kubernetes API.

The engine (``engine.evaluate``) decides; the applier acts, in the order that
``engine.types`` documents, so that the escalation state on the objects is
always written before the action it describes, and no explanation is lost
whatever the moment the operator stops (``crashpoints`` names those moments).
For one pod:

1. a restoring Recover: the resize back first (``resize``); nothing else for
   the pod when it fails (the record keeps the originals: retried);
2. the ``Recovered`` Events, before the record goes (their Event key makes a
   repeat after a crash update the Event, not add one);
3. the annotation patch (``api_calls.annotations_patch``: a JSON merge patch
   with ``metadata.uid`` as precondition): the step's record, its Events
   marked unposted; a Cap's work is this patch itself
   (``vramguard.io/memory-limits``, applied by the pod's node agent). When it
   fails, nothing else is done for that pod, the failure is explained (Event
   on the pod and the budget, naming the API error), the budget's status is
   written without the steps fired on it (``BudgetStatusUpdate.unwritten``:
   the status follows the pod), and the next evaluation tries again;
4. Throttle: ``pods/resize`` (``resize``), then its Events;
5. Evict: its Events, then the Eviction API, rate-limited (``evictions``,
   ``ratelimit``); a device-pressure eviction that cannot be done falls back
   to the next pod above its share on the device, then to a
   ``DeviceWillRunOut`` Event;
6. the Events of the other decisions (``events``);
7. once every Event of its steps is posted, the patch that marks them posted
   (``PodPatch.explained``).

Then the budget-level Events, each object problem (``ProblemReports``), and
each budget status that changed: a JSON merge patch on the ``status``
subresource, written only when the merge patch from the current status to the
desired one is not empty (``kubeapi.merge_patch``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vramguard_api.budget import OOM_KILLS_FIELD
from vramguard_operator.controller import crashpoints
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.controller.events import DecisionEvents, EventRecorder, ProblemReports
from vramguard_operator.controller.evictions import Evictor
from vramguard_operator.controller.kubeapi import API_ERRORS, error_status, error_text, merge_patch
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.resize import ResizeOutcome, Resizer, merged_resize
from vramguard_operator.engine.types import (
    Annotate,
    BudgetStatusUpdate,
    Cap,
    Decision,
    DryRunStep,
    EngineOutput,
    Evict,
    PodRef,
    Recover,
    Throttle,
    Warn,
)
from vramguard_operator.policy.ratelimit import EvictionLimiter

log = logging.getLogger("vramguard.actions")


@dataclass(slots=True)
class PodWork:
    """Everything one engine output asks for one pod, in apply order: restores
    (then the patch, only if they succeed), or the patch first; then throttles,
    evictions, and the Events of the other decisions."""

    pod: PodRef
    patch: Mapping[str, str | None] | None = None
    explained: Mapping[str, str | None] | None = None
    restores: list[Recover] = field(default_factory=list)
    throttles: list[Throttle] = field(default_factory=list)
    evicts: list[Evict] = field(default_factory=list)
    others: list[Decision] = field(default_factory=list)

    def decisions(self) -> tuple[Decision, ...]:
        """Every decision for the pod."""
        return (*self.restores, *self.throttles, *self.evicts, *self.others)


def plan_pod_work(out: EngineOutput) -> tuple[list[PodWork], list[Decision]]:
    """Group an engine output by pod (sorted by namespace/name), and return the
    budget-level decisions (no pod: Events on the budget only) apart."""
    work: dict[str, PodWork] = {}
    budget_only: list[Decision] = []

    def of(ref: PodRef) -> PodWork:
        return work.setdefault(ref.uid, PodWork(ref))

    for p in out.pod_patches:
        of(p.pod).patch = p.annotations or None
        of(p.pod).explained = p.explained
    for d in out.decisions:
        if d.pod is None:
            budget_only.append(d)
        elif isinstance(d, Recover) and d.restore:
            of(d.pod).restores.append(d)
        elif isinstance(d, Throttle):
            of(d.pod).throttles.append(d)
        elif isinstance(d, Evict):
            of(d.pod).evicts.append(d)
        else:
            of(d.pod).others.append(d)
    ordered = sorted(work.values(), key=lambda w: (w.pod.namespace, w.pod.name, w.pod.uid))
    return ordered, budget_only


def exempt_work(w: PodWork) -> tuple[PodWork, list[Decision]]:
    """What may be done to a pod in an exempt namespace (cleanup only), and the
    decisions refused.

    The engine never asks to throttle or evict there, nor to write new
    vramguard state; those are refused (the safety check of this layer).
    Undoing what was done before the namespace was exempted is allowed: CPU
    restores and a patch that only removes annotations."""
    w = replace(w, explained=None)  # no new state there, not even the mark that Events were posted
    adds = any(v is not None for v in (w.patch or {}).values())
    refused: list[Decision] = [*w.throttles, *w.evicts]
    others = list(w.others)
    if adds:  # no restore without the patch that records it; Events of the rest only
        refused += [*w.restores, *(d for d in others if isinstance(d, Annotate | Cap))]
        others = [d for d in others if not isinstance(d, Annotate | Cap)]
    if not refused and not adds:
        return w, []
    if adds:
        return PodWork(w.pod, others=others), refused
    return PodWork(w.pod, patch=w.patch, restores=list(w.restores), others=others), refused


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """What the applier needs besides the output: the exempt namespaces (a safety
    check of its own: never act there), the eviction rate-limit scopes of each
    namespace, and each budget's current status (API form, None when unset)."""

    exempt_namespaces: frozenset[str]
    eviction_scopes: Callable[[str], tuple[str, ...]]
    current_status: Mapping[tuple[str, str], Mapping[str, Any] | None]


@dataclass(slots=True)
class ApplyResult:
    """Objects the API server returned (pods by uid, budgets by (ns, name)), so the
    next evaluation sees them before their watch events arrive; resize failures
    by pod uid, for the budget status; the pods whose annotation patch failed
    (``unwritten``: the steps fired on them did not happen)."""

    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    budgets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    resize_errors: dict[str, str] = field(default_factory=dict)
    resize_ok: set[str] = field(default_factory=set)
    unwritten: set[str] = field(default_factory=set)

    def record_resize(self, pod: PodRef, outcome: ResizeOutcome) -> None:
        """Keep a resize's returned pod, or its error for the budget status."""
        if outcome.pod is not None:
            self.pods[pod.uid] = outcome.pod
            self.resize_ok.add(pod.uid)
        elif outcome.error is not None:
            self.resize_errors[pod.uid] = outcome.error


class Applier:
    """Applies engine outputs with ``KubeActions``, posts their Events and counts
    them in the metrics. ``fence(namespace)``: whether this replica may act in
    a namespace right now (namespace shards, ``shards.ShardManager.owns``);
    asked before each pod's actions."""

    def __init__(
        self,
        actions: KubeActions,
        recorder: EventRecorder,
        limiter: EvictionLimiter,
        metrics: Metrics,
        fence: Callable[[str], bool] = lambda ns: True,
    ) -> None:
        self.fence = fence
        self.actions = actions
        self.recorder = recorder
        self.limiter = limiter
        self.metrics = metrics
        self.events = DecisionEvents(recorder, metrics)
        self.problems = ProblemReports(recorder, metrics)
        self.resizer = Resizer(actions.resize_pod, self.events)
        self.evictor = Evictor(actions.evict_pod, limiter, self.events)

    def apply(self, out: EngineOutput, ctx: ApplyContext) -> ApplyResult:
        """Apply one output: pods first (each in the documented order), then the
        budget-level Events and the object problems. The statuses are written
        after (``followed``, ``write_statuses``)."""
        result = ApplyResult()
        work, budget_only = plan_pod_work(out)
        for w in work:
            if not self.fence(w.pod.namespace):
                # another replica decides there now (its shard's Lease lapsed): act no more
                log.warning("pod %s/%s: not acting, this replica no longer holds its namespace's shard",
                            w.pod.namespace, w.pod.name)
                continue
            if w.pod.namespace in ctx.exempt_namespaces:
                w = self._exempt(w)
            self._apply_pod(w, ctx, result)
        for d in budget_only:
            if not self.fence(d.budget.namespace):
                continue
            self.events.explain(d, d.event)
            self.events.count(d, "success")
        for p in out.object_problems:
            if p.kind == "Pod" and p.namespace in ctx.exempt_namespaces:
                continue  # nothing is posted on pods there
            self.problems.report(p)
        return result

    def followed(self, statuses: Iterable[BudgetStatusUpdate], result: ApplyResult) -> list[BudgetStatusUpdate]:
        """Each budget's status as its pods have it: where the annotation patch of
        a pod it fired a step on failed, the status without this evaluation's
        steps (``BudgetStatusUpdate.unwritten``), so that the budget never
        records a step its pod does not have."""
        out = []
        for upd in statuses:
            if upd.unwritten is not None and upd.pods & result.unwritten:
                upd = replace(upd, status=upd.unwritten)
            out.append(replace(upd, unwritten=None, pods=frozenset()))
        return out

    def write_statuses(
        self, statuses: Iterable[BudgetStatusUpdate], ctx: ApplyContext, result: ApplyResult
    ) -> None:
        """Write each budget's desired status where the merge patch from its
        current status is not empty (call ``followed`` first)."""
        crashpoints.reached("before-status")
        for upd in self.followed(statuses, result):
            key = (upd.budget.namespace, upd.budget.name)
            current = {k: v for k, v in (ctx.current_status.get(key) or {}).items() if k != OOM_KILLS_FIELD}
            patch = merge_patch(current, upd.status.to_api())  # oomKills is the OOM publisher's: kept
            if not patch:
                continue
            try:
                budget = self.actions.patch_budget_status(upd.budget, patch)
            except API_ERRORS as err:
                if error_status(err) != 404:  # a deleted budget needs no status
                    log.warning("status of budget %s/%s: %s", *key, error_text(err))
                continue
            result.budgets[key] = budget

    def _exempt(self, w: PodWork) -> PodWork:
        allowed, refused = exempt_work(w)
        adds = any(v is not None for v in (w.patch or {}).values())
        if not refused and not adds:
            return allowed
        what = sorted({d.action for d in refused} | ({"annotation"} if adds else set()))
        log.error("refusing %s on pod %s/%s: exempt namespace", ", ".join(what), w.pod.namespace, w.pod.name)
        for d in refused:
            self.events.count(d, "skipped")
        return allowed

    def _apply_pod(self, w: PodWork, ctx: ApplyContext, result: ApplyResult) -> None:
        if w.restores:
            outcome = self.resizer.resize(w.pod, merged_resize(w.restores), w.restores)
            result.record_resize(w.pod, outcome)
            if not outcome.ok:
                return  # the patch keeps the originals, so the restore is retried
            crashpoints.reached("after-restore-resize")
        # Recoveries are explained before their records go: a crash in between
        # closes the violation again, and its Event key updates the Event.
        recovered = [*w.restores, *(d for d in w.others if isinstance(d, Recover))]
        for rec in recovered:
            self.events.explain(rec, rec.event)
            self.events.count(rec, "success")
        if recovered:
            crashpoints.reached("after-recovered-event")
        if w.patch:
            if not self._patch(w, result):
                return  # no action without its state written first
            crashpoints.reached("after-annotation-patch")
        explained = True
        if w.throttles:
            throttled, explained = self.resizer.throttle(w.pod, w.throttles)
            if throttled is not None:
                result.record_resize(w.pod, throttled)
        for ev in w.evicts[:1]:  # with a device-pressure eviction's fall-backs
            self.evictor.evict_first(ev, lambda ns: ns in ctx.exempt_namespaces, ctx.eviction_scopes)
        for other in w.others:
            if isinstance(other, Recover):
                continue
            posted = self.events.explain(other, other.event)
            explained = explained and (posted or not isinstance(other, Annotate | Cap))
            if not other.repost:
                self.events.count(other, _result(other))
            if isinstance(other, DryRunStep) and other.violation.kind == "DevicePressure":
                self.metrics.pressure_event("dry_run", w.pod.namespace)
        if w.explained and explained:
            crashpoints.reached("before-explained")
            self._mark_explained(w, result)

    def _patch(self, w: PodWork, result: ApplyResult) -> bool:
        assert w.patch is not None
        try:
            result.pods[w.pod.uid] = self.actions.patch_pod_annotations(w.pod, w.patch)
            return True
        except API_ERRORS as err:
            text = error_text(err)
            result.unwritten.add(w.pod.uid)
            log.warning("annotations of pod %s/%s: %s", w.pod.namespace, w.pod.name, text)
            if error_status(err) not in (404, 409):  # gone or replaced: nothing to explain
                for d in (*w.throttles, *w.evicts, *w.others):
                    if not isinstance(d, DryRunStep | Warn | Recover):
                        why = f"recording it on pod {w.pod.name} failed ({text}); retried at the next evaluation"
                        self.events.failed(d, why)
            for d in w.decisions():
                self.events.count(d, "failed")
            return False

    def _mark_explained(self, w: PodWork, result: ApplyResult) -> None:
        """Mark the pod's records posted; a failure is retried (the Events are
        posted again under their keys, which updates them)."""
        assert w.explained is not None
        try:
            result.pods[w.pod.uid] = self.actions.patch_pod_annotations(w.pod, w.explained)
        except API_ERRORS as err:
            log.warning("marking the Events of pod %s/%s posted: %s", w.pod.namespace, w.pod.name, error_text(err))


def _result(d: Decision) -> str:
    """The ``vramguard_actions_total`` result of a decision whose work is its Event
    (and, for Annotate and Cap, the pod patch written before it)."""
    if isinstance(d, DryRunStep):
        return "dry_run"
    return "impossible" if isinstance(d, Cap) and d.impossible_reason is not None else "success"
