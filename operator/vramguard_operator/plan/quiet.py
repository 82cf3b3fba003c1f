"""Running totals per budget: the pods a budget selects that may be left out
of an evaluation, and what they add to its status (docs/operator.md,
"Incremental evaluation").

Most pods of a large budget are far below their limits. ``engine.quiet.
quiet_pod`` says, for one budget and one pod, whether the pod can change the
budget's decisions, and if not, what it adds to the status (matched, VRAM and
RAM, stale or missing reports). This keeps those answers and their sums per
budget, so that evaluating a budget costs what its *active* pods cost: a node
report re-evaluates the budgets of its pods with those pods and the budgets'
active ones, plus one ``QuietPods`` sum each, instead of every selected pod.

An answer is recomputed when what it was made of changes: the pod (or its
node's report, or its report's staleness, or a second report claiming its
node), the budget's spec or its namespace's policy, or the budget's status
naming the pod or not any more. Pods without an answer yet are active.

Soft limits at the shares: a pod of a budget that asks for them is quiet only
while its ``vramguard.io/memory-limits`` already stands where an evaluation
would leave it (``engine.quiet.limits_settled``, over every budget that
selects it: the lowest share wins). That answer reads all of the pod's
budgets, so a change to any one of them (its spec, its policy, created or
deleted) answers the pod again for every budget; a pod with a DRA claim or a
sharer's grant (whose allocation budget would join the shares) is never
settled here. Device pressure needs no answer
here: every pod of a node under a rule is evaluated with any one of them
(``incremental``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_operator.engine.quiet import limits_settled, quiet_pod, wants_soft_limits
from vramguard_operator.engine.types import EffectivePolicy, EngineConfig, QuietPods
from vramguard_operator.plan.cache import ClusterCache
from vramguard_operator.policy.dra import pod_claim_names
from vramguard_operator.policy.sharers import grant_annotations, kai_groups

BudgetKey = tuple[str, str]


@dataclass(slots=True)
class _Sum:
    matched: int = 0
    vram_bytes: int = 0
    vram_known: int = 0
    ram_bytes: int = 0
    ram_known: int = 0
    stale: Counter[str] = field(default_factory=Counter)
    missing: Counter[str] = field(default_factory=Counter)

    def add(self, q: QuietPods, sign: int) -> None:
        self.matched += sign * q.matched
        self.vram_bytes += sign * q.vram_bytes
        self.vram_known += sign * q.vram_known
        self.ram_bytes += sign * q.ram_bytes
        self.ram_known += sign * q.ram_known
        for nodes, counter in ((q.stale_nodes, self.stale), (q.missing_nodes, self.missing)):
            for n in nodes:
                counter[n] += sign
                if counter[n] <= 0:
                    del counter[n]


class QuietTotals:
    """Per budget: each pod's answer (``QuietPods``, or None: active) and their sums."""

    def __init__(self) -> None:
        self._answers: dict[BudgetKey, dict[str, QuietPods | None]] = {}
        self._sums: dict[BudgetKey, _Sum] = {}
        self._budgets_of: dict[str, set[BudgetKey]] = {}

    def set(self, key: BudgetKey, uid: str, answer: QuietPods | None) -> None:
        """A pod's answer for a budget (replacing the one kept)."""
        answers = self._answers.setdefault(key, {})
        total = self._sums.setdefault(key, _Sum())
        old = answers.get(uid)
        if old is not None:
            total.add(old, -1)
        answers[uid] = answer
        if answer is not None:
            total.add(answer, 1)
        self._budgets_of.setdefault(uid, set()).add(key)

    def drop_pod(self, uid: str, keep: Iterable[BudgetKey] = ()) -> None:
        """Forget a pod's answers, except for the budgets in ``keep``."""
        kept = set(keep)
        held = self._budgets_of.pop(uid, set())
        for key in held - kept:
            old = self._answers.get(key, {}).pop(uid, None)
            if old is not None:
                self._sums[key].add(old, -1)
        if held & kept:
            self._budgets_of[uid] = held & kept

    def drop_budget(self, key: BudgetKey) -> None:
        """Forget a budget's answers."""
        for uid in self._answers.pop(key, {}):
            self._budgets_of.get(uid, set()).discard(key)
        self._sums.pop(key, None)

    def quiet(self, key: BudgetKey, uid: str) -> bool:
        """Whether the pod may be left out of the budget's evaluation."""
        return self._answers.get(key, {}).get(uid) is not None

    def pods_of(self, key: BudgetKey) -> frozenset[str]:
        """The pods with an answer for the budget."""
        return frozenset(self._answers.get(key, {}))

    def known(self, key: BudgetKey) -> int:
        """How many pods have an answer for the budget."""
        return len(self._answers.get(key, {}))

    def summary(self, key: BudgetKey, given: Iterable[str]) -> QuietPods:
        """What the budget's quiet pods that are not ``given`` add to its status."""
        total = self._sums.get(key)
        if total is None:
            return QuietPods()
        out = _Sum(total.matched, total.vram_bytes, total.vram_known, total.ram_bytes, total.ram_known,
                   Counter(total.stale), Counter(total.missing))
        answers = self._answers.get(key, {})
        for uid in given:
            q = answers.get(uid)
            if q is not None:
                out.add(q, -1)
        return QuietPods(out.matched, out.vram_bytes, out.vram_known, out.ram_bytes, out.ram_known,
                         frozenset(out.stale), frozenset(out.missing))


class QuietAnswers:
    """``QuietTotals`` kept up to date with ``engine.quiet.quiet_pod``.

    ``effective(key)``: the budget as the engine evaluates it (None: it does
    not parse; its pods are then all active); ``merged_of(namespace)``: the
    namespace's merged policy (a change answers every pod of its budgets
    again); ``policy_of(namespace)``: the cluster policy as the engine applies
    it there (mode, exemptions, soft limits). ``changed``: after ``refresh``,
    the pods whose budgets' spec or policy changed (or that were answered
    for a new budget)."""

    def __init__(
        self,
        cache: ClusterCache,
        config: EngineConfig,
        effective: Callable[[BudgetKey], GPUMemoryBudget | None],
        merged_of: Callable[[str], Any],
        policy_of: Callable[[str], EffectivePolicy] = lambda ns: EffectivePolicy(),
    ) -> None:
        self.cache = cache
        self.config = config
        self.effective = effective
        self.merged_of = merged_of
        self.policy_of = policy_of
        self.totals = QuietTotals()
        self.changed: set[str] = set()
        self._basis: dict[BudgetKey, tuple[Any, ...]] = {}
        self._again: set[tuple[BudgetKey, str]] = set()
        self._eff: dict[BudgetKey, GPUMemoryBudget | None] = {}
        self._settled: dict[str, bool] = {}
        self._unknown: dict[str, str] = {}

    def again(self, key: BudgetKey, uids: Iterable[str]) -> None:
        """Answer these pods again at the next refresh (the budget's status named
        them, or stopped naming them)."""
        self._again |= {(key, u) for u in uids}

    def refresh(self, budgets: Iterable[BudgetKey], pods: Iterable[str], now: datetime) -> None:
        """Answer again what marked budgets and pods may have changed."""
        c = self.cache
        self._eff.clear()
        self._settled.clear()
        self._unknown = c.unknown_nodes()
        changed: set[str] = set()
        for key in budgets:
            if key not in c.budgets:
                changed |= self.totals.pods_of(key)
                self.totals.drop_budget(key)
                self._basis.pop(key, None)
                continue
            v = c.budgets[key]
            basis = (v.uid, v.value.generation, self.merged_of(key[0]), self.policy_of(key[0]))
            if basis != self._basis.get(key):  # spec or policy: every pod again, for all its budgets
                self._basis[key] = basis
                changed |= self.totals.pods_of(key) | c.selects.get(key, set())
                self.totals.drop_budget(key)
        self.changed = changed
        for uid in set(pods) | changed:
            keys = c.selected_by.get(uid, set())
            self.totals.drop_pod(uid, keep=keys)
            if uid in c.pods:
                for key in keys:
                    self._answer(key, uid, now)
        for key, uid in self._again:
            if uid in c.selects.get(key, ()):
                self._answer(key, uid, now)
        self._again.clear()

    def _answer(self, key: BudgetKey, uid: str, now: datetime) -> None:
        eff, pod = self._effective(key), self.cache.pods[uid].facts
        soft = self.merged_of(key[0]).soft_limits is not None
        report = self.cache.report(pod.node_name or "")
        answer = None
        if eff is not None:
            settled = self._limits_settled(uid, now)
            answer = quiet_pod(eff, pod, report, now, self.config, soft, self._unknown, settled)
        self.totals.set(key, uid, answer)

    def _effective(self, key: BudgetKey) -> GPUMemoryBudget | None:
        if key not in self._eff:
            self._eff[key] = self.effective(key)
        return self._eff[key]

    def _limits_settled(self, uid: str, now: datetime) -> bool:
        """``engine.quiet.limits_settled`` over every budget selecting the pod
        (once per refresh); False for a pod with a DRA claim or a sharer's
        grant, or a budget that does not parse."""
        found = self._settled.get(uid)
        if found is not None:
            return found
        c = self.cache
        e = c.pods[uid]
        pod = e.facts
        settled = False
        grants = (e.gpu is not None and pod_claim_names(e.gpu)) or grant_annotations(pod.annotations)
        if not grants and not kai_groups(pod.labels):
            policy = self.policy_of(pod.namespace)
            acting = policy.mode == "Enforce" and pod.namespace not in policy.exempt_namespaces
            budgets = [(k, self._effective(k)) for k in sorted(c.selected_by.get(uid, ()))]
            if all(b is not None for _, b in budgets):
                wants = [(b, wants_soft_limits(b, policy.soft_limits, acting)) for _, b in budgets if b is not None]
                settled = limits_settled(pod, wants, c.report(pod.node_name or ""), now, self.config)
        self._settled[uid] = settled
        return settled
