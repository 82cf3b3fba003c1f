"""The pure policy engine: ``evaluate(EngineInput) -> EngineOutput``.

Budgets, the effective policy, node reports, pod facts (with the escalation
state in their annotations) and ``now`` go in; typed decisions, pod annotation
patches and desired budget statuses come out. No clock, no I/O. The semantics
(tolerance, ladder, recovery, staleness, unknown data, warnings, leaks, DryRun)
are described in docs/engine.md; the types in ``engine.types``.

This module is the driver: it reads the node reports and the pods' state
(``pod_state``), closes the records whose budget is gone, evaluates the
budgets one by one (``budget.evaluate_budget``, in namespace/name order),
handing each the state merged from the results before it
(``work.PassState``). The device-pressure rule
(``pressure_out.evaluate_pressure``) runs after the budgets, on the facts
they leave (which budgets select which pods, their limits, the pods they
evict), and adds its decisions and status entries. Then the driver restores
the CPU of pods no violation holds, settles each pod's memory limits
(``caps``) and writes the pod patches. A budget whose evaluation raises is
held (``HeldBudget``): its partial work is dropped, which leaves the state
handed to the next budget as if it were absent, and the memory limits of the
pods it holds are kept as they are. While a budget is held the pods it may
select are not known, so the device-pressure rule takes the share of every
pod in its namespace as unknown: never chosen, never protected.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from vramguard_api import conditions as C
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.memlimits import DeviceMemoryLimit
from vramguard_operator.engine import caps, messages
from vramguard_operator.engine.budget import InvalidSpec, evaluate_budget
from vramguard_operator.engine.inputs import EngineInput, HeldBudget, PodFacts
from vramguard_operator.engine.keys import (
    ANNOTATION_MEMORY_LIMITS,
    EVENT_RECOVERED,
    EVENT_REPORT_INVALID,
    BudgetRef,
    ViolationKey,
)
from vramguard_operator.engine.ladder import Ladder
from vramguard_operator.engine.measure import Node, PodData, read_nodes
from vramguard_operator.engine.outputs import (
    BudgetStatusUpdate,
    Decision,
    EngineOutput,
    EventSpec,
    ObjectProblem,
    PodMemoryLimits,
    PodPatch,
    Recover,
)
from vramguard_operator.engine.pod_state import PatchFacts, PodStates, pod_patches, read_pod_states
from vramguard_operator.engine.pressure_out import PressureResult, evaluate_pressure, with_entries
from vramguard_operator.engine.records import ViolationRecord, event_key, throttled, whole_seconds
from vramguard_operator.engine.status import invalid_status
from vramguard_operator.engine.throttle import Original, restore_unthrottled
from vramguard_operator.engine.work import BudgetResult, PassState, Selection

Progress = Callable[[str], None]
"""Told the stage an evaluation enters: ``records``, ``budget <ns>/<name>`` per
budget, ``pressure``, ``restore``, ``limits``, ``patches`` (a caller that bounds an evaluation's time
learns which budget ran over)."""


def evaluate(inp: EngineInput, progress: Progress | None = None) -> EngineOutput:
    """Evaluate every budget against the measured usage of its pods.

    Returns the decisions, the pod annotation patches and the desired budget
    statuses (see ``engine.types``). Raises ``ValueError`` when ``inp.now`` is
    naive. Nothing in the objects makes it raise: a budget that cannot be
    evaluated (an invalid spec, a bug it hits) is held (``HeldBudget``:
    Ready=False, state kept, an ``ObjectProblem``) and the others are
    evaluated as if it were absent; node reports that contradict themselves
    and pod state that is malformed or not sealed are not believed.
    ``progress`` is told each stage as it starts."""
    now = whole_seconds(inp.now)
    tell = progress or (lambda _stage: None)
    tell("records")
    nodes = read_nodes(inp.reports, now, inp.config.freshness_seconds, inp.unknown_nodes)
    per_ns = Counter([*(b.metadata.namespace or "" for b in inp.budgets), *(ns for ns, _ in inp.held)])
    states = read_pod_states(sorted(inp.pods, key=lambda p: (p.namespace, p.name)), inp.config.state_key, per_ns)
    pods_by_ns: dict[str, list[PodFacts]] = defaultdict(list)
    for pod in states.pods:
        pods_by_ns[pod.namespace].append(pod)
    run = _Pass(PassState(now, inp.config, {p.uid: p for p in states.pods}, nodes=nodes), states)
    run.report_nodes(nodes)
    budgets = sorted(inp.budgets, key=lambda b: (b.metadata.namespace or "", b.metadata.name or ""))
    live = {(b.metadata.namespace or "", b.metadata.name or ""): b.metadata.uid or "" for b in budgets}
    run.recover_orphans({**{k: h.uid for k, h in inp.held.items()}, **live})
    run.report_held({k: h for k, h in inp.held.items() if k not in live})
    for budget in budgets:
        ns = budget.metadata.namespace or ""
        tell(f"budget {ns}/{budget.metadata.name or ''}")
        outcome = _evaluate_or_hold(inp, budget, pods_by_ns.get(ns, []), nodes, run)
        if isinstance(outcome, HeldBudget):
            run.hold(budget, outcome)
        else:
            run.merge(outcome)
    tell("pressure")
    pressure = evaluate_pressure(inp, nodes, run.selections, run.evicting, now, frozenset(run.held_namespaces))
    run.add_pressure(pressure, {(b.metadata.namespace or "", b.metadata.name or ""): b for b in budgets})
    tell("restore")
    run.restore()
    tell("limits")
    run.settle_memory_limits()
    tell("patches")
    return EngineOutput(
        decisions=tuple(run.decisions),
        pod_patches=tuple(run.pod_patches()),
        statuses=tuple(run.statuses),
        evaluated_pairs=run.pairs,
        memory_limits=tuple(run.memory_limits),
        problems=tuple(run.problems),
        devices=tuple(pressure.devices),
        object_problems=tuple(run.object_problems),
    )


def _evaluate_or_hold(
    inp: EngineInput, budget: GPUMemoryBudget, ns_pods: list[PodFacts], nodes: Mapping[str, Node], run: _Pass
) -> BudgetResult | HeldBudget:
    """One budget's result, or why it is held: given as held, an invalid spec,
    or an error its evaluation raised (a bug hit by its objects holds it alone)."""
    meta = budget.metadata
    held = inp.held.get((meta.namespace or "", meta.name or ""))
    if held is not None:
        return held
    ns, uid = meta.namespace or "", meta.uid or ""
    acting = inp.policy.mode == "Enforce" and budget.spec.enforcement.mode == "Enforce"
    exempt = ns in inp.policy.exempt_namespaces
    named, soft, quiet = inp.device_limits.get(uid, {}), inp.policy.soft_limits, inp.quiet.get(uid)
    try:
        return evaluate_budget(
            budget, ns_pods, nodes, acting and not exempt, acting, run.state(), named, soft, quiet
        )
    except InvalidSpec as err:
        return HeldBudget(uid, C.REASON_INVALID_SPEC, str(err))
    except Exception as err:  # isolation: the budget is held, everything else goes on
        return HeldBudget(uid, C.REASON_EVALUATION_FAILED, messages.evaluation_failed(err))


@dataclass(slots=True)
class _Pass:
    """The state of one evaluation, merged from the budgets' results as they come.

    Owned by ``evaluate`` alone: each budget sees it as a read-only
    ``PassState`` and returns what it decided."""

    base: PassState
    states: PodStates
    pod_records: dict[str, Mapping[ViolationKey, ViolationRecord]] = field(default_factory=dict)
    pod_data: dict[str, PodData] = field(default_factory=dict)
    evicting: set[str] = field(default_factory=set)
    resized: dict[str, PodFacts] = field(default_factory=dict)
    new_original: dict[str, Original] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)
    throttle_targets: dict[str, set[str]] = field(default_factory=dict)
    ladders: dict[tuple[str, str], Ladder] = field(default_factory=dict)
    explained: set[tuple[str, ViolationKey]] = field(default_factory=set)
    limits_wants: dict[str, caps.LimitsWant] = field(default_factory=dict)
    new_limits: dict[str, str | None] = field(default_factory=dict)
    memory_limits: list[PodMemoryLimits] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    statuses: list[BudgetStatusUpdate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    object_problems: list[ObjectProblem] = field(default_factory=list)
    selections: list[Selection] = field(default_factory=list)
    held_namespaces: set[str] = field(default_factory=set)
    pairs: int = 0

    def __post_init__(self) -> None:
        self.pod_records.update(self.states.records)
        self.dirty |= self.states.dirty
        self.problems.extend(self.states.problems)
        self.object_problems.extend(self.states.object_problems)

    def state(self) -> PassState:
        """What the next budget sees."""
        b = self.base
        return PassState(
            b.now,
            b.config,
            b.pods_by_uid,
            self.pod_records,
            self.pod_data,
            self.evicting,
            self.resized,
            self.new_original,
            b.nodes,
        )

    def report_nodes(self, nodes: Mapping[str, Node]) -> None:
        """Report the nodes whose report is not believed (on the report object)."""
        for name, node in sorted(nodes.items()):
            if node.state != "Invalid":
                continue
            meta = node.report.metadata if node.report is not None else None
            text = messages.report_invalid(name, node.reason or "")
            self.problems.append(text)
            self.object_problems.append(
                ObjectProblem(
                    "NodeGPUUsage", "", (meta.name if meta else None) or name,
                    (meta.uid if meta else None) or "", EVENT_REPORT_INVALID, text,
                )
            )

    def report_held(self, held: Mapping[tuple[str, str], HeldBudget]) -> None:
        """Report the held budgets that are not given (their spec does not parse;
        the controller writes their status): their records and the memory
        limits of their pods are kept."""
        for (ns, name), h in sorted(held.items()):
            self.object_problems.append(ObjectProblem("GPUMemoryBudget", ns, name, h.uid, h.reason, h.message))
            self._hold_limits(ns, name)
            self.held_namespaces.add(ns)

    def _hold_limits(self, namespace: str, name: str) -> None:
        """Keep as they are the memory limits of the pods a held budget's records are on."""
        for uid, recs in self.pod_records.items():
            if any(k.namespace == namespace and k.budget == name for k in recs):
                old = self.limits_wants.get(uid)
                self.limits_wants[uid] = caps.HOLD if old is None else old.merged(caps.HOLD)

    def hold(self, budget: GPUMemoryBudget, held: HeldBudget) -> None:
        """A budget that is not evaluated: Ready=False with the reason, its records kept."""
        meta = budget.metadata
        ref = BudgetRef(meta.namespace or "", meta.name or "", meta.uid or "")
        self.statuses.append(BudgetStatusUpdate(ref, invalid_status(budget, held.message, self.base.now, held.reason)))
        self.problems.append(f"GPUMemoryBudget {ref.namespace}/{ref.name}: {held.reason}: {held.message}")
        self.object_problems.append(
            ObjectProblem("GPUMemoryBudget", ref.namespace, ref.name, ref.uid, held.reason, held.message)
        )
        self._hold_limits(ref.namespace, ref.name)
        self.held_namespaces.add(ref.namespace)

    def recover_orphans(self, live: Mapping[tuple[str, str], str]) -> None:
        """Close pod records whose budget is gone (deleted, or recreated with
        another uid: ``live`` maps (namespace, name) to the budgets' uids)."""
        now, default_cpu = self.base.now, self.base.config.default_throttle_cpu
        for uid, recs in self.pod_records.items():
            pod = self.base.pods_by_uid[uid]
            for key, rec in recs.items():
                current = live.get((key.namespace, key.budget))
                if current is not None and (not rec.budget_uid or not current or rec.budget_uid == current):
                    continue
                self.pod_records[uid] = {k: r for k, r in self.pod_records[uid].items() if k != key}
                self.dirty.add(uid)
                if throttled(rec):
                    # the budget's ladder is gone with it: assume the default target
                    self.throttle_targets.setdefault(uid, set()).add(default_cpu)
                text = messages.budget_gone_text(key, pod.name)
                ekey = event_key(rec.budget_uid, key, rec.opened_at, "Recovered")
                self.decisions.append(
                    Recover(
                        budget=BudgetRef(key.namespace, key.budget, rec.budget_uid),
                        violation=key,
                        pod=pod.ref,
                        time=now,
                        observed_bytes=rec.observed_bytes or 0,
                        limit_bytes=rec.limit_bytes or 0,
                        event=EventSpec("Normal", EVENT_RECOVERED, text, ekey),
                        cause="BudgetDeleted",
                    )
                )

    def merge(self, result: BudgetResult) -> None:
        """Add one budget's result."""
        self.decisions.extend(result.decisions)
        self.pod_records.update(result.pod_records)
        self.dirty |= result.dirty
        self.pod_data.update(result.pod_data)
        self.evicting |= result.evicting
        self.resized.update(result.resized)
        self.new_original.update(result.new_original)
        for uid, targets in result.throttle_targets.items():
            self.throttle_targets.setdefault(uid, set()).update(targets)
        if result.ladder is not None:
            self.ladders[(result.ref.namespace, result.ref.name)] = result.ladder
        self.explained |= result.explained
        self.statuses.append(BudgetStatusUpdate(result.ref, result.status, result.unwritten, result.step_pods))
        self.pairs += result.pairs
        if result.selection is not None:
            self.selections.append(result.selection)
        for uid, want in result.limits.items():
            old = self.limits_wants.get(uid)
            self.limits_wants[uid] = want if old is None else old.merged(want)

    def add_pressure(self, result: PressureResult, budgets: Mapping[tuple[str, str], GPUMemoryBudget]) -> None:
        """Add the device-pressure rule's decisions (after the budgets') and its
        entries to the statuses of the budgets they concern."""
        self.decisions.extend(result.decisions)
        if not result.entries:
            return
        b = self.base
        for i, upd in enumerate(self.statuses):
            entries = result.entries.get((upd.budget.namespace, upd.budget.name))
            if entries:
                budget = budgets[(upd.budget.namespace, upd.budget.name)]
                status = with_entries(upd.status, entries, budget, b.now, b.config.max_status_entries)
                unwritten = upd.unwritten
                if unwritten is not None:
                    unwritten = with_entries(unwritten, entries, budget, b.now, b.config.max_status_entries)
                self.statuses[i] = replace(upd, status=status, unwritten=unwritten)

    def settle_memory_limits(self) -> None:
        """Each pod's ``vramguard.io/memory-limits`` as the budgets want it
        (``engine.caps``): kept as it is for a pod that is not running or whose
        data cannot tell, else rewritten where it changes."""
        b = self.base
        for uid, pod in b.pods_by_uid.items():
            want = self.limits_wants.get(uid)
            text = pod.annotations.get(ANNOTATION_MEMORY_LIMITS)
            if want is None and text is None:
                continue
            current, problem = caps.current_limits(pod)
            node = b.nodes.get(pod.node_name or "")
            if problem is not None:
                self.problems.append(problem)
            if (want is not None and want.hold) or pod.terminating or pod.phase != "Running":
                self._note_limits(pod, current, node)
                continue
            desired = caps.desired_limits(current, want or caps.LimitsWant(), self.pod_data.get(uid), node)
            try:
                new = caps.annotation(desired)
            except ValueError as err:  # a bound broken: keep what the pod has, say why
                self.problems.append(f"pod {pod.namespace}/{pod.name}: {err}")
                continue
            if new != text:
                self.new_limits[uid] = new
                self.dirty.add(uid)
            self._note_limits(pod, desired, node)

    def _note_limits(self, pod: PodFacts, limits: Mapping[str, DeviceMemoryLimit], node: Node | None) -> None:
        if limits:
            self.memory_limits.append(PodMemoryLimits(pod.ref, dict(limits), caps.not_held(limits, pod, node)))

    def restore(self) -> None:
        """Put back the CPU of pods that no violation holds (``throttle.restore_unthrottled``)."""
        b = self.base
        r = restore_unthrottled(
            b.pods_by_uid, self.pod_records, self.new_original, self.throttle_targets, self.decisions, b.now
        )
        self.decisions = list(r.decisions)
        for uid in r.cleared:
            self.dirty.add(uid)
            self.new_original[uid] = {}
        self.problems.extend(r.problems)

    def pod_patches(self) -> Iterable[PodPatch]:
        """The annotation changes of every pod whose state changed (``pod_state``)."""

        def ladder_of(key: ViolationKey) -> Ladder | None:
            return self.ladders.get((key.namespace, key.budget))

        b = self.base
        facts = PatchFacts(
            b.pods_by_uid, self.states.raw, self.pod_records, self.dirty, self.new_original,
            self.explained, ladder_of, b.config.state_key, self.new_limits,
        )
        return pod_patches(facts)


__all__ = ["evaluate"]
