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

``namespace_policies`` and ``engine_groups`` build one evaluation's engine
inputs from plain objects: the operator's reconcile loop calls them on its
indexes, the fleet simulation (``simulate``) on its simulated cluster, so both
evaluate exactly the same inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.types import (
    BudgetStatusUpdate,
    EffectivePolicy,
    EngineConfig,
    EngineInput,
    HeldBudget,
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
from vramguard_operator.policy.merge import MergedPolicy, merge
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.pressure import device_shares, namespace_rules
from vramguard_operator.policy.ratelimit import EvictionLimiter
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


# --- one evaluation's inputs ------------------------------------------------------


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
                soft_limits=merged.soft_limits is not None,
            ),
            merged.policies or (EvictionLimiter.DEFAULT_SCOPE,),
        )
    return out


@dataclass(frozen=True, slots=True)
class EngineGroup:
    """Namespaces evaluated together (one effective policy), their engine input
    and the policy view it was prepared with (for ``PolicyMemory.finish``)."""

    policy: EffectivePolicy
    namespaces: tuple[str, ...]
    input: EngineInput
    view: PolicyView


def engine_groups(
    namespaces: Sequence[str],
    policies: Mapping[str, NamespacePolicy],
    budgets: Mapping[str, Sequence[GPUMemoryBudget]],
    pods: Mapping[str, Sequence[PodFacts]],
    gpu_pods: Mapping[str, Sequence[Mapping[str, Any]]],
    nodes: Mapping[str, NodeFacts],
    merged: Mapping[str, MergedPolicy],
    reports: Mapping[str, NodeGPUUsage],
    now: datetime,
    config: EngineConfig,
    previous: Mapping[str, GPUMemoryBudgetStatus] | None = None,
    allocations: Allocations | None = None,
    held: Mapping[tuple[str, str], HeldBudget] | None = None,
    unknown_nodes: Mapping[str, str] | None = None,
) -> list[EngineGroup]:
    """The engine inputs of one evaluation: ``namespaces`` (those to evaluate,
    in order) grouped by effective policy (``policies``, from
    ``namespace_policies``), each group's budgets (with their status), pods and
    GPU pods (Pod dicts, for implicit budgets) ``prepare``d under the merged
    policies and the pods' grants (``allocations``), with every report.
    ``previous``: implicit budgets' last statuses by uid
    (``PolicyMemory.implicit_status``). ``held``: by (namespace, name), the
    budgets not to evaluate (their spec does not parse: ``EngineInput.held``);
    ``unknown_nodes``: by node, why its data cannot be believed."""
    by_policy: dict[EffectivePolicy, list[str]] = {}
    for ns in namespaces:
        by_policy.setdefault(policies[ns].effective, []).append(ns)
    groups = []
    for policy, group in by_policy.items():
        view = prepare(
            [b for ns in group for b in budgets.get(ns, ())],
            [p for ns in group for p in pods.get(ns, ())],
            [p for ns in group for p in gpu_pods.get(ns, ())],
            nodes,
            merged,
            previous,
            allocations,
        )
        inp = EngineInput(
            budgets=view.budgets,
            pods=view.pods,
            reports=reports,
            now=now,
            policy=policy,
            config=config,
            device_limits=view.device_limits,
            pressure_rules=view.pressure_rules,
            device_shares=view.device_shares,
            held={k: h for k, h in (held or {}).items() if k[0] in group},
            unknown_nodes=unknown_nodes or {},
        )
        groups.append(EngineGroup(policy, tuple(group), inp, view))
    return groups
