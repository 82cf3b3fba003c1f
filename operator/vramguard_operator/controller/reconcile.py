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
3. runs ``engine.evaluate`` once per group, in a worker thread;
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
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.meta import Condition
from vramguard_api.policy import EvictionRateLimit, GPUMemoryPolicy
from vramguard_api.units import parse_duration
from vramguard_operator.controller.applier import Applier, ApplyContext, ApplyResult
from vramguard_operator.controller.indexes import BudgetEntry, Overlay, Snapshot, Versioned, has_vramguard_state
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.ratelimit import EvictionLimiter
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import (
    ANNOTATION_ORIGINAL_CPU,
    BudgetRef,
    BudgetStatusUpdate,
    EffectivePolicy,
    EngineConfig,
    EngineInput,
    EngineOutput,
    PodFacts,
)
from vramguard_operator.policy import plan as policy_plan
from vramguard_operator.policy.merge import merge, selector_problems

log = logging.getLogger("vramguard.reconcile")

# --- configuration --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """Settings of the operator that are not in any custom resource (seconds).

    ``evaluation_period``: longest time between evaluations (escalation delays
    fire at most this late). ``debounce``: wait after a trigger, so that a burst
    of events makes one evaluation. ``freshness``: a node report older than this
    is stale (no action on its pods). ``eviction_retry``: wait after a
    PodDisruptionBudget refused an eviction. ``default_rate_limit``: eviction
    rate limit where no GPUMemoryPolicy selects the namespace.
    ``request_timeout``: timeout of each API call made by the actions.
    """

    evaluation_period: float = 5.0
    debounce: float = 0.02
    freshness: float = 60.0
    eviction_retry: float = 30.0
    default_rate_limit: EvictionRateLimit = field(default_factory=EvictionRateLimit)
    request_timeout: float = 10.0

    def engine(self) -> EngineConfig:
        """The engine's settings."""
        return EngineConfig(freshness_seconds=self.freshness)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorConfig:
        """Settings from ``VRAMGUARD_*`` environment variables (Go durations),
        for an operator started without the ``vramguard operator`` command (for
        example ``kopf run -m vramguard_operator.controller.handlers``). Raises ``ValueError``
        naming the variable on a bad value."""
        d = cls()

        def dur(name: str, default: float) -> float:
            value = env.get(name)
            return default if value is None else parse_duration(value, field=name)

        def num(name: str, default: int) -> int:
            value = env.get(name)
            if value is None:
                return default
            if not value.isdigit():
                raise ValueError(f"{name}: want a whole number, got {value!r}")
            return int(value)

        rate = EvictionRateLimit(
            perMinute=num("VRAMGUARD_EVICTION_RATE_PER_MINUTE", d.default_rate_limit.per_minute),
            burst=num("VRAMGUARD_EVICTION_BURST", d.default_rate_limit.burst),
        )
        return cls(
            evaluation_period=dur("VRAMGUARD_EVALUATION_PERIOD", d.evaluation_period),
            debounce=dur("VRAMGUARD_DEBOUNCE", d.debounce),
            freshness=dur("VRAMGUARD_FRESHNESS", d.freshness),
            eviction_retry=dur("VRAMGUARD_EVICTION_RETRY", d.eviction_retry),
            default_rate_limit=rate,
            request_timeout=dur("VRAMGUARD_REQUEST_TIMEOUT", d.request_timeout),
        )


# --- policies per namespace ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NamespacePolicy:
    """What the GPUMemoryPolicies say for one namespace: the engine's effective
    policy, and the eviction rate-limit scopes (names of the policies that
    select it; the default scope ``""`` when none does)."""

    effective: EffectivePolicy
    scopes: tuple[str, ...]


def namespace_policies(
    policies: Mapping[str, GPUMemoryPolicy],
    namespace_labels: Mapping[str, Mapping[str, str]],
    namespaces: Iterable[str],
    invalid: Mapping[str, str] | None = None,
) -> dict[str, NamespacePolicy]:
    """The policy of each namespace, by ``policies.merge`` (docs/policy.md,
    "Precedence"): DryRun wins over Enforce; a namespace listed in any policy's
    ``exemptNamespaces`` is exempt (``kube-system`` when there is no policy).
    The effective policy's ``exempt_namespaces`` is the namespace itself when it
    is exempt, else empty; the rate-limit scopes are the applying policies.

    Fail safe: while a policy cannot be evaluated (a malformed selector, or a
    spec in ``invalid``: name -> error, that does not parse), every namespace
    is DryRun and exempt from actions."""
    every = [policies[n] for n in sorted(policies)]
    out = {}
    for ns in namespaces:
        merged = merge(every, ns, namespace_labels.get(ns, {}), invalid)
        held = merged.exempt or bool(merged.invalid)
        out[ns] = NamespacePolicy(
            EffectivePolicy(
                mode=merged.effective_mode,
                exempt_namespaces=frozenset({ns}) if held else frozenset(),
            ),
            merged.policies or (EvictionLimiter.DEFAULT_SCOPE,),
        )
    return out


# --- evaluation inputs ------------------------------------------------------------------


@dataclass(slots=True)
class Group:
    """Namespaces evaluated together (same effective policy), and their input."""

    policy: EffectivePolicy
    namespaces: list[str]
    input: EngineInput
    current_status: dict[tuple[str, str], dict[str, Any] | None]
    view: policy_plan.PolicyView | None = None  # ceilings and implicit budgets applied


@dataclass(slots=True)
class Plan:
    """One evaluation's work: engine groups, budgets whose spec does not parse
    (their namespace is held: nothing is decided there until it is fixed), and
    each namespace's policy."""

    groups: list[Group]
    invalid: list[Versioned[BudgetEntry]]
    policies: dict[str, NamespacePolicy]


def scope_of(snap: Snapshot) -> list[str]:
    """Namespaces to evaluate: those with budgets, and those with pods that carry
    vramguard annotations (a deleted budget's violations to close, a throttled
    pod to restore)."""
    scope = {ns for ns, entries in snap.budgets.items() if entries}
    for ns, pods in snap.pods.items():
        if ns not in scope and any(has_vramguard_state(p.value) for p in pods):
            scope.add(ns)
    scope |= {ns for ns, gpu_pods in snap.gpu_pods.items() if gpu_pods}  # implicit budgets
    return sorted(scope)


def plan(
    snap: Snapshot, now: datetime, config: EngineConfig, memory: policy_plan.PolicyMemory | None = None
) -> Plan:
    """Build the engine inputs of one evaluation from a snapshot."""
    scope = scope_of(snap)
    broken = snap.invalid_policies()
    merged = policy_plan.merged_policies(
        list(snap.valid_policies().values()), snap.namespaces, scope, broken
    )
    nodes = policy_plan.node_facts(snap.gpu_nodes, snap.valid_reports())
    pols = namespace_policies(snap.valid_policies(), snap.namespaces, scope, broken)
    reports = snap.valid_reports()
    invalid = [e for ns in scope for e in snap.budgets.get(ns, ()) if e.value.budget is None]
    held = {e.value.namespace for e in invalid}
    by_policy: dict[EffectivePolicy, list[str]] = {}
    for ns in scope:
        if ns not in held:
            by_policy.setdefault(pols[ns].effective, []).append(ns)
    groups = []
    for policy, namespaces in by_policy.items():
        budgets: list[GPUMemoryBudget] = []
        current: dict[tuple[str, str], dict[str, Any] | None] = {}
        pods: list[PodFacts] = []
        for ns in namespaces:
            for e in snap.budgets.get(ns, ()):
                assert e.value.budget is not None
                budgets.append(e.value.budget)
                current[(ns, e.value.name)] = e.value.status_api()
            pods.extend(p.value for p in snap.pods.get(ns, ()))
        gpu_pods = [p for ns in namespaces for p in snap.gpu_pods.get(ns, ())]
        previous = memory.implicit_status if memory is not None else None
        view = policy_plan.prepare(budgets, pods, gpu_pods, nodes, merged, previous)
        for problem in view.problems:
            log.warning("%s", problem)
        inp = EngineInput(
            budgets=view.budgets,
            pods=view.pods,
            reports=reports,
            now=now,
            policy=policy,
            config=config,
        )
        groups.append(Group(policy, namespaces, inp, current, view))
    return Plan(groups, invalid, pols)


def invalid_status(entry: BudgetEntry, now: datetime) -> GPUMemoryBudgetStatus:
    """The status of a budget whose spec does not parse: Ready=False with reason
    InvalidSpec and the error; the rest of its status (escalation state) kept."""
    prev = GPUMemoryBudgetStatus()
    if entry.status:
        try:
            prev = GPUMemoryBudgetStatus.model_validate(entry.status)
        except ValueError:
            prev = GPUMemoryBudgetStatus()
    conditions = bs.settle_conditions(
        [bs.invalid(entry.error or "invalid spec")], prev.conditions, entry.generation, now
    )
    kept: list[Condition] = [c for c in prev.conditions or () if c.type != conditions[0].type]
    return prev.model_copy(
        update={"observed_generation": entry.generation, "conditions": [*conditions, *kept]}
    )


def note_resize_errors(
    status: GPUMemoryBudgetStatus, errors_by_pod: Mapping[str, str]
) -> GPUMemoryBudgetStatus:
    """Add to each violation at step Throttle (or beyond) the error of its pod's
    refused resize, so the status says why the pod is not throttled."""
    if not errors_by_pod or not status.violations:
        return status
    violations = []
    for v in status.violations:
        err = errors_by_pod.get(v.pod or "")
        if err and v.step in ("Throttle", "Evict") and err not in v.message:
            v = v.model_copy(update={"message": f"{v.message}; {err}"[:1024]})
        violations.append(v)
    return status.model_copy(update={"violations": violations})


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
        self.overlay = Overlay()
        self.policy_memory = policy_plan.PolicyMemory()
        self.resize_errors: dict[str, tuple[str, str, str]] = {}  # uid -> (ns, pod, error)
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._first_trigger: float | None = None
        self.last_evaluation: float | None = None  # monotonic
        self.evaluations = 0
        self._policy_problems: dict[str, str] = {}  # last logged, to log changes only

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
        work = plan(snap, now, self.config.engine(), self.policy_memory)
        limiter = self.applier.limiter
        limiter.configure({n: p.spec.eviction_rate_limit for n, p in snap.valid_policies().items()})
        for group in work.groups:
            self._evaluate_group(group, work)
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
            out = evaluate(group.input)
        except Exception:
            log.exception("evaluation of namespaces %s failed; other namespaces go on", where)
            self.metrics.evaluation_error("evaluate")
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
        for upd in self.policy_memory.finish(out.statuses, group.view):
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
