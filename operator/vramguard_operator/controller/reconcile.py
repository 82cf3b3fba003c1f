"""The reconcile loop: take the informers' changes, evaluate what they affect
with the pure engine, apply.

One thread per operator. The informers (``informer``) hand every change to
``sink``; the loop wakes on a change (after a short debounce, so that a burst
makes one evaluation), on the timer queue (a violation's next step, a report
turning stale) and every ``evaluation_period`` for level-triggered steps.
Each pass:

1. takes the changes into the cache (``plan.cache``), which notes what each may
   affect; the echo of the operator's own writes notes nothing;
2. plans the marked budgets and pods, closed over what the engine reads with
   them, in groups of namespaces with the same effective policy
   (``plan.incremental``);
3. runs ``engine.evaluate`` once per group;
4. applies each output in the documented order (``applier.Applier``: pods,
   Events), and hands the budget statuses and ``vramguard.io/limits``
   annotations to the status writer (``status_writer``), off the decision path.

The first pass runs once every informer has listed its collection, over
everything: a restarted operator never mistakes "not listed yet" for
"deleted". Nothing about escalation is kept only in memory: it lives on the
pods (annotations) and budgets (status), which the engine reads back.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from vramguard_api import API_VERSION
from vramguard_api import conditions as C
from vramguard_operator.controller import crashpoints
from vramguard_operator.controller.applier import Applier, ApplyContext, ApplyResult
from vramguard_operator.controller.events import ObjectRef, pod_object
from vramguard_operator.controller.isolation import GuardedEngine
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.settings import OperatorConfig
from vramguard_operator.controller.status_writer import StatusWriter
from vramguard_operator.engine.keys import EVENT_REPORT_UNKNOWN_PODS
from vramguard_operator.engine.types import (
    ANNOTATION_ORIGINAL_CPU,
    BudgetRef,
    BudgetStatusUpdate,
    DevicePressureReport,
    EngineOutput,
    EventSpec,
    PodMemoryLimits,
    PodRef,
)
from vramguard_operator.plan.cache import ClusterCache
from vramguard_operator.plan.changes import Change, Synced
from vramguard_operator.plan.entries import pod_cache_entry
from vramguard_operator.plan.incremental import Group, Incremental
from vramguard_operator.plan.report_pods import UnknownReportPods
from vramguard_operator.plan.status_notes import invalid_status, note_resize_errors
from vramguard_operator.plan.timers import seconds_until
from vramguard_operator.policy.merge import selector_problems

log = logging.getLogger("vramguard.reconcile")

_LimitsDone = tuple[str, PodRef, Mapping[str, str | None], dict[str, Any]]
FREEZE_PERIOD = 600.0  # seconds


def freeze_heap() -> None:
    """Collect, then move every object alive into the collector's permanent
    generation (``gc.freeze``). The cache holds hundreds of thousands of small
    objects that live as long as their pod or report; without this, each full
    collection walks all of them (measured: a node report cost 3.5 ms at 250
    nodes and 5.9 ms at 2,000 without, 1.9 and 2.8 ms with). Objects made
    later are collected as usual; frozen ones are still freed by reference
    counting when dropped (the cache's objects hold no cycles)."""
    gc.collect()
    gc.freeze()


class Reconciler:
    """The evaluation loop and its (non-essential) memory.

    ``kinds``: the informers' collections to wait for before the first pass.
    ``owned(ns)``: whether this replica decides there (shards). ``watched(ns)``:
    whether its pods are watched (``--namespace``)."""

    def __init__(
        self,
        config: OperatorConfig,
        applier: Applier,
        metrics: Metrics,
        writer: StatusWriter | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        kinds: Iterable[str] = (),
        owned: Callable[[str], bool] = lambda ns: True,
        watched: Callable[[str], bool] = lambda ns: True,
    ) -> None:
        self.config = config
        self.applier = applier
        self.metrics = metrics
        self.writer = writer
        self.clock = clock
        self.engine = GuardedEngine(config.evaluation_timeout, metrics)
        self.cache = ClusterCache()
        self.inc = Incremental(self.cache, config.engine(), config.evaluation_period, owned, config.dra)
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.waiting = set(kinds)
        self.resize_errors: dict[str, tuple[str, str, str]] = {}  # uid -> (ns, pod, error)
        self.ready = threading.Event()
        self.last_evaluation: float | None = None  # monotonic
        self.evaluations = 0
        self._first_change: float | None = None
        self._policy_problems: dict[str, str] = {}  # last logged, to log changes only
        self._devices: dict[tuple[str, str], DevicePressureReport] = {}  # the last report of each device
        self._devices_changed: set[tuple[str, str]] = set()  # since the gauges were last set
        self._limits: dict[str, PodMemoryLimits] = {}  # by pod uid: the last settled memory limits
        # grace: a report's freshness; judged: the pods this replica's cache holds and decides on
        self.unknown_pods = UnknownReportPods(config.freshness, lambda ns: watched(ns) and owned(ns))
        self._tidy_at = 0.0
        self._freeze_at = time.monotonic() + FREEZE_PERIOD

    # -- fed from other threads

    def sink(self, item: Change[Any] | Synced | _LimitsDone | tuple[str, Any]) -> None:
        """Hand over an informer's change or sync, or a note from the writer."""
        self.inbox.put(item)

    def wrote_limits(self, ref: PodRef, patch: Mapping[str, str | None], body: dict[str, Any]) -> None:
        """The status writer wrote a pod's ``vramguard.io/limits``."""
        self.inbox.put(("limits", ref, patch, body))

    def gain(self, owned: Callable[[str], bool]) -> None:
        """This replica decides in the namespaces ``owned`` says from now on (a
        shard gained): they are evaluated from the API's state."""
        self.inbox.put(("gain", owned))

    # -- the loop

    def run(self, stop: threading.Event) -> None:
        """Evaluate until ``stop`` is set (call in a thread of its own)."""
        while self.waiting and not stop.is_set():
            self._take(self.inbox.get())
        if stop.is_set():
            return
        log.info("every collection listed (%d pods, %d budgets, %d reports); evaluating",
                 len(self.cache.pods), len(self.cache.budgets), len(self.cache.reports))
        self.inc.mark_all()
        self.step()
        freeze_heap()
        self.ready.set()
        while not stop.is_set():
            self._wait(stop)
            self.step()

    def _wait(self, stop: threading.Event) -> None:
        """Until a change (then the debounce and every change queued), or the next timer."""
        if self.inc.pending():
            return
        timeout = seconds_until(self.inc.next_time(), self.clock(), self.config.evaluation_period)
        try:
            item = self.inbox.get(timeout=max(0.001, timeout))
        except queue.Empty:
            return
        self._take(item)
        if self.config.debounce > 0 and not stop.is_set():
            time.sleep(self.config.debounce)
        self.drain()

    def drain(self) -> int:
        """Take every queued change into the cache; returns how many."""
        n = 0
        while True:
            try:
                self._take(self.inbox.get_nowait())
            except queue.Empty:
                return n
            n += 1

    def _take(self, item: Any) -> None:
        if isinstance(item, Synced):
            self.waiting.discard(item.kind)
        elif isinstance(item, Change):
            if self._first_change is None:
                self._first_change = time.monotonic()
            self.cache.apply(item)
            if item.kind == "budgets" and item.new is None and self.writer is not None:
                self.writer.forget(item.key)  # type: ignore[arg-type]
        elif item[0] == "limits":
            _, ref, patch, body = item
            self.inc.memory.wrote_limits(ref, patch)
            self.cache.record_pod(pod_cache_entry(body))
        elif item[0] == "gain":
            spaces = {ns for ns in self.cache.known_namespaces() if item[1](ns)}
            self.cache.forget_statuses(spaces)
            self.inc.mark_namespaces(spaces)

    # -- one pass (the loop's thread)

    def step(self) -> int:
        """Evaluate what is marked and apply; returns the groups evaluated."""
        self.drain()
        started = self._first_change or time.monotonic()
        t0 = time.monotonic()
        self._first_change = None
        now = self.clock()
        work = self.inc.plan(now)
        if self.inc.policies_changed:
            self.inc.policies_changed = False
            self._policies_changed()
        for group in work.groups:
            self._evaluate_group(group, now)
        self._write_invalid(work.invalid, now)
        self._tidy(now)
        if work:
            self.metrics.update_devices({k: self._devices.get(k) for k in self._devices_changed})
            self._devices_changed.clear()
            self.metrics.set_memory_limits(self.cache.known_namespaces(), self._limits.values())
            self.metrics.observe_latency(time.monotonic() - started)
            self.metrics.observe_pass(time.monotonic() - t0)
            log.debug("pass: %d groups, %d budgets, %d pods in %.3fs", len(work.groups),
                      sum(len(g.budget_keys) for g in work.groups), sum(len(g.pod_uids) for g in work.groups),
                      time.monotonic() - t0)
        self.last_evaluation = time.monotonic()
        self.evaluations += 1
        return len(work.groups)

    def _policies_changed(self) -> None:
        """Eviction rate limits, and a log line when a policy cannot be evaluated."""
        c = self.cache
        self.applier.limiter.configure({n: p.spec.eviction_rate_limit for n, p in c.valid_policies().items()})
        problems = {**selector_problems(c.valid_policies().values()), **c.invalid_policies()}
        if problems == self._policy_problems:
            return
        if problems:
            log.error("%s; every namespace is held in DryRun (no actions) until fixed",
                      "; ".join(problems[n] for n in sorted(problems)))
        elif self._policy_problems:
            log.info("every GPUMemoryPolicy is valid again; namespaces follow their policies")
        self._policy_problems = problems

    def _evaluate_group(self, group: Group, now: datetime) -> None:
        """Evaluate and apply one group; an exception is logged with the group's
        namespaces and counted, and the other groups go on (a bug hit by one
        namespace's objects must not stop enforcement everywhere)."""
        where = ", ".join(group.namespaces)
        for problem in group.view.problems:
            log.warning("%s", problem)
        try:
            out = self.engine.evaluate(group.input, where)
        except Exception:
            log.exception("evaluation of namespaces %s failed; other namespaces go on", where)
            self.metrics.evaluation_error("evaluate")
            self.inc.retry(group, now)
            return
        if out is None:  # ran out of time outside any budget: reported, looked at again next period
            self.inc.retry(group, now)
            return
        for problem in out.problems:
            log.warning("%s", problem)
        self.inc.evaluated(group, out, now)
        # a budget held for running out of time is looked at every period, so
        # that it is evaluated again once its hold ends (isolation.HOLD_SECONDS)
        timed_out: set[tuple[str, ...]] = {("b", p.namespace, p.name) for p in out.object_problems
                     if p.kind == "GPUMemoryBudget" and p.reason == C.REASON_EVALUATION_TIMEOUT}
        if timed_out:
            self.inc.retry_units(timed_out, now)
        try:
            self._apply(group, out, now)
        except Exception:
            log.exception("applying the decisions of namespaces %s failed; other namespaces go on", where)
            self.metrics.evaluation_error("apply")

    def _apply(self, group: Group, out: EngineOutput, now: datetime) -> None:
        ctx = ApplyContext(
            exempt_namespaces=group.policy.effective.exempt_namespaces,
            eviction_scopes=lambda ns: self.inc.policy_of(ns).scopes,
            current_status={},
        )
        result = self.applier.apply(out, ctx)
        self._note_outputs(group, out)
        if result.unwritten:  # a refused state write: that pod again next period
            self.inc.retry_units({("p", uid) for uid in result.unwritten}, now)
        for body in result.pods.values():
            self.cache.record_pod(pod_cache_entry(body))
        self._note_resizes(group, result)
        crashpoints.reached("before-status")
        for upd in self.inc.memory.finish(self.applier.followed(out.statuses, result), group.view):
            errs = {name: err for ns, name, err in self.resize_errors.values() if ns == upd.budget.namespace}
            upd = replace(upd, status=note_resize_errors(upd.status, errs))
            self.metrics.set_budget_violations(upd.budget.namespace, upd.budget.name, upd.status)
            self._hand_over(upd)
        self._queue_limits(group)
        self._report_grant_problems(group)

    def _note_outputs(self, group: Group, out: EngineOutput) -> None:
        """Keep the group's device reports and memory limits for the metrics
        (an evaluation reports only the devices and pods it evaluated)."""
        nodes = {p.node_name for p in group.input.pods if p.node_name} - group.far_nodes
        for key in [k for k in self._devices if k[0] in nodes]:
            del self._devices[key]
            self._devices_changed.add(key)
        for d in out.devices:
            if d.node in nodes:  # a far node's devices were judged with some of its pods only
                self._devices[(d.node, d.device)] = d
                self._devices_changed.add((d.node, d.device))
        for uid in group.pod_uids:
            self._limits.pop(uid, None)
        for lim in out.memory_limits:
            self._limits[lim.pod.uid] = lim

    def _report_grant_problems(self, group: Group) -> None:
        """A Warning Event on the pod for each problem with its grants (a malformed
        annotation or claim, an allocated device that vanished), once; none in
        exempt namespaces. Events are allowed in DryRun."""
        for ref, problem in self.inc.memory.pending_problems(group.view):
            if ref.namespace not in group.policy.effective.exempt_namespaces:
                self.applier.recorder.post(pod_object(ref), EventSpec("Warning", problem.reason, problem.message))
            self.inc.memory.reported_problem(ref, problem)

    def _note_resizes(self, group: Group, result: ApplyResult) -> None:
        pods = {p.uid: p for p in group.input.pods}
        for uid in result.resize_ok:
            self.resize_errors.pop(uid, None)
        for uid, err in result.resize_errors.items():
            pod = pods.get(uid)
            if pod is not None:
                self.resize_errors[uid] = (pod.namespace, pod.name, err)
        for uid, pod in pods.items():  # no longer throttled: nothing to explain
            if ANNOTATION_ORIGINAL_CPU not in pod.annotations and uid not in result.resize_errors:
                self.resize_errors.pop(uid, None)

    def _hand_over(self, upd: BudgetStatusUpdate) -> None:
        """The budget's new desired status: read by the next evaluation, written by the writer."""
        key = (upd.budget.namespace, upd.budget.name)
        desired = upd.status.to_api()
        self.cache.set_status(key, upd.status, desired)
        if self.writer is None:
            return
        entry = self.cache.budgets.get(key)
        current = entry.value.status_api() if entry is not None else None
        self.writer.put(upd, desired, current, entry.resource_version if entry is not None else "")

    def _queue_limits(self, group: Group) -> None:
        """The ``vramguard.io/limits`` annotations of GPU pods no budget selects,
        only where vramguard may change objects: not in DryRun (which changes
        nothing but status, Events and metrics) nor in exempt namespaces."""
        if group.policy.effective.mode == "DryRun" or self.writer is None:
            return
        for ref, patch in self.inc.memory.pending_limits(group.view):
            if ref.namespace not in group.policy.effective.exempt_namespaces:
                self.writer.put_limits(ref, patch)

    def _write_invalid(self, invalid: list[Any], now: datetime) -> None:
        for e in invalid:
            b = e.value
            log.warning("%s (budget %s/%s held until it is fixed; the rest of its namespace goes on)",
                        b.error, b.namespace, b.name)
            upd = BudgetStatusUpdate(BudgetRef(b.namespace, b.name, e.uid), invalid_status(b, now))
            if self.writer is not None:
                self.writer.put(upd, upd.status.to_api(), b.status_api(), e.resource_version)

    def _tidy(self, now: datetime) -> None:
        """Every evaluation period: forget what belongs to pods and budgets that
        are gone, and refresh the report ages."""
        if time.monotonic() < self._tidy_at:
            return
        self._tidy_at = time.monotonic() + self.config.evaluation_period
        live = set(self.cache.pods)
        self.inc.forget(live)
        for uid in [u for u in self._limits if u not in live]:
            del self._limits[uid]
        for key in [k for k in self._devices if k[0] not in self.cache.reports]:
            del self._devices[key]
            self._devices_changed.add(key)
        self.applier.limiter.forget(live)
        for uid in [u for u in self.resize_errors if u not in live]:
            del self.resize_errors[uid]
        self.metrics.forget_budgets(self.cache.budgets, self.cache.known_namespaces())
        times = {n: r.status.sample_time for n in self.cache.reports
                 if (r := self.cache.report(n)) is not None and r.status is not None}
        self.metrics.set_report_ages(times, now)
        self._flag_unknown_pods(now)
        if time.monotonic() >= self._freeze_at:
            self._freeze_at = time.monotonic() + FREEZE_PERIOD
            freeze_heap()

    def _flag_unknown_pods(self, now: datetime) -> None:
        """Reports naming pod uids that are not pods on their node (the pod
        informers have listed: the loop evaluates only then): a Warning Event
        on the report and a log line per change, the node's gauge. Nothing is
        acted on, and the rest of the report is still believed."""
        for node, flag in self.unknown_pods.update(self.cache, now).items():
            self.metrics.set_unknown_pods(node, None if flag is None else flag.count)
            if flag is None:
                log.info("node %s: its NodeGPUUsage names only pods on the node again", node)
                continue
            log.warning("node %s: its NodeGPUUsage %s (not acted on)", node, flag.message)
            rep = self.cache.report(node)
            meta = rep.metadata if rep is not None else None
            obj = ObjectRef(API_VERSION, "NodeGPUUsage", "", (meta.name if meta else None) or node,
                            (meta.uid if meta else None) or "")
            text = f"{flag.message}; not acted on, the rest of the report is believed"
            if not self.applier.recorder.post(obj, EventSpec("Warning", EVENT_REPORT_UNKNOWN_PODS, text)):
                self.unknown_pods.retry(node)  # the Event again at the next period
