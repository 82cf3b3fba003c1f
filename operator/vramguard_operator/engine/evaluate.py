"""The pure policy engine: ``evaluate(EngineInput) -> EngineOutput``.

Budgets, the effective policy, node reports, pod facts (with the escalation
state in their annotations) and ``now`` go in; typed decisions, pod annotation
patches and desired budget statuses come out. No clock, no I/O. The semantics
(tolerance, ladder, recovery, staleness, unknown data, warnings, leaks, DryRun)
are described in docs/engine.md; the types in ``engine.types``.

This module is the driver: it reads the pods' records, closes those whose
budget is gone, evaluates the budgets one by one (``budget.evaluate_budget``,
in namespace/name order), handing each the state merged from the results
before it (``work.PassState``), then restores the CPU of pods no violation
holds and writes the pod patches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vramguard_operator.engine import messages
from vramguard_operator.engine.budget import evaluate_budget
from vramguard_operator.engine.inputs import EngineInput, PodFacts
from vramguard_operator.engine.keys import (
    ANNOTATION_MESSAGE,
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_VIOLATIONS,
    EVENT_RECOVERED,
    BudgetRef,
    ViolationKey,
)
from vramguard_operator.engine.ladder import Ladder
from vramguard_operator.engine.measure import PodData, read_nodes
from vramguard_operator.engine.outputs import (
    BudgetStatusUpdate,
    Decision,
    EngineOutput,
    EventSpec,
    PodPatch,
    Recover,
)
from vramguard_operator.engine.records import (
    ViolationRecord,
    records_from_annotation,
    records_to_annotation,
    throttled,
    whole_seconds,
)
from vramguard_operator.engine.throttle import Original, original_to_annotation, restore_unthrottled
from vramguard_operator.engine.work import BudgetResult, PassState


def evaluate(inp: EngineInput) -> EngineOutput:
    """Evaluate every budget against the measured usage of its pods.

    Returns the decisions, the pod annotation patches and the desired budget
    statuses (see ``engine.types``). Raises ``ValueError`` when ``inp.now`` is
    naive. Invalid budget specs do not raise: their status says Ready=False.
    """
    now = whole_seconds(inp.now)
    nodes = read_nodes(inp.reports, now, inp.config.freshness_seconds)
    pods = sorted(inp.pods, key=lambda p: (p.namespace, p.name))
    pods_by_ns: dict[str, list[PodFacts]] = defaultdict(list)
    for pod in pods:
        pods_by_ns[pod.namespace].append(pod)
    run = _Pass(PassState(now, inp.config, {p.uid: p for p in pods}))
    run.read_pod_records(pods)
    budgets = sorted(inp.budgets, key=lambda b: (b.metadata.namespace or "", b.metadata.name or ""))
    run.recover_orphans({(b.metadata.namespace or "", b.metadata.name or ""): b.metadata.uid or "" for b in budgets})
    for budget in budgets:
        ns = budget.metadata.namespace or ""
        acting = inp.policy.mode == "Enforce" and budget.spec.enforcement.mode == "Enforce"
        exempt = ns in inp.policy.exempt_namespaces
        named = inp.device_limits.get(budget.metadata.uid or "", {})
        ns_pods = pods_by_ns.get(ns, [])
        quiet = inp.quiet.get(budget.metadata.uid or "")
        run.merge(evaluate_budget(budget, ns_pods, nodes, acting and not exempt, acting, run.state(), named, quiet))
    run.restore()
    return EngineOutput(
        decisions=tuple(run.decisions),
        pod_patches=tuple(run.pod_patches()),
        statuses=tuple(run.statuses),
        evaluated_pairs=run.pairs,
        problems=tuple(run.problems),
    )


@dataclass(slots=True)
class _Pass:
    """The state of one evaluation, merged from the budgets' results as they come.

    Owned by ``evaluate`` alone: each budget sees it as a read-only
    ``PassState`` and returns what it decided."""

    base: PassState
    pod_records: dict[str, Mapping[ViolationKey, ViolationRecord]] = field(default_factory=dict)
    pod_data: dict[str, PodData] = field(default_factory=dict)
    evicting: set[str] = field(default_factory=set)
    resized: dict[str, PodFacts] = field(default_factory=dict)
    new_original: dict[str, Original] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)
    throttle_targets: dict[str, set[str]] = field(default_factory=dict)
    ladders: dict[tuple[str, str], Ladder] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    statuses: list[BudgetStatusUpdate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pairs: int = 0

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
        )

    def read_pod_records(self, pods: Iterable[PodFacts]) -> None:
        """The records in the pods' ``vramguard.io/violations`` annotations; a pod
        with malformed entries is rewritten without them."""
        for pod in pods:
            text = pod.annotations.get(ANNOTATION_VIOLATIONS)
            if not text:
                continue
            records, problems = records_from_annotation(text, pod.namespace, pod.name)
            self.pod_records[pod.uid] = {r.key: r for r in records}
            if problems:
                self.problems.extend(problems)
                self.dirty.add(pod.uid)

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
                self.decisions.append(
                    Recover(
                        budget=BudgetRef(key.namespace, key.budget, rec.budget_uid),
                        violation=key,
                        pod=pod.ref,
                        time=now,
                        observed_bytes=rec.observed_bytes or 0,
                        limit_bytes=rec.limit_bytes or 0,
                        event=EventSpec("Normal", EVENT_RECOVERED, messages.budget_gone_text(key, pod.name)),
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
        self.statuses.append(BudgetStatusUpdate(result.ref, result.status))
        self.pairs += result.pairs

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
        """The annotation changes of every pod whose state changed."""
        pods = self.base.pods_by_uid

        def ladder_of(key: ViolationKey) -> Ladder | None:
            return self.ladders.get((key.namespace, key.budget))

        for uid in sorted(self.dirty, key=lambda u: (pods[u].namespace, pods[u].name, u)):
            pod = pods[uid]
            recs = self.pod_records.get(uid, {})
            want: dict[str, str | None] = {
                ANNOTATION_VIOLATIONS: records_to_annotation(recs.values()) if recs else None,
                ANNOTATION_MESSAGE: messages.pod_message(recs.values(), ladder_of) if recs else None,
            }
            if uid in self.new_original:
                orig = self.new_original[uid]
                want[ANNOTATION_ORIGINAL_CPU] = original_to_annotation(orig) if orig else None
            patch = {k: v for k, v in want.items() if pod.annotations.get(k) != v}
            if patch:
                yield PodPatch(pod.ref, patch)


__all__ = ["evaluate"]
