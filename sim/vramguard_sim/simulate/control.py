"""vramguard in the simulation: the operator's policy code and engine deciding
on the simulated fleet, and an actions layer applying what they decide.

At every tick (the agent's sampling cadence) the pods whose inputs changed are
evaluated: their engine inputs are built as the reconcile loop builds them
(``policy.groups.namespace_policies``, ``merged_policies``, ``node_facts``,
``engine_groups``: policies, ceilings, implicit budgets for pods no budget
selects, shares) and ``engine.evaluate.evaluate`` decides. Which pods are
evaluated, and why that gives the decisions evaluating every pod would,
is ``triggers.Triggers``'s part (docs/simulation.md, "Evaluating only what
changed").

Applying (as ``controller.actions.Applier`` does, every API call succeeding):
annotation patches and CPU resizes on the pods (``apply``); an Evict goes
through the eviction rate limiter (``policy.ratelimit``, one bucket per
GPUMemoryPolicy) and the pod's PodDisruptionBudget (a refusal is retried
after the back-off); DryRun steps and Warn/Recover Events change nothing;
nothing is done in an exempt namespace. Budget statuses are kept in memory
(they are what the API server would hold), implicit budgets' in
``PolicyMemory`` as the operator keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.engine.apply import applied, output_changes
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.outputs import DevicePressureReport
from vramguard_operator.engine.types import (
    SIDE_EFFECT_DECISIONS,
    Decision,
    DryRunStep,
    EngineConfig,
    EngineOutput,
    Evict,
    Throttle,
    ViolationKey,
)
from vramguard_operator.policy.groups import (
    EngineGroup,
    engine_groups,
    merged_policies,
    namespace_policies,
    node_facts,
)
from vramguard_operator.policy.implicit import IMPLICIT_UID_PREFIX, is_implicit
from vramguard_operator.policy.inputs import PolicyMemory
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.ratelimit import EvictionLimiter
from vramguard_operator.policy.rules import RuleCache
from vramguard_sim.simulate import limits as sim_limits
from vramguard_sim.simulate.fleet import Fleet, SimPod
from vramguard_sim.simulate.inputs import node_report
from vramguard_sim.simulate.nodes import SimNode
from vramguard_sim.simulate.policyfile import PolicySet
from vramguard_sim.simulate.triggers import EPOCH, BudgetKey, Triggers
from vramguard_sim.simulate.workloads import NAMESPACES

FORGET_EVERY_S = 600.0


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """The simulated operator's settings: the engine's (``EngineConfig``), the
    eviction back-off after a PodDisruptionBudget refused (the operator's
    ``--eviction-retry``), the rate limit where no policy sets one, and the
    triggers' (``Triggers``). ``couple_devices``: evaluate the pods sharing a
    device together (for rules that compare them). ``exhaustive``: evaluate
    every pod at every tick (slow; the tests compare it with the triggers).
    ``caps``: the node agents apply memory limits (``--enforce-caps``) and the
    devices enforce them (``limits``)."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    eviction_retry_s: float = 30.0
    default_rate_limit: EvictionRateLimit = field(default_factory=EvictionRateLimit)
    refresh_s: float = 3600.0
    band_bytes: int = 64 << 20
    band_fraction: float = 0.02
    couple_devices: bool = False
    exhaustive: bool = False
    caps: bool = False


@dataclass(slots=True)
class ControlCounts:
    """What vramguard did and was kept from doing, and what it cost."""

    decisions: dict[str, int] = field(default_factory=dict)  # action -> count (side effects for real)
    dry_run_steps: int = 0
    evictions: int = 0
    evictions_blocked: int = 0  # a PodDisruptionBudget refused
    evictions_rate_limited: int = 0
    evictions_backoff: int = 0
    pressure_evictions: int = 0  # evictions for device pressure (in ``evictions`` too)
    within_limits: list[str] = field(default_factory=list)  # actions on pods within the limit they name
    evaluations: int = 0
    pods_evaluated: int = 0


class Vramguard:
    """The simulated operator for one run; ``step`` after each ``Fleet.step``."""

    def __init__(self, policy: PolicySet, fleet: Fleet, config: ControlConfig) -> None:
        self.policy = policy
        self.fleet = fleet
        self.config = config
        self.t = 0.0
        namespaces = sorted(set(NAMESPACES.values()))
        labels = {ns: {"kubernetes.io/metadata.name": ns} for ns in namespaces}
        by_name = {p.metadata.name or "": p for p in policy.policies}
        self.merged = merged_policies(list(policy.policies), labels, namespaces)
        self.namespace_policy = namespace_policies(by_name, labels, namespaces)
        self.limiter = EvictionLimiter(config.default_rate_limit, config.eviction_retry_s, clock=lambda: self.t)
        self.limiter.configure({n: p.spec.eviction_rate_limit for n, p in by_name.items()})
        self.memory = PolicyMemory()
        self.rules = RuleCache()  # as the operator keeps them between evaluations
        self.budgets = {_key(b): b for b in policy.budgets}
        self.status: dict[BudgetKey, GPUMemoryBudgetStatus | None] = dict.fromkeys(self.budgets)
        if not config.couple_devices and _compares_devices(policy):
            # the device-pressure rule compares the pods of a device: evaluate them together
            config = replace(config, couple_devices=True)
            self.config = config
        self.triggers = Triggers(self.budgets, config, fleet.tick_s)
        self.counts = ControlCounts()
        self._forget_at = 0.0
        self._facts: dict[str, NodeFacts] = {}
        self._evicts: set[tuple[str, str, str, ViolationKey]] = set()

    # --- one tick ----------------------------------------------------------------------

    def step(self, t: float) -> None:
        """Evaluate what changed at ``t`` and apply the decisions."""
        self.t = t
        fleet = self.fleet
        if fleet.removed and t >= self._forget_at:  # what gone pods left behind: unused, so dropped now and then
            live = [p.uid for p in fleet.pods.values()]
            self.memory.forget(live)
            self.rules.forget((b.metadata.uid or "" for b in self.budgets.values()), live)
            self.limiter.forget(live)
            self._forget_at = t + FORGET_EVERY_S
        if self.config.caps:
            for gone in fleet.removed:
                sim_limits.forget(gone)
        pods, budgets = self.triggers.collect(t, fleet, exhaustive=self.config.exhaustive)
        if not pods and not budgets:
            return
        now = EPOCH + timedelta(seconds=t)
        decided: set[str] = set()
        devices: list[DevicePressureReport] = []
        for group in self._groups(pods, budgets, now):
            out = evaluate(group.input)
            devices.extend(out.devices)
            self.counts.evaluations += 1
            self.counts.pods_evaluated += len(group.input.pods)
            self._apply(t, group, out)
            self._keep_statuses(t, group, out)
            decided.update(p.pod.uid for p in out.pod_patches)
            decided.update(d.pod.uid for d in out.decisions if d.pod is not None)
        self.triggers.devices_judged(devices)
        self.triggers.evaluated(t, pods, budgets, decided)

    def _groups(self, pods: Iterable[SimPod], budgets: Iterable[BudgetKey], now: datetime) -> list[EngineGroup]:
        by_node: dict[str, list[SimPod]] = {}
        pods_by_ns: dict[str, list] = {}
        gpu_by_ns: dict[str, list] = {}
        for p in sorted(pods, key=lambda p: p.uid):
            assert p.gpu is not None and p.api is not None
            by_node.setdefault(p.gpu.node.name, []).append(p)
            pods_by_ns.setdefault(p.namespace, []).append(p.facts)
            gpu_by_ns.setdefault(p.namespace, []).append(p.api)
        budgets_by_ns: dict[str, list[GPUMemoryBudget]] = {}
        for key in sorted(budgets):
            budgets_by_ns.setdefault(key[0], []).append(
                self.budgets[key].model_copy(update={"status": self.status[key]})
            )
        nodes = {name: ps[0].gpu.node for name, ps in by_node.items()}  # type: ignore[union-attr]
        trends = self.triggers.trend_features()
        reports = {
            name: node_report(node, by_node[name], now, trends, self.fleet.tick_s, self.config.caps)
            for name, node in nodes.items()
        }
        facts = {name: self._node_facts(node) for name, node in nodes.items()}
        namespaces = sorted(pods_by_ns.keys() | budgets_by_ns.keys())
        return engine_groups(
            namespaces, self.namespace_policy, budgets_by_ns, pods_by_ns, gpu_by_ns, facts, self.merged,
            reports, now, self.config.engine, self.memory.implicit_status, rules=self.rules,
        )

    def _node_facts(self, node: SimNode) -> NodeFacts:
        """What the policy code reads of a node: its labels, allocatable and every
        device (as the operator reads them from a node's full report); built
        once, since none of it changes in a run (what shares read of a device is
        its total and usable memory, not what is in use)."""
        kept = self._facts.get(node.name)
        if kept is None:
            full = node_report(node, (), EPOCH, {}, self.fleet.tick_s, self.config.caps, every_device=True)
            kept = self._facts[node.name] = node_facts({node.name: node.api()}, {node.name: full})[node.name]
        return kept

    # --- applying ------------------------------------------------------------------------

    def _apply(self, t: float, group: EngineGroup, out: EngineOutput) -> None:
        fleet = self.fleet
        exempt = group.policy.exempt_namespaces
        patches, resizes, _ = output_changes(out)
        for uid in patches.keys() | resizes.keys():
            pod = fleet.pods.get(uid)
            if pod is None or pod.namespace in exempt:  # never act there (as the Applier refuses)
                continue
            pod.set_facts(applied(pod.facts, patches.get(uid), resizes.get(uid), False))
            if self.config.caps and uid in patches:
                sim_limits.apply(pod)
            self.triggers.settle(pod, t)
        for d in out.decisions:
            self._count(d)
            if isinstance(d, Evict) and d.pod is not None and d.pod.namespace not in exempt:
                self._evict(t, d)

    def _count(self, d: Decision) -> None:
        c = self.counts
        if isinstance(d, DryRunStep):
            c.dry_run_steps += 1
            return
        if not isinstance(d, SIDE_EFFECT_DECISIONS) or d.pod is None:
            return
        if isinstance(d, Throttle) and d.reapply:
            return
        if isinstance(d, Evict):  # level-triggered: returned again while due; one action
            seen = (d.pod.uid, d.budget.namespace, d.budget.name, d.violation)
            if seen in self._evicts:
                return
            self._evicts.add(seen)
        c.decisions[d.action] = c.decisions.get(d.action, 0) + 1
        truth = self._truth(d)
        if truth is not None and truth <= d.limit_bytes:
            c.within_limits.append(
                f"t={self.t:g}s {d.action} on {d.pod.namespace}/{d.pod.name}: {d.violation.label()} "
                f"is {truth} bytes, within the limit {d.limit_bytes} it names ({d.event.message})"
            )

    def _truth(self, d: Decision) -> float | None:
        """What the simulation knows of the value the decision's violation
        measures (bytes; bytes per hour for Leak), to check it against the limit
        the decision names: the pod's VRAM or RAM, the sum over the running
        pods its budget selects, or the growth its workload really has."""
        assert d.pod is not None
        pod = self.fleet.pods.get(d.pod.uid)
        if pod is None:
            return None
        kind = d.violation.kind
        if kind in ("PodVRAM", "DeviceVRAM", "DevicePressure"):  # one device per pod: its VRAM is its use there
            return pod.held()
        if kind == "PodRAM":
            return pod.spec.ram_bytes
        if kind in LEAK_MEMORY:
            assert pod.gpu is not None
            return pod.spec.shape.growth_bytes_per_hour(pod.replica.progress_s, pod.gpu.share_bytes) * pod.speed
        members = [p for p in self.triggers.budget_pods.get((d.budget.namespace, d.budget.name), ())
                   if not p.terminating]
        if kind == "TotalVRAM":
            return sum(p.held() for p in members)
        return sum(p.spec.ram_bytes for p in members)

    def _evict(self, t: float, d: Evict) -> None:
        """Evict ``d.pod``, else (device pressure) its alternatives in rank order,
        as ``controller.evictions.Evictor.evict_first`` does."""
        for i, e in enumerate((d, *d.alternatives)):
            assert e.pod is not None
            if i and self.namespace_policy[e.pod.namespace].effective.exempt_namespaces:
                continue  # never in an exempt namespace (the engine offers none)
            if self._evict_one(t, e):
                if i:
                    self._count(e)  # a fall-back evicted: an action of its own
                if e.violation.kind == "DevicePressure":
                    self.counts.pressure_evictions += 1
                return

    def _evict_one(self, t: float, d: Evict) -> bool:
        """One eviction through the rate limiter and the PDB; True when the pod
        is gone or terminating (now or already)."""
        assert d.pod is not None
        pod = self.fleet.pods.get(d.pod.uid)
        if pod is None or pod.terminating:
            return True
        scopes = self.namespace_policy[pod.namespace].scopes
        why = self.limiter.check(pod.uid, scopes)
        if why == "backoff":
            self.counts.evictions_backoff += 1
            return False
        if why == "rate_limited":
            self.counts.evictions_rate_limited += 1
            self.triggers.settle(pod, t)  # retried at the next evaluation, as the Evict stays due
            return False
        self.limiter.taken(pod.uid, scopes)
        if not self.fleet.disruption_allowed(pod):  # HTTP 429: the token back, retry after the back-off
            self.limiter.refund(scopes)
            self.limiter.blocked(pod.uid)
            self.counts.evictions_blocked += 1
            return False
        self.fleet.evict(pod, t)
        self.counts.evictions += 1
        return True

    # --- statuses ------------------------------------------------------------------------

    def _keep_statuses(self, t: float, group: EngineGroup, out: EngineOutput) -> None:
        for upd in self.memory.finish(out.statuses, group.view):
            key = (upd.budget.namespace, upd.budget.name)
            self.status[key] = upd.status
            self.triggers.budget_status(key, upd.status, t)
        for upd in out.statuses:
            if is_implicit(upd.budget.uid):
                pod = self.fleet.pods.get(upd.budget.uid.removeprefix(IMPLICIT_UID_PREFIX))
                if pod is not None:
                    self.triggers.implicit_status(pod, upd.status, t)


def _compares_devices(policy: PolicySet) -> bool:
    """Whether a rule of ``policy`` compares the pods of a device (device pressure)."""
    return any(p.spec.device_pressure is not None for p in policy.policies) or any(
        b.spec.device_pressure is not None for b in policy.budgets
    )


def _key(budget: GPUMemoryBudget) -> BudgetKey:
    return (budget.metadata.namespace or "", budget.metadata.name or "")
