"""The per-object rules that policies make, kept between evaluations (pure).

Building a budget under its namespace's ceilings (``ceilings.effective_budget``)
and a pod's implicit budget (``implicit.implicit_budget``) means building and
validating pydantic models, and at scale most inputs stay the same from one
evaluation to the next: a rule is rebuilt only when what it is made of changes.

- a budget under its ceilings: by budget uid, rebuilt when the budget's
  ``generation`` (its spec) or the namespace's merged policy changes; the
  status the engine reads is put on the kept budget at each use;
- an implicit budget: by pod uid, rebuilt when the trimmed GPU pod, its
  grants (DRA claims, sharers' allocations), whether a real budget selects
  it, the namespace's merged policy or what shares read of the node changes (labels,
  allocatable resources, and per device its UUID, MIG profile, virtualization
  mode, total and usable memory; not the memory in use, which moves with every
  report).

- a pod's grants from GPU sharers (``sharers.sharer_grants``, which parses
  its resources): by pod uid, rebuilt when the trimmed pod, what shares read
  of the node, or KAI's GPU groups change.

The results are the objects the uncached functions return, so the engine
decides identically (tests/unit/policy/test_rules.py compares them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_operator.policy.ceilings import effective_budget
from vramguard_operator.policy.grants import Grants
from vramguard_operator.policy.implicit import ImplicitBudget, implicit_budget
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.sharers import sharer_grants


@dataclass(frozen=True, slots=True)
class _Effective:
    generation: int | None
    merged: MergedPolicy
    budget: GPUMemoryBudget
    sources: dict[str, str]


@dataclass(frozen=True, slots=True)
class _Granted:
    pod: Mapping[str, Any]
    node: tuple[Any, ...] | None
    groups: Mapping[str, str]
    result: Grants


@dataclass(frozen=True, slots=True)
class _Implicit:
    pod: Mapping[str, Any]
    node: tuple[Any, ...] | None
    merged: MergedPolicy
    grants: Grants | None
    flags: tuple[bool, bool]
    result: ImplicitBudget | None


def node_key(node: NodeFacts | None) -> tuple[Any, ...] | None:
    """What shares read of a node (see the module doc), as a comparable value."""
    if node is None:
        return None
    devices = tuple(
        (d.uuid, d.mig_profile, d.virtualization_mode,
         None if d.memory is None else (d.memory.total_bytes, d.memory.usable_bytes))
        for d in node.devices
    )
    return node.name, tuple(sorted(node.labels.items())), tuple(sorted(node.allocatable.items())), devices


class RuleCache:
    """Kept rules, and how often they were reused (``hits``) or built (``misses``)."""

    def __init__(self) -> None:
        self._effective: dict[str, _Effective] = {}
        self._implicit: dict[str, _Implicit] = {}
        self._granted: dict[str, _Granted] = {}
        self._node_keys: dict[int, tuple[NodeFacts, tuple[Any, ...] | None]] = {}
        self.hits = 0
        self.misses = 0

    def effective(self, budget: GPUMemoryBudget, merged: MergedPolicy) -> tuple[GPUMemoryBudget, dict[str, str]]:
        """``ceilings.effective_budget(budget, merged)``, with the budget's own status.
        Raises ``ValueError`` as that function does (nothing is kept then)."""
        uid = budget.metadata.uid or ""
        gen = budget.metadata.generation
        kept = self._effective.get(uid) if uid else None
        if kept is None or kept.generation != gen or kept.merged != merged:
            self.misses += 1
            eff, sources = effective_budget(budget, merged)
            kept = _Effective(gen, merged, eff, sources)
            if uid:
                self._effective[uid] = kept
        else:
            self.hits += 1
        out = kept.budget
        if out.status is not budget.status:
            out = out.model_copy(update={"status": budget.status})
        return out, dict(kept.sources)

    def implicit(
        self,
        pod: Mapping[str, Any],
        node: NodeFacts | None,
        merged: MergedPolicy,
        grants: Grants | None = None,
        selected: bool = False,
        claims_gpu: bool = False,
    ) -> ImplicitBudget | None:
        """``implicit.implicit_budget(pod, node, merged, grants, selected, claims_gpu)``."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        key, flags = self._node_key(node), (selected, claims_gpu)
        kept = self._implicit.get(uid) if uid else None
        if (kept is not None and (kept.pod is pod or kept.pod == pod) and kept.node == key and kept.merged == merged
                and kept.grants == grants and kept.flags == flags):
            self.hits += 1
            return kept.result
        self.misses += 1
        result = implicit_budget(pod, node, merged, grants, selected, claims_gpu)
        if uid:
            self._implicit[uid] = _Implicit(pod, key, merged, grants, flags, result)
        return result

    def grants(self, pod: Mapping[str, Any], node: NodeFacts | None, groups: Mapping[str, str]) -> Grants:
        """``sharers.sharer_grants(pod, node, groups)``: what the pod's sharer
        annotations and resources grant (rebuilt when the pod, what shares read
        of its node, or KAI's GPU groups change)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        key = self._node_key(node)
        kept = self._granted.get(uid) if uid else None
        if kept is not None and (kept.pod is pod or kept.pod == pod) and kept.node == key and kept.groups == groups:
            self.hits += 1
            return kept.result
        self.misses += 1
        result = sharer_grants(pod, node, groups)
        if uid:
            self._granted[uid] = _Granted(pod, key, dict(groups), result)
        return result

    def _node_key(self, node: NodeFacts | None) -> tuple[Any, ...] | None:
        """``node_key``, computed once per NodeFacts object (the caller keeps one per node)."""
        if node is None:
            return None
        kept = self._node_keys.get(id(node))
        if kept is not None and kept[0] is node:
            return kept[1]
        if len(self._node_keys) > 100_000:
            self._node_keys.clear()
        key = node_key(node)
        self._node_keys[id(node)] = (node, key)
        return key

    def forget(self, budget_uids: Iterable[str], pod_uids: Iterable[str]) -> None:
        """Drop the rules of budgets and pods that are not in these (gone)."""
        live_b, live_p = set(budget_uids), set(pod_uids)
        for uid in [u for u in self._effective if u not in live_b]:
            del self._effective[uid]
        for uid in [u for u in self._implicit if u not in live_p]:
            del self._implicit[uid]
        for uid in [u for u in self._granted if u not in live_p]:
            del self._granted[uid]
        self._node_keys.clear()
