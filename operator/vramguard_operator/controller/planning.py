"""What one evaluation works on, built purely from a snapshot of the indexes:
the namespaces in scope, each namespace's effective GPUMemoryPolicy, the
groups of namespaces evaluated together (same effective policy) with their
engine inputs, and the budgets whose spec does not parse. Also the budget
status notes that the loop adds after acting (invalid specs, refused resizes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vramguard_api import conditions as C
from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.meta import Condition
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_operator.controller.indexes import BudgetEntry, Snapshot, Versioned, has_vramguard_state
from vramguard_operator.controller.ratelimit import EvictionLimiter
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.engine.types import EffectivePolicy, EngineConfig, EngineInput, HeldBudget, PodFacts
from vramguard_operator.policy import plan as policy_plan
from vramguard_operator.policy.dra import DRAConfig
from vramguard_operator.policy.merge import MergedPolicy, merge
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.sharers import KAI_RESERVATION_NAMESPACE

log = logging.getLogger("vramguard.reconcile")


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
    (each is held: nothing is decided for it, its records are kept, and the
    rest of its namespace is evaluated as if it were absent), and each
    namespace's policy."""

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


@dataclass(frozen=True, slots=True)
class _Common:
    """What every group of one evaluation shares."""

    now: datetime
    config: EngineConfig
    merged: Mapping[str, MergedPolicy]
    nodes: Mapping[str, NodeFacts]
    previous: Mapping[str, GPUMemoryBudgetStatus] | None
    allocations: policy_plan.Allocations


def _group(snap: Snapshot, policy: EffectivePolicy, namespaces: list[str], common: _Common) -> Group:
    """One group's engine input: its namespaces' budgets (with their current
    status), pods and GPU pods, with ceilings and implicit budgets applied."""
    budgets: list[GPUMemoryBudget] = []
    current: dict[tuple[str, str], dict[str, Any] | None] = {}
    pods: list[PodFacts] = []
    held: dict[tuple[str, str], HeldBudget] = {}
    for ns in namespaces:
        for e in snap.budgets.get(ns, ()):
            if e.value.budget is None:  # its spec does not parse: held, its records kept
                held[(ns, e.value.name)] = HeldBudget(e.uid, C.REASON_INVALID_SPEC, e.value.error or "invalid spec")
                continue
            budgets.append(e.value.budget)
            current[(ns, e.value.name)] = e.value.status_api()
        pods.extend(p.value for p in snap.pods.get(ns, ()))
    gpu_pods = [p for ns in namespaces for p in snap.gpu_pods.get(ns, ())]
    view = policy_plan.prepare(
        budgets, pods, gpu_pods, common.nodes, common.merged, common.previous, common.allocations
    )
    for problem in view.problems:
        log.warning("%s", problem)
    inp = EngineInput(
        budgets=view.budgets,
        pods=view.pods,
        reports=snap.valid_reports(),
        now=common.now,
        policy=policy,
        config=common.config,
        device_limits=view.device_limits,
        held=held,
        unknown_nodes=snap.unknown_nodes(),
    )
    return Group(policy, namespaces, inp, current, view)


def plan(
    snap: Snapshot,
    now: datetime,
    config: EngineConfig,
    memory: policy_plan.PolicyMemory | None = None,
    dra: DRAConfig | None = None,
) -> Plan:
    """Build the engine inputs of one evaluation from a snapshot (``dra``: how
    ResourceSlices name a GPU's UUID and memory; default NVIDIA's)."""
    scope = scope_of(snap)
    broken = snap.invalid_policies()
    merged = policy_plan.merged_policies(
        list(snap.valid_policies().values()), snap.namespaces, scope, broken
    )
    nodes = policy_plan.node_facts(snap.gpu_nodes, snap.valid_reports())
    pols = namespace_policies(snap.valid_policies(), snap.namespaces, scope, broken)
    invalid = [e for ns in scope for e in snap.budgets.get(ns, ()) if e.value.budget is None]
    by_policy: dict[EffectivePolicy, list[str]] = {}
    for ns in scope:
        by_policy.setdefault(pols[ns].effective, []).append(ns)
    previous = memory.implicit_status if memory is not None else None
    allocations = policy_plan.Allocations(
        claims=snap.claims,
        slices=snap.slices,
        kai_reservations=snap.gpu_pods.get(KAI_RESERVATION_NAMESPACE, []),
        dra=dra or DRAConfig(),
    )
    common = _Common(now, config, merged, nodes, previous, allocations)
    groups = [_group(snap, policy, namespaces, common) for policy, namespaces in by_policy.items()]
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

