"""What one evaluation works on, built purely from a snapshot of the indexes:
the namespaces in scope, each namespace's effective GPUMemoryPolicy, the
groups of namespaces evaluated together (same effective policy) with their
engine inputs, and the budgets whose spec does not parse. Also the budget
status notes that the loop adds after acting (invalid specs, refused resizes).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vramguard_api import conditions as C
from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.meta import Condition
from vramguard_operator.controller.indexes import BudgetEntry, Snapshot, Versioned, has_vramguard_state
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.engine.types import EffectivePolicy, EngineConfig, EngineInput, HeldBudget
from vramguard_operator.policy import plan as policy_plan
from vramguard_operator.policy.dra import DRAConfig
from vramguard_operator.policy.plan import NamespacePolicy, namespace_policies
from vramguard_operator.policy.sharers import KAI_RESERVATION_NAMESPACE

log = logging.getLogger("vramguard.reconcile")


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


def plan(
    snap: Snapshot,
    now: datetime,
    config: EngineConfig,
    memory: policy_plan.PolicyMemory | None = None,
    dra: DRAConfig | None = None,
) -> Plan:
    """Build the engine inputs of one evaluation from a snapshot (``dra``: how
    ResourceSlices name a GPU's UUID and memory; default NVIDIA's), by
    ``policy.plan.engine_groups``, which the fleet simulation calls too."""
    scope = scope_of(snap)
    broken = snap.invalid_policies()
    merged = policy_plan.merged_policies(
        list(snap.valid_policies().values()), snap.namespaces, scope, broken
    )
    reports = snap.valid_reports()
    nodes = policy_plan.node_facts(snap.gpu_nodes, reports)
    pols = namespace_policies(snap.valid_policies(), snap.namespaces, scope, broken)
    invalid = [e for ns in scope for e in snap.budgets.get(ns, ()) if e.value.budget is None]
    # a spec that does not parse: that budget is held (its records kept), the rest of its namespace goes on
    held = {
        (e.value.namespace, e.value.name): HeldBudget(e.uid, C.REASON_INVALID_SPEC, e.value.error or "invalid spec")
        for e in invalid
    }
    allocations = policy_plan.Allocations(
        claims=snap.claims,
        slices=snap.slices,
        kai_reservations=snap.gpu_pods.get(KAI_RESERVATION_NAMESPACE, []),
        dra=dra or DRAConfig(),
    )
    budgets = {ns: [e.value.budget for e in snap.budgets.get(ns, ()) if e.value.budget is not None] for ns in scope}
    found = policy_plan.engine_groups(
        scope,
        pols,
        budgets,
        {ns: [p.value for p in snap.pods.get(ns, ())] for ns in scope},
        {ns: list(snap.gpu_pods.get(ns, ())) for ns in scope},
        nodes,
        merged,
        reports,
        now,
        config,
        memory.implicit_status if memory is not None else None,
        allocations,
        held,
        snap.unknown_nodes(),
    )
    groups = []
    for g in found:
        for problem in g.view.problems:
            log.warning("%s", problem)
        current = {
            (ns, e.value.name): e.value.status_api()
            for ns in g.namespaces
            for e in snap.budgets.get(ns, ())
            if e.value.budget is not None
        }
        groups.append(Group(g.policy, list(g.namespaces), g.input, current, g.view))
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
        if err and v.step in ("Throttle", "Cap", "Evict") and err not in v.message:
            v = v.model_copy(update={"message": f"{v.message}; {err}"[:1024]})
        violations.append(v)
    return status.model_copy(update={"violations": violations})

