"""The reconcile loop: snapshot the indexes, run the pure engine, apply.

One loop per operator (an asyncio task started at kopf's startup). The kopf
handlers only update indexes and call ``Reconciler.trigger``; the loop wakes
on a trigger (after a short debounce, so that a burst of events makes one
evaluation) and at least every ``evaluation_period`` (so that escalation delays
fire on time without any event). Each evaluation:

1. copies the indexes (on the event loop's thread, without awaiting) and lays
   over them the objects the operator wrote itself and the watch has not
   delivered yet;
2. works out, per namespace, the effective GPUMemoryPolicy (cluster-wide mode,
   exempt namespaces, eviction rate limits) and groups namespaces by it;
3. runs ``engine.evaluate`` once per group, in a worker thread, with a time
   limit per budget (``isolation.GuardedEngine``);
4. applies each output in the documented order (``applier.Applier``) and writes
   the budget statuses that changed.

Nothing about escalation is kept in memory: it lives on the pods (annotations)
and budgets (status), which the engine reads back every time. What the loop
keeps is only an optimisation (the overlay) or an explanation (resize errors,
Event counts, eviction back-off).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from vramguard_operator.controller.applier import Applier, ApplyContext, ApplyResult
from vramguard_operator.controller.events import pod_object
from vramguard_operator.controller.indexes import Overlay, Snapshot
from vramguard_operator.controller.isolation import GuardedEngine
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.planning import Group, Plan, invalid_status, note_resize_errors, plan
from vramguard_operator.controller.settings import OperatorConfig
from vramguard_operator.engine.types import (
    ANNOTATION_ORIGINAL_CPU,
    BudgetRef,
    BudgetStatusUpdate,
    DevicePressureReport,
    EngineOutput,
    EventSpec,
)
from vramguard_operator.policy import plan as policy_plan
from vramguard_operator.policy.merge import selector_problems

log = logging.getLogger("vramguard.reconcile")

# --- the loop ---------------------------------------------------------------------------


class Reconciler:
    """The evaluation loop and its (non-essential) memory."""

    def __init__(
        self,
        config: OperatorConfig,
        applier: Applier,
        metrics: Metrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.applier = applier
        self.metrics = metrics
        self.clock = clock
        self.engine = GuardedEngine(config.evaluation_timeout, metrics)
        self.overlay = Overlay()
        self.policy_memory = policy_plan.PolicyMemory()
        self.resize_errors: dict[str, tuple[str, str, str]] = {}  # uid -> (ns, pod, error)
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._first_trigger: float | None = None
        self.last_evaluation: float | None = None  # monotonic
        self.evaluations = 0
        self._policy_problems: dict[str, str] = {}  # last logged, to log changes only
        self._devices: list[DevicePressureReport] = []  # of the evaluation under way, for metrics

    # -- called by handlers (on the event loop)

    def trigger(self) -> None:
        """Ask for an evaluation soon (after the debounce)."""
        if self._first_trigger is None:
            self._first_trigger = time.monotonic()
        self._wake.set()

    def mark_ready(self) -> None:
        """The indexes hold every object of the initial listings: start evaluating."""
        if not self.ready.is_set():
            log.info("indexes populated; evaluations start")
            self.ready.set()

    # -- the loop

    async def run(self, read: Callable[[], Snapshot]) -> None:
        """Evaluate on triggers and on the timer, forever (cancel to stop)."""
        await self.ready.wait()
        period = self.config.evaluation_period
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=period)
                await asyncio.sleep(self.config.debounce)
            except TimeoutError:
                pass
            self._wake.clear()
            started = self._first_trigger or time.monotonic()
            self._first_trigger = None
            snap = read()
            try:
                await asyncio.to_thread(self.evaluate_and_apply, snap)
            except Exception:  # one bad evaluation must not stop the loop
                log.exception("evaluation failed")
            self.metrics.observe_latency(time.monotonic() - started)

    # -- one evaluation (worker thread)

    def evaluate_and_apply(self, snap: Snapshot) -> None:
        """Evaluate a snapshot and apply the decisions."""
        now = self.clock()
        snap = self.overlay.apply(snap)
        live = {p.value.uid for pods in snap.pods.values() for p in pods}
        self._forget(snap, live)  # before acting: errors of this evaluation stay till the next
        self._log_policy_problems(snap)
        work = plan(snap, now, self.config.engine(), self.policy_memory, self.config.dra)
        limiter = self.applier.limiter
        limiter.configure({n: p.spec.eviction_rate_limit for n, p in snap.valid_policies().items()})
        self._devices = []
        for group in work.groups:
            self._evaluate_group(group, work)
        self.metrics.set_devices(self._devices)
        self._write_invalid(work, now)
        limiter.forget(live)
        self.policy_memory.forget(live)
        budgets = [(ns, e.value.name) for ns, entries in snap.budgets.items() for e in entries]
        self.metrics.forget_budgets(budgets, snap.budgets.keys() | snap.pods.keys())
        self.metrics.set_report_ages(snap.sample_times(), now)
        self.last_evaluation = time.monotonic()
        self.evaluations += 1

    def _log_policy_problems(self, snap: Snapshot) -> None:
        """Log (when they change) the policies that cannot be evaluated: each
        holds every namespace in DryRun until it is fixed."""
        problems = {**selector_problems(snap.valid_policies().values()), **snap.invalid_policies()}
        if problems == self._policy_problems:
            return
        if problems:
            log.error("%s; every namespace is held in DryRun (no actions) until fixed",
                      "; ".join(problems[n] for n in sorted(problems)))
        else:
            log.info("every GPUMemoryPolicy is valid again; namespaces follow their policies")
        self._policy_problems = problems

    def _evaluate_group(self, group: Group, work: Plan) -> None:
        """Evaluate and apply one group; an exception is logged with the group's
        namespaces and counted, and the other groups go on (a bug hit by one
        namespace's objects must not stop enforcement everywhere)."""
        where = ", ".join(group.namespaces)
        try:
            out = self.engine.evaluate(group.input, where)
        except Exception:
            log.exception("evaluation of namespaces %s failed; other namespaces go on", where)
            self.metrics.evaluation_error("evaluate")
            return
        if out is None:  # ran out of time outside any budget: reported, skipped this time
            return
        for problem in out.problems:
            log.warning("%s", problem)
        try:
            self._apply(group, out, work)
        except Exception:
            log.exception("applying the decisions of namespaces %s failed; other namespaces go on",
                          where)
            self.metrics.evaluation_error("apply")

    def _apply(self, group: Group, out: EngineOutput, work: Plan) -> None:
        ctx = ApplyContext(
            exempt_namespaces=group.policy.exempt_namespaces,
            eviction_scopes=lambda ns: work.policies[ns].scopes,
            current_status=group.current_status,
        )
        result = self.applier.apply(out, ctx)
        self._devices.extend(out.devices)
        self.metrics.set_memory_limits(group.namespaces, out.memory_limits)
        for body in result.pods.values():
            self.overlay.record_pod(body)
        pods = {p.uid: p for p in group.input.pods}
        for uid in result.resize_ok:
            self.resize_errors.pop(uid, None)
        for uid, err in result.resize_errors.items():
            pod = pods.get(uid)
            if pod is not None:
                self.resize_errors[uid] = (pod.namespace, pod.name, err)
        statuses = []
        for upd in self.policy_memory.finish(self.applier.followed(out.statuses, result), group.view):
            errs = {
                name: err
                for ns, name, err in self.resize_errors.values()
                if ns == upd.budget.namespace
            }
            statuses.append(replace(upd, status=note_resize_errors(upd.status, errs)))
            self.metrics.set_budget_violations(upd.budget.namespace, upd.budget.name, upd.status)
        self.applier.write_statuses(statuses, ctx, result)
        for body in result.budgets.values():
            self.overlay.record_budget(body)
        self._write_limits(group)
        self._report_grant_problems(group)

    def _report_grant_problems(self, group: Group) -> None:
        """A Warning Event on the pod for each problem with its grants (a malformed
        annotation or claim, an allocated device that vanished), once; none in
        exempt namespaces. Events are allowed in DryRun."""
        for ref, problem in self.policy_memory.pending_problems(group.view):
            if ref.namespace not in group.policy.exempt_namespaces:
                self.applier.recorder.post(pod_object(ref), EventSpec("Warning", problem.reason, problem.message))
            self.policy_memory.reported_problem(ref, problem)

    def _write_limits(self, group: Group) -> None:
        """Write the ``vramguard.io/limits`` annotations of GPU pods no budget
        selects, only where vramguard may change objects: not in DryRun (which
        changes nothing but status, Events and metrics) nor in exempt namespaces
        (budget status, ``vramguard top`` and Events still name the sources)."""
        if group.policy.mode == "DryRun":
            return
        for ref, patch in self.policy_memory.pending_limits(group.view):
            if ref.namespace in group.policy.exempt_namespaces:
                continue
            try:
                body = self.applier.actions.patch_pod_annotations(ref, patch)
            except Exception as err:  # the next evaluation retries
                log.warning("pod %s/%s: vramguard.io/limits not written: %s", ref.namespace, ref.name, err)
                continue
            self.policy_memory.wrote_limits(ref, patch)
            self.overlay.record_pod(body)

    def _write_invalid(self, work: Plan, now: datetime) -> None:
        updates, current = [], {}
        for e in work.invalid:
            b = e.value
            log.warning("%s (namespace %s held until it is fixed)", b.error, b.namespace)
            ref = BudgetRef(b.namespace, b.name, e.uid)
            updates.append(BudgetStatusUpdate(ref, invalid_status(b, now)))
            current[(b.namespace, b.name)] = b.status_api()
        if not updates:
            return
        ctx = ApplyContext(frozenset(), lambda ns: ("",), current)
        result = ApplyResult()
        self.applier.write_statuses(updates, ctx, result)
        for body in result.budgets.values():
            self.overlay.record_budget(body)

    def _forget(self, snap: Snapshot, live: set[str]) -> None:
        """Drop resize errors of pods that are gone or no longer throttled."""
        throttled = {
            p.value.uid
            for pods in snap.pods.values()
            for p in pods
            if ANNOTATION_ORIGINAL_CPU in p.value.annotations
        }
        for uid in [u for u in self.resize_errors if u not in live or u not in throttled]:
            del self.resize_errors[uid]
