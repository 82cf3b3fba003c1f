"""Incremental evaluation: which budgets and pods to evaluate, and their engine
inputs (docs/operator.md, "Incremental evaluation").

A change marks only what it can affect (``cache.ClusterCache`` notes it): a
node report its node's pods; a pod itself and the budgets it leaves; a budget
itself and the pods it stops selecting; a policy or namespace label change
every budget and pod of the namespaces whose policy changed. Time-based steps
come from a ``timers.TimerQueue`` (a violation's next step or the end of its
tolerance, a report turning stale), and level-triggered ones (an eviction
waiting for a token or a PodDisruptionBudget, a throttle re-applied, a CPU
restore retried) are looked at again every evaluation period.

What is marked is closed over everything the engine reads together with it: a
budget brings the pods it selects, the pods holding state for it and the pods
its status names; a pod brings the budgets selecting it, the budgets it holds
state for and the pods sharing a ResourceClaim with it (whose claim budget
spans them). Such a set is a union of connected parts of the namespace
that share nothing with the rest, so the same pure engine, given only that
set, decides exactly what it decides in a pass over everything
(tests/unit/operator/test_incremental_equivalence.py runs random event
sequences both ways).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from vramguard_api import conditions as C
from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_operator.engine.types import (
    EngineConfig,
    EngineInput,
    EngineOutput,
    Evict,
    HeldBudget,
    PodFacts,
    QuietPods,
    Recover,
    Throttle,
)
from vramguard_operator.plan.cache import BudgetKey, ClusterCache
from vramguard_operator.plan.closure import closure, named_pods
from vramguard_operator.plan.coupling import Coupling
from vramguard_operator.plan.entries import BudgetEntry, Versioned
from vramguard_operator.plan.quiet import QuietAnswers
from vramguard_operator.plan.timers import TimerQueue, next_step_due, staleness_change
from vramguard_operator.policy import groups as policy_groups
from vramguard_operator.policy import inputs as policy_inputs
from vramguard_operator.policy.dra import DRAConfig
from vramguard_operator.policy.groups import NamespacePolicy, namespace_policies
from vramguard_operator.policy.implicit import IMPLICIT_UID_PREFIX, is_implicit
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.pressure import namespace_rule
from vramguard_operator.policy.rules import RuleCache

log = logging.getLogger("vramguard.reconcile")

Unit = tuple[str, ...]  # ("b", namespace, name) | ("p", pod uid) | ("n", node)


@dataclass(slots=True)
class Group:
    """Namespaces evaluated together (same effective policy), and their input."""

    policy: NamespacePolicy
    namespaces: list[str]
    input: EngineInput
    view: policy_inputs.PolicyView
    budget_keys: set[BudgetKey] = field(default_factory=set)
    pod_uids: set[str] = field(default_factory=set)
    far_nodes: set[str] = field(default_factory=set)  # judged with some of their pods only


@dataclass(slots=True)
class Plan:
    """One evaluation's work: engine groups, and budgets whose spec does not
    parse (each is held alone: nothing is decided for it, its records are
    kept, and the rest of its namespace is evaluated as if it were absent)."""

    groups: list[Group]
    invalid: list[Versioned[BudgetEntry]]

    def __bool__(self) -> bool:
        return bool(self.groups or self.invalid)


class Incremental:
    """The marked budgets and pods, their timers, and how to evaluate them.

    ``period``: seconds between looks at level-triggered units. ``owned(ns)``:
    whether this replica decides in a namespace (shards); others are never
    planned. ``dra``: how ResourceSlices name a GPU's UUID and memory."""

    def __init__(
        self,
        cache: ClusterCache,
        config: EngineConfig,
        period: float,
        owned: Callable[[str], bool] = lambda ns: True,
        dra: DRAConfig | None = None,
    ) -> None:
        self.cache = cache
        self.dra = dra or DRAConfig()
        self.config = config
        self.period = timedelta(seconds=period)
        self.owned = owned
        self.rules = RuleCache()
        self.memory = policy_inputs.PolicyMemory()
        self.timers = TimerQueue()
        self.quiet = QuietAnswers(cache, config, self._effective, self.merged_of, lambda ns: self.policy_of(ns).effective)
        self.coupling = Coupling(cache, config.freshness_seconds)
        self.level: set[Unit] = set()
        self.again: set[Unit] = set()  # evaluated at the next pass
        self._level_at: datetime | None = None
        self._budgets: set[BudgetKey] = set()
        self._pods: set[str] = set()
        self._policies: dict[str, NamespacePolicy] = {}
        self._merged: dict[str, MergedPolicy] = {}
        self._rules: dict[str, bool] = {}  # namespaces with a device-pressure rule
        self._nodes: dict[str, tuple[Any, Any, NodeFacts]] = {}
        self.policies_changed = False

    # -- marking

    def mark_all(self) -> None:
        """Evaluate everything (start-up, a shard gained, a resync)."""
        self._budgets |= set(self.cache.budgets)
        self._pods |= set(self.cache.pods)

    def mark_namespaces(self, namespaces: Iterable[str]) -> None:
        """Evaluate every budget and pod of these namespaces."""
        for ns in namespaces:
            self._budgets |= {(ns, n) for n in self.cache.budgets_in_ns.get(ns, ())}
            self._pods |= self.cache.pods_in_ns.get(ns, set())

    def _take(self, now: datetime) -> None:
        dirt = self.cache.take_dirt()
        self._budgets |= dirt.budgets
        self._pods |= dirt.pods
        for uid in dirt.gone:
            self.quiet.totals.drop_pod(uid)
        self.coupling.forget(dirt.gone, dirt.nodes)
        if dirt.policies:
            self._refresh_policies()
        for node in dirt.nodes:
            self._nodes.pop(node, None)
            self._arm_node(node, now)
        due = self.timers.pop_due(now) + list(self.again)
        self.again.clear()
        if self._level_at is None or now >= self._level_at:
            due.extend(self.level)
            self.level.clear()
            self._level_at = now + self.period
        for unit in due:
            self._mark_unit(unit, now)

    def _mark_unit(self, unit: Hashable, now: datetime) -> None:
        assert isinstance(unit, tuple), unit
        if unit[0] == "b":
            self._budgets.add((unit[1], unit[2]))
        elif unit[0] == "p":
            self._pods.add(unit[1])
        elif unit[0] == "n":
            self._pods |= self.cache.pods_on_node.get(unit[1], set())
            self._arm_node(unit[1], now)

    def _arm_node(self, node: str, now: datetime) -> None:
        rep = self.cache.report(node)
        sample = rep.status.sample_time if rep is not None and rep.status is not None else None
        self.timers.arm(("n", node), staleness_change(sample, self.config.freshness_seconds, now))

    def pending(self) -> bool:
        """Whether something is marked (or the cache holds unread changes)."""
        return bool(self._budgets or self._pods or self.again or self.cache.dirt)

    def next_time(self) -> datetime | None:
        """When the next timer or level-triggered look is due."""
        times = [t for t in (self.timers.next_time(), self._level_at if self.level else None) if t is not None]
        return min(times, default=None)

    # -- policies

    def _refresh_policies(self) -> None:
        """Policies or namespace labels changed: every namespace whose policy
        changed is evaluated again."""
        self.policies_changed = True
        spaces = self.cache.known_namespaces()
        old_p, old_m = self._policies, self._merged
        self._policies, self._merged, self._rules = {}, {}, {}
        changed = {ns for ns in spaces if old_p.get(ns) != self.policy_of(ns) or old_m.get(ns) != self.merged_of(ns)}
        self.mark_namespaces(changed)

    def policy_of(self, ns: str) -> NamespacePolicy:
        """The namespace's effective policy and eviction scopes."""
        pol = self._policies.get(ns)
        if pol is None:
            c = self.cache
            pol = namespace_policies(c.valid_policies(), c.namespaces, [ns], c.invalid_policies())[ns]
            self._policies[ns] = pol
        return pol

    def merged_of(self, ns: str) -> MergedPolicy:
        """The namespace's merged policy (defaults and ceilings)."""
        merged = self._merged.get(ns)
        if merged is None:
            c = self.cache
            merged = policy_groups.merged_policies(
                list(c.valid_policies().values()), c.namespaces, [ns], c.invalid_policies()
            )[ns]
            self._merged[ns] = merged
        return merged

    # -- planning

    def plan(self, now: datetime) -> Plan:
        """The groups to evaluate now (everything marked, closed), and the
        budgets whose spec does not parse in the namespaces planned (each is
        held alone: ``EngineInput.held``); the marks are cleared."""
        self.coupling.settle()
        self._take(now)
        budgets, pods = self._budgets, self._pods
        self._budgets, self._pods = set(), set()
        self.quiet.refresh(budgets, pods, now)
        self.coupling.forget(pods | self.quiet.changed)
        marked_pods = {u for u in pods if (e := self.cache.pods.get(u)) and self.owned(e.namespace)}
        keys, uids, coupled = closure(self.cache, self.quiet.totals, self._ns_rule,
                                      {k for k in budgets if self.owned(k[0])}, marked_pods, self.coupling.is_far)
        self.coupling.begin(coupled, now)
        parts: dict[str, tuple[set[BudgetKey], set[str]]] = {}
        for key in keys:
            parts.setdefault(key[0], (set(), set()))[0].add(key)
        for uid in uids:
            parts.setdefault(self.cache.pods[uid].namespace, (set(), set()))[1].add(uid)
        invalid: list[Versioned[BudgetEntry]] = []
        by_policy: dict[Any, list[tuple[str, set[BudgetKey], set[str]]]] = {}
        for ns in sorted(parts):
            if not self.owned(ns):
                continue
            invalid.extend(self.cache.budgets[(ns, n)] for n in sorted(self.cache.budgets_in_ns.get(ns, ()))
                           if self.cache.budgets[(ns, n)].value.budget is None)
            by_policy.setdefault(self.policy_of(ns).effective, []).append((ns, *parts[ns]))
        groups = [self._group(group_parts, now, invalid) for group_parts in by_policy.values()]
        for g in groups:
            nodes = {p.node_name for p in g.input.pods if p.node_name}
            g.far_nodes = {n for n in nodes - coupled if self.coupling.is_far(n)}
            self.coupling.expect(nodes)
        return Plan(groups, invalid)

    def retry(self, group: Group, now: datetime) -> None:
        """A group that could not be evaluated (it raised, or ran out of time
        outside any budget): looked at again at the next evaluation period."""
        self.coupling.failed({p.node_name for p in group.input.pods if p.node_name})
        self.retry_units({("b", ns, name) for ns, name in group.budget_keys} | {("p", u) for u in group.pod_uids}, now)

    def retry_units(self, units: set[Unit], now: datetime) -> None:
        """Look at these again at the next evaluation period (a pod whose
        annotations could not be written: each evaluation period tries again,
        as a pass over everything would, never in a loop of its own)."""
        self.level |= units
        if self._level_at is None:
            self._level_at = now + self.period

    def _ns_rule(self, ns: str) -> bool:
        rule = self._rules.get(ns)
        if rule is None:
            rule = self._rules[ns] = namespace_rule(self.merged_of(ns)) is not None
        return rule

    def _group(self, parts: list[tuple[str, set[BudgetKey], set[str]]], now: datetime,
               invalid: list[Versioned[BudgetEntry]]) -> Group:
        c = self.cache
        keys = {k for _, ks, _ in parts for k in ks if c.budgets[k].value.budget is not None}
        uids = {u for _, _, us in parts for u in us}
        namespaces = [ns for ns, _, _ in parts]
        budgets = [self._with_status(k) for k in sorted(keys)]
        entries = [c.pods[u] for u in sorted(uids)]
        facts: list[PodFacts] = [e.facts for e in entries]
        gpu_pods = [e.gpu for e in entries if e.gpu is not None]
        node_names = {f.node_name for f in facts if f.node_name}
        nodes = {n: nf for n in node_names if (nf := self._node_facts(n)) is not None}
        merged = {ns: self.merged_of(ns) for ns in namespaces}
        allocations = policy_inputs.Allocations(c.claims, list(c.slices.values()), c.kai_reservations(), self.dra)
        view = policy_inputs.prepare(budgets, facts, gpu_pods, nodes, merged, self.memory.implicit_status,
                                   allocations, self.rules)
        reports = {n: r for n in node_names if (r := c.report(n)) is not None}
        policy = self.policy_of(namespaces[0])
        quiet = {c.budgets[k].uid: q for k in keys
                 if (q := self.quiet.totals.summary(k, uids & c.selects.get(k, set()))) != QuietPods()}
        spaces = set(namespaces)
        held = {(e.value.namespace, e.value.name): HeldBudget(e.uid, C.REASON_INVALID_SPEC,
                                                              e.value.error or "invalid spec")
                for e in invalid if e.value.namespace in spaces}
        unknown = {n: why for n, why in c.unknown_nodes().items() if n in node_names}
        inp = EngineInput(view.budgets, view.pods, reports, now, policy.effective, self.config,
                          device_limits=view.device_limits, pressure_rules=view.pressure_rules,
                          device_shares=view.device_shares, held=held, unknown_nodes=unknown, quiet=quiet)
        return Group(policy, namespaces, inp, view, keys, uids)

    def _with_status(self, key: BudgetKey) -> GPUMemoryBudget:
        budget = self.cache.budgets[key].value.budget
        assert budget is not None
        status = self.cache.status_of(key)
        return budget if budget.status is status else budget.model_copy(update={"status": status})

    def _node_facts(self, node: str) -> NodeFacts | None:
        body = self.cache.nodes.get(node)
        if body is None:
            return None
        rep = self.cache.reports.get(node)
        kept = self._nodes.get(node)
        if kept is not None and kept[0] is body and kept[1] is rep:
            return kept[2]
        nf = NodeFacts.from_api(body, self.cache.report(node))
        self._nodes[node] = (body, rep, nf)
        return nf

    def _effective(self, key: BudgetKey) -> GPUMemoryBudget | None:
        """The budget as the engine evaluates it (ceilings, its status); None
        when it does not parse (its pods are then all active)."""
        if self.cache.budgets[key].value.budget is None:
            return None
        budget = self._with_status(key)
        try:
            return self.rules.effective(budget, self.merged_of(key[0]))[0]
        except ValueError:
            return budget

    # -- after an evaluation

    def evaluated(self, group: Group, out: EngineOutput, now: datetime) -> None:
        """Arm the timers of what was evaluated, and note what to look at again.

        An evaluation that decided something may not be the engine's last word
        on it: a step fires at most once per violation and evaluation (the
        next one may already be due), and a violation that closed may leave a
        warning for the next evaluation to raise. So a budget or pod with
        decisions is evaluated again at the next pass, until it has none; the
        level-triggered ones (an eviction, a throttle re-applied, a CPU
        restore) every evaluation period instead."""
        self.coupling.judged(out.devices, {p.node_name for p in group.input.pods if p.node_name})
        budgets = {(b.metadata.namespace or "", b.metadata.name or "", b.metadata.uid or ""): b
                   for b in group.input.budgets}
        for upd in out.statuses:
            ref = upd.budget
            unit = _unit(ref.namespace, ref.name, ref.uid, None)
            budget = budgets.get((ref.namespace, ref.name, ref.uid))
            if budget is not None:
                self.timers.arm(unit, next_step_due(budget, upd.status, now))
                if _projects_eviction(budget, upd.status):
                    self.level.add(unit)
            key = (ref.namespace, ref.name)
            if key in self.cache.budgets and not is_implicit(ref.uid):  # pods named or no longer: answer again
                changed = named_pods(self.cache.status_of(key)) ^ named_pods(upd.status)
                self.quiet.again(key, {u for n in changed if (u := self.cache.pod_names.get((ref.namespace, n)))})
        for d in out.decisions:
            level = isinstance(d, Evict) or (isinstance(d, Throttle) and d.reapply)
            level = level or (isinstance(d, Recover) and bool(d.restore))
            units = {_unit(d.budget.namespace, d.budget.name, d.budget.uid, d.pod.uid if d.pod else None)}
            if d.pod is not None:
                units.add(("p", d.pod.uid))
            (self.level if level else self.again).update(units)
        if self.level and self._level_at is None:
            self._level_at = now + self.period

    def forget(self, live_pods: Iterable[str]) -> None:
        """Drop what is kept for pods and budgets that are gone."""
        live = set(live_pods)
        self.memory.forget(live)
        self.rules.forget({v.uid for v in self.cache.budgets.values()}, live)
        gone = [u for u in self.level if u[0] == "p" and u[1] not in live]
        self.level.difference_update(gone)
        self.timers.forget(gone)


def _unit(ns: str, name: str, uid: str, pod_uid: str | None) -> Unit:
    """The unit a budget's decision belongs to: the budget, or the pod for an
    implicit budget and for a restore that no budget holds."""
    if is_implicit(uid):
        return ("p", uid.removeprefix(IMPLICIT_UID_PREFIX))
    if not name and pod_uid:
        return ("p", pod_uid)
    return ("b", ns, name)


def _projects_eviction(budget: GPUMemoryBudget, status: GPUMemoryBudgetStatus) -> bool:
    """A Leak violation whose Evict is due by projected exhaustion
    (``leakDetection.evictBefore``): its next step time moves with the clock,
    so it is looked at every evaluation period, as a pass over everything would."""
    ld = budget.spec.leak_detection
    if ld is None or not ld.enabled or getattr(ld, "evict_before", None) is None:
        return False
    return any(v.kind in LEAK_MEMORY and v.opened_at is not None for v in status.violations or ())
