"""GPUMemoryPolicies applied to one engine evaluation (pure).

``prepare`` turns the budgets and pods of a group of namespaces into what the
engine evaluates under the policies:

- each real budget with its limits lowered to (or completed by) the ceilings
  of its namespace's policies (``ceilings.effective_budget``), and where each
  limit came from;
- one implicit budget per GPU pod that no budget selects (``implicit``), with
  the status it had after the previous evaluation (kept in memory by the
  caller: implicit budgets have no object to hold it);
- the pods, with the implicit selector label on those that have one.

``finish`` splits the engine's statuses: real budgets get ``limitSources`` and
``modeSource``; implicit ones are returned for the caller to keep, never
written. ``limit_patches`` are the ``vramguard.io/limits`` annotations to write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.types import BudgetStatusUpdate, PodFacts, PodRef
from vramguard_operator.policy.ceilings import SOURCE_BUDGET, effective_budget
from vramguard_operator.policy.implicit import (
    ANNOTATION_LIMITS,
    IMPLICIT_UID_PREFIX,
    ImplicitBudget,
    build_implicit,
    is_implicit,
    label_pods,
    limits_patches,
)
from vramguard_operator.policy.merge import MergedPolicy, merge
from vramguard_operator.policy.node import NodeFacts


@dataclass(frozen=True, slots=True)
class PolicyView:
    """Engine inputs under the policies, and what is needed to finish the output.

    ``sources``: (namespace, budget name) -> (limitSources, modeSource) of the
    real budgets. ``problems``: budgets the ceilings could not be applied to
    (evaluated as they are), one line each. ``gpu_pods``: the GPU pods given."""

    budgets: tuple[GPUMemoryBudget, ...]
    pods: tuple[PodFacts, ...]
    implicit: tuple[ImplicitBudget, ...] = ()
    sources: Mapping[tuple[str, str], tuple[dict[str, str], str]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    gpu_pods: tuple[Mapping[str, Any], ...] = ()


def mode_source(budget: GPUMemoryBudget, merged: MergedPolicy) -> str:
    """``policy/<name>`` when that policy's DryRun overrides the budget's
    Enforce, else ``budget``."""
    if merged.mode is not None and merged.mode.value == "DryRun" and budget.spec.enforcement.mode == "Enforce":
        return merged.mode.source
    return SOURCE_BUDGET


def prepare(
    budgets: Sequence[GPUMemoryBudget],
    pods: Sequence[PodFacts],
    gpu_pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, NodeFacts],
    merged: Mapping[str, MergedPolicy],
    previous: Mapping[str, GPUMemoryBudgetStatus] | None = None,
) -> PolicyView:
    """Apply the merged policies (by namespace) to one evaluation's budgets and
    pods. ``gpu_pods``: the GPU pods of the same namespaces as Pod dicts (at
    least metadata, ``spec.nodeName``, containers' resources, ``status.phase``).
    ``previous``: implicit budgets' last statuses by budget uid."""
    out, sources, problems = [], {}, []
    for b in budgets:
        ns, name = b.metadata.namespace or "", b.metadata.name or ""
        policy = merged.get(ns, MergedPolicy(ns))
        try:
            eff, limit_sources = effective_budget(b, policy)
        except ValueError as err:
            problems.append(f"GPUMemoryBudget {ns}/{name}: ceilings not applied: {err}")
            eff, limit_sources = b, {}
        out.append(eff)
        sources[(ns, name)] = (limit_sources, mode_source(b, policy))
    implicit = build_implicit(gpu_pods, budgets, nodes, merged)
    prev = previous or {}
    implicit = [
        replace(i, budget=i.budget.model_copy(update={"status": prev.get(i.budget.metadata.uid or "")}))
        for i in implicit
    ]
    return PolicyView(
        budgets=tuple(out) + tuple(i.budget for i in implicit),
        pods=label_pods(pods, implicit),
        implicit=tuple(implicit),
        sources=sources,
        problems=tuple(problems),
        gpu_pods=tuple(gpu_pods),
    )


def finish(
    statuses: Iterable[BudgetStatusUpdate], view: PolicyView
) -> tuple[list[BudgetStatusUpdate], dict[str, GPUMemoryBudgetStatus]]:
    """The real budgets' status updates with ``limitSources``/``modeSource``,
    and the implicit budgets' statuses by uid (to pass back as ``previous``)."""
    real, kept = [], {}
    for upd in statuses:
        if is_implicit(upd.budget.uid):
            kept[upd.budget.uid] = upd.status
            continue
        limit_sources, mode = view.sources.get((upd.budget.namespace, upd.budget.name), ({}, SOURCE_BUDGET))
        status = upd.status.model_copy(update={"limit_sources": limit_sources or None, "mode_source": mode})
        real.append(replace(upd, status=status))
    return real, kept


def limit_patches(view: PolicyView) -> dict[tuple[str, str], dict[str, str | None]]:
    """``vramguard.io/limits`` annotation patches by (namespace, pod name)."""
    return limits_patches(view.gpu_pods, view.implicit)


class PolicyMemory:
    """What the reconcile loop keeps for policies between evaluations: the
    implicit budgets' last statuses (by budget uid) and the ``vramguard.io/limits``
    values written (by pod uid), so that a watch that lags behind a write does
    not cause the same write again. Losing it (a restart) costs at most one
    repeated Warning Event and one redundant annotation write per pod."""

    def __init__(self) -> None:
        self.implicit_status: dict[str, GPUMemoryBudgetStatus] = {}
        self.limits_written: dict[str, str | None] = {}

    def finish(self, statuses: Iterable[BudgetStatusUpdate], view: PolicyView | None) -> list[BudgetStatusUpdate]:
        """``finish`` the engine's statuses, keeping the implicit ones here."""
        if view is None:
            return list(statuses)
        real, kept = finish(statuses, view)
        self.implicit_status.update(kept)
        return real

    def pending_limits(self, view: PolicyView | None) -> list[tuple[PodRef, dict[str, str | None]]]:
        """The ``vramguard.io/limits`` patches still to write, with each pod's ref."""
        if view is None:
            return []
        pods = view.gpu_pods
        refs = {
            (m.get("namespace") or "", m.get("name") or ""): PodRef(m.get("namespace") or "", m.get("name") or "", m.get("uid") or "")
            for m in (p.get("metadata") or {} for p in pods)
        }
        out = []
        for key, patch in limit_patches(view).items():
            ref = refs[key]
            if ref.uid in self.limits_written and self.limits_written[ref.uid] == patch[ANNOTATION_LIMITS]:
                continue
            out.append((ref, patch))
        return out

    def wrote_limits(self, ref: PodRef, patch: Mapping[str, str | None]) -> None:
        """Remember a written ``vramguard.io/limits`` value."""
        self.limits_written[ref.uid] = patch.get(ANNOTATION_LIMITS)

    def forget(self, live_pod_uids: Iterable[str]) -> None:
        """Drop what belongs to pods that are gone."""
        live = set(live_pod_uids)
        for uid in [u for u in self.limits_written if u not in live]:
            del self.limits_written[uid]
        for uid in [u for u in self.implicit_status if u.removeprefix(IMPLICIT_UID_PREFIX) not in live]:
            del self.implicit_status[uid]


def merged_policies(
    policies: Sequence[GPUMemoryPolicy],
    namespace_labels: Mapping[str, Mapping[str, str]],
    namespaces: Iterable[str],
    invalid: Mapping[str, str] | None = None,
) -> dict[str, MergedPolicy]:
    """The merged policy of each namespace (``invalid``: policies that do not
    parse, name -> error; they hold every namespace in DryRun)."""
    return {ns: merge(policies, ns, namespace_labels.get(ns, {}), invalid) for ns in namespaces}


def node_facts(gpu_nodes: Mapping[str, Mapping[str, Any]], reports: Mapping[str, NodeGPUUsage]) -> dict[str, NodeFacts]:
    """NodeFacts of the indexed GPU nodes (``policy_handlers.node_entry``) with their reports."""
    return {name: NodeFacts.from_api(body, reports.get(name)) for name, body in gpu_nodes.items()}
