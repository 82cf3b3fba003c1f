"""GPUMemoryPolicies applied to one engine evaluation (pure).

``prepare`` turns the budgets and pods of a group of namespaces into what the
engine evaluates under the policies:

- each real budget with its limits lowered to (or completed by) the ceilings
  of its namespace's policies (``ceilings.effective_budget``), and where each
  limit came from;
- one implicit budget per GPU pod that no budget selects, or that was granted
  memory (``implicit``), and one per DRA claim shared by several pods
  (``claim_budgets``), each with the status it had after the previous
  evaluation (kept in memory by the caller: implicit budgets have no object to
  hold it);
- the grants of each pod: DRA claims resolved against ResourceSlices
  (``dra``) and GPU sharers' allocation annotations (``sharers``), given as
  ``Allocations``; their per-device limits (``PolicyView.device_limits``, for
  ``EngineInput.device_limits``) and their problems (``pod_problems``, for
  Warning Events on the pods);
- the pods, with the implicit selector labels on those that have one.

``finish`` splits the engine's statuses: real budgets get ``limitSources`` and
``modeSource``; implicit ones are returned for the caller to keep, never
written. ``limit_patches`` are the ``vramguard.io/limits`` annotations to write.

One evaluation's engine inputs are built from plain objects by ``groups``
(``namespace_policies``, ``engine_groups``), with ``prepare`` for each group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_operator.engine.types import (
    BudgetStatusUpdate,
    PodFacts,
    PodRef,
    PressureRule,
)
from vramguard_operator.policy.ceilings import SOURCE_BUDGET, effective_budget
from vramguard_operator.policy.claim_budgets import ClaimBudget, claim_budgets
from vramguard_operator.policy.dra import ClaimGrants, DRAConfig, claim_grants
from vramguard_operator.policy.grants import Grants, PodProblem
from vramguard_operator.policy.implicit import (
    ANNOTATION_LIMITS,
    IMPLICIT_UID_PREFIX,
    ImplicitBudget,
    build_implicit,
    is_implicit,
    label_pods,
    limits_patches,
)
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.pressure import device_shares, namespace_rules
from vramguard_operator.policy.rules import RuleCache
from vramguard_operator.policy.sharers import kai_group_devices, sharer_grants


@dataclass(frozen=True, slots=True)
class Allocations:
    """What allocated memory to pods, as the API holds it: ResourceClaims by
    (namespace, name) and ResourceSlices (dicts, ``resource.k8s.io/v1``), KAI's
    reservation pods (``sharers.kai_group_devices``), and which device
    attribute and capacity are a GPU's UUID and memory."""

    claims: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    slices: Sequence[Mapping[str, Any]] = ()
    kai_reservations: Sequence[Mapping[str, Any]] = ()
    dra: DRAConfig = DRAConfig()


@dataclass(frozen=True, slots=True)
class PolicyView:
    """Engine inputs under the policies, and what is needed to finish the output.

    ``sources``: (namespace, budget name) -> (limitSources, modeSource) of the
    real budgets. ``problems``: budgets the ceilings could not be applied to
    (evaluated as they are), one line each. ``gpu_pods``: the GPU pods given.
    ``claims``: the shared claims' budgets (also in ``budgets``). ``pod_problems``:
    by PodRef, what could not be read of the pod's grants. ``pressure_rules``,
    ``device_shares``: the device-pressure rule of each namespace of the pods
    and the node's share of each device (``EngineInput``'s fields of the same
    names)."""

    budgets: tuple[GPUMemoryBudget, ...]
    pods: tuple[PodFacts, ...]
    implicit: tuple[ImplicitBudget, ...] = ()
    sources: Mapping[tuple[str, str], tuple[dict[str, str], str]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    gpu_pods: tuple[Mapping[str, Any], ...] = ()
    claims: tuple[ClaimBudget, ...] = ()
    pod_problems: Mapping[PodRef, tuple[PodProblem, ...]] = field(default_factory=dict)
    pressure_rules: Mapping[str, PressureRule] = field(default_factory=dict)
    device_shares: Mapping[str, int] = field(default_factory=dict)

    @property
    def device_limits(self) -> dict[str, dict[str, int]]:
        """Bytes per device UUID, by implicit budget uid (for ``EngineInput.device_limits``)."""
        return {i.budget.metadata.uid or "": i.device_limits for i in self.implicit if i.device_limits}


def mode_source(budget: GPUMemoryBudget, merged: MergedPolicy) -> str:
    """``policy/<name>`` when that policy's DryRun overrides the budget's
    Enforce, else ``budget``."""
    if merged.mode is not None and merged.mode.value == "DryRun" and budget.spec.enforcement.mode == "Enforce":
        return merged.mode.source
    return SOURCE_BUDGET


def pod_grants(
    gpu_pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, NodeFacts], allocations: Allocations,
    rules: RuleCache | None = None,
) -> tuple[dict[str, Grants], ClaimGrants]:
    """Every pod's grants (sharers' and DRA claims'), by pod uid, and the claims'
    view (``rules``: sharers' grants kept from earlier evaluations)."""
    claimed = claim_grants(gpu_pods, allocations.claims, allocations.slices, allocations.dra)
    groups = kai_group_devices(allocations.kai_reservations)
    sharers = rules.grants if rules else sharer_grants
    out = {}
    for pod in gpu_pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid = meta.get("uid") or ""
        found = sharers(pod, nodes.get(spec.get("nodeName") or ""), groups)
        found = found.plus(claimed.grants.get(uid, Grants()))
        if found or found.problems:
            out[uid] = found
    return out, claimed


def prepare(
    budgets: Sequence[GPUMemoryBudget],
    pods: Sequence[PodFacts],
    gpu_pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, NodeFacts],
    merged: Mapping[str, MergedPolicy],
    previous: Mapping[str, GPUMemoryBudgetStatus] | None = None,
    allocations: Allocations | None = None,
    rules: RuleCache | None = None,
) -> PolicyView:
    """Apply the merged policies (by namespace) and the pods' grants to one
    evaluation's budgets and pods. ``gpu_pods``: the GPU pods of the same
    namespaces as Pod dicts (at least metadata, ``spec.nodeName``,
    ``spec.resourceClaims``, containers' resources, ``status.phase`` and
    ``status.resourceClaimStatuses``). ``previous``: implicit budgets' last
    statuses by budget uid. ``rules``: the budgets under ceilings and implicit
    budgets kept from earlier evaluations (the same results, built only when
    their inputs change)."""
    out, sources, problems = [], {}, []
    for b in budgets:
        ns, name = b.metadata.namespace or "", b.metadata.name or ""
        policy = merged.get(ns, MergedPolicy(ns))
        try:
            eff, limit_sources = rules.effective(b, policy) if rules else effective_budget(b, policy)
        except ValueError as err:
            problems.append(f"GPUMemoryBudget {ns}/{name}: ceilings not applied: {err}")
            eff, limit_sources = b, {}
        out.append(eff)
        sources[(ns, name)] = (limit_sources, mode_source(b, policy))
    grants, claimed = pod_grants(gpu_pods, nodes, allocations or Allocations(), rules)
    make = rules.implicit if rules else None
    implicit = build_implicit(gpu_pods, budgets, nodes, merged, grants, claimed.devices, make)
    live = {(p.get("metadata") or {}).get("uid") or "": p for p in gpu_pods if _scheduled(p)}
    claims = claim_budgets(claimed.shared, live, claimed.devices, merged)
    prev = previous or {}

    def restored(b: GPUMemoryBudget) -> GPUMemoryBudget:
        return b.model_copy(update={"status": prev.get(b.metadata.uid or "")})

    implicit = [replace(i, budget=restored(i.budget)) for i in implicit]
    claims = [replace(c, budget=restored(c.budget)) for c in claims]
    extra: dict[str, dict[str, str]] = {}
    for c in claims:
        for uid in c.pod_uids:
            extra.setdefault(uid, {}).update([c.label])
    return PolicyView(
        budgets=tuple(out) + tuple(i.budget for i in implicit) + tuple(c.budget for c in claims),
        pods=label_pods(pods, implicit, extra),
        implicit=tuple(implicit),
        sources=sources,
        problems=tuple(problems),
        gpu_pods=tuple(gpu_pods),
        claims=tuple(claims),
        pod_problems=_pod_problems(gpu_pods, grants),
        pressure_rules=namespace_rules(merged, {p.namespace for p in pods}),
        device_shares=device_shares(nodes),
    )


def _scheduled(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def _pod_problems(gpu_pods: Sequence[Mapping[str, Any]], grants: Mapping[str, Grants]) -> dict[PodRef, tuple[PodProblem, ...]]:
    out = {}
    for pod in gpu_pods:
        meta = pod.get("metadata") or {}
        found = grants.get(meta.get("uid") or "")
        if found is not None and found.problems and _scheduled(pod):
            out[PodRef(meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or "")] = found.problems
    return out


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
    implicit budgets' last statuses (by budget uid), the ``vramguard.io/limits``
    values written (by pod uid), so that a watch that lags behind a write does
    not cause the same write again, and the grant problems already reported
    (by pod uid), so that each becomes one Event. Losing it (a restart) costs at
    most one repeated Warning Event and one redundant annotation write per pod."""

    def __init__(self) -> None:
        self.implicit_status: dict[str, GPUMemoryBudgetStatus] = {}
        self.limits_written: dict[str, str | None] = {}
        self.problems_reported: dict[str, set[PodProblem]] = {}
        self._evaluated: set[str] = set()  # implicit budget uids since the last forget

    def finish(self, statuses: Iterable[BudgetStatusUpdate], view: PolicyView | None) -> list[BudgetStatusUpdate]:
        """``finish`` the engine's statuses, keeping the implicit ones here."""
        if view is None:
            return list(statuses)
        real, kept = finish(statuses, view)
        self.implicit_status.update(kept)
        self._evaluated |= set(kept)
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

    def pending_problems(self, view: PolicyView | None) -> list[tuple[PodRef, PodProblem]]:
        """The pods' grant problems not reported yet (one Warning Event each)."""
        if view is None:
            return []
        return [
            (ref, p)
            for ref, problems in view.pod_problems.items()
            for p in problems
            if p not in self.problems_reported.get(ref.uid, set())
        ]

    def reported_problem(self, ref: PodRef, problem: PodProblem) -> None:
        """Remember a reported grant problem."""
        self.problems_reported.setdefault(ref.uid, set()).add(problem)

    def forget(self, live_pod_uids: Iterable[str]) -> None:
        """Drop what belongs to pods that are gone, and the statuses of implicit
        budgets not evaluated since the last call (a shared claim's budget
        lives as long as it is evaluated)."""
        live = set(live_pod_uids)
        for table in (self.limits_written, self.problems_reported):
            for uid in [u for u in table if u not in live]:
                del table[uid]
        for uid in [
            u
            for u in self.implicit_status
            if u.removeprefix(IMPLICIT_UID_PREFIX) not in live and u not in self._evaluated
        ]:
            del self.implicit_status[uid]
        self._evaluated = set()
