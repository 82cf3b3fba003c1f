"""The full pass: every namespace's budgets, pods and reports, copied into a
``Snapshot``, planned into one engine input per effective policy by
``policy.groups.engine_groups`` (the same function the fleet simulation calls).

The operator itself evaluates incrementally (``incremental``); this is the
reference it must agree with, used by the fuzz harness (hostile objects
through the index entries, the planning and the engine) and by tests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vramguard_api import conditions as C
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.types import EffectivePolicy, EngineConfig, EngineInput, HeldBudget, PodFacts
from vramguard_operator.plan.entries import BudgetEntry, Versioned, has_vramguard_state
from vramguard_operator.policy import groups as policy_groups
from vramguard_operator.policy import inputs as policy_inputs
from vramguard_operator.policy.dra import DRAConfig
from vramguard_operator.policy.groups import NamespacePolicy, namespace_policies
from vramguard_operator.policy.sharers import KAI_RESERVATION_NAMESPACE

log = logging.getLogger("vramguard.reconcile")


# --- snapshot -------------------------------------------------------------------------


@dataclass(slots=True)
class Snapshot:
    """One copy of the indexes for an evaluation (plain dicts and lists).

    ``budgets``/``pods``: by namespace; ``reports``: by node (a string entry is a
    report that does not parse); ``policies``: by name (likewise);
    ``namespaces``: labels by namespace name."""

    budgets: dict[str, list[Versioned[BudgetEntry]]] = field(default_factory=dict)
    pods: dict[str, list[Versioned[PodFacts]]] = field(default_factory=dict)
    reports: dict[str, Versioned[NodeGPUUsage | str]] = field(default_factory=dict)
    policies: dict[str, Versioned[GPUMemoryPolicy | str]] = field(default_factory=dict)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    # GPU pods by namespace and GPU nodes by name, trimmed (policy_handlers' indexes)
    gpu_pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gpu_nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # ResourceClaims by (namespace, name) and ResourceSlices, trimmed (allocation_entries)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    slices: list[dict[str, Any]] = field(default_factory=list)
    # nodes that more than one NodeGPUUsage claims: why (which objects)
    report_conflicts: dict[str, str] = field(default_factory=dict)

    def valid_reports(self) -> dict[str, NodeGPUUsage]:
        """Reports that parse, by node."""
        return {n: v.value for n, v in self.reports.items() if isinstance(v.value, NodeGPUUsage)}

    def unknown_nodes(self) -> dict[str, str]:
        """Nodes whose data cannot be believed whatever their report says, and
        why: two reports claim the node, or its report does not parse."""
        out = {n: f"its NodeGPUUsage does not parse: {v.value}" for n, v in self.reports.items() if isinstance(v.value, str)}
        out.update(self.report_conflicts)
        return out

    def valid_policies(self) -> dict[str, GPUMemoryPolicy]:
        """Policies that parse, by name."""
        return {
            n: v.value for n, v in self.policies.items() if isinstance(v.value, GPUMemoryPolicy)
        }

    def invalid_policies(self) -> dict[str, str]:
        """Policies that do not parse, by name: why (the field and the error).
        They are not dropped: while any is left, every namespace is held in
        DryRun (``policies.merge``)."""
        return {n: v.value for n, v in self.policies.items() if isinstance(v.value, str)}

    def sample_times(self) -> dict[str, datetime | None]:
        """Each node's report sample time (None when it has no status)."""
        out: dict[str, datetime | None] = {}
        for node, rep in self.valid_reports().items():
            out[node] = rep.status.sample_time if rep.status is not None else None
        return out


def _rv_int(rv: str) -> int:
    return int(rv) if rv.isdigit() else 0


def snapshot_of(
    budgets: Mapping[Any, Iterable[Any]],
    pods: Mapping[Any, Iterable[Any]],
    reports: Mapping[Any, Iterable[Any]],
    policies: Mapping[Any, Iterable[Any]],
    namespaces: Mapping[Any, Iterable[Any]],
    gpu_pods: Mapping[Any, Iterable[Any]] | None = None,
    gpu_nodes: Mapping[Any, Iterable[Any]] | None = None,
    claims: Mapping[Any, Iterable[Any]] | None = None,
    slices: Mapping[Any, Iterable[Any]] | None = None,
) -> Snapshot:
    """Copy kopf indexes (key -> store of entries) into a ``Snapshot``.

    Call it on the event loop's thread, where kopf updates the indexes: it does
    not await, so it sees them in one consistent state."""
    snap = Snapshot()
    for ns, store in budgets.items():
        snap.budgets[ns] = list(store)
    for ns, store in pods.items():
        snap.pods[ns] = list(store)
    for node, store in reports.items():
        entries = list(store)
        if entries:
            snap.reports[node] = max(entries, key=lambda v: _rv_int(v.resource_version))
        if len({e.uid for e in entries}) > 1:  # two reports claim one node: neither is believed
            names = sorted(e.value.metadata.name or e.uid if isinstance(e.value, NodeGPUUsage) else e.uid for e in entries)
            snap.report_conflicts[node] = f"{len(names)} NodeGPUUsage objects report this node ({', '.join(names)})"
    for name, store in policies.items():
        for entry in store:
            snap.policies[name] = entry
    for name, store in namespaces.items():
        for entry in store:
            snap.namespaces[name] = entry.value
    for ns, store in (gpu_pods or {}).items():
        snap.gpu_pods[ns] = list(store)
    for name, store in (gpu_nodes or {}).items():
        for entry in store:
            snap.gpu_nodes[name] = entry
    for key, store in (claims or {}).items():
        for entry in store:
            snap.claims[key] = entry
    for store in (slices or {}).values():
        snap.slices.extend(store)
    return snap


# --- evaluation inputs ------------------------------------------------------------------


@dataclass(slots=True)
class Group:
    """Namespaces evaluated together (same effective policy), and their input."""

    policy: EffectivePolicy
    namespaces: list[str]
    input: EngineInput
    current_status: dict[tuple[str, str], dict[str, Any] | None]
    view: policy_inputs.PolicyView | None = None  # ceilings and implicit budgets applied


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
    memory: policy_inputs.PolicyMemory | None = None,
    dra: DRAConfig | None = None,
) -> Plan:
    """Build the engine inputs of one evaluation from a snapshot (``dra``: how
    ResourceSlices name a GPU's UUID and memory; default NVIDIA's), by
    ``policy.groups.engine_groups``, which the fleet simulation calls too."""
    scope = scope_of(snap)
    broken = snap.invalid_policies()
    merged = policy_groups.merged_policies(
        list(snap.valid_policies().values()), snap.namespaces, scope, broken
    )
    reports = snap.valid_reports()
    nodes = policy_groups.node_facts(snap.gpu_nodes, reports)
    pols = namespace_policies(snap.valid_policies(), snap.namespaces, scope, broken)
    invalid = [e for ns in scope for e in snap.budgets.get(ns, ()) if e.value.budget is None]
    # a spec that does not parse: that budget is held (its records kept), the rest of its namespace goes on
    held = {
        (e.value.namespace, e.value.name): HeldBudget(e.uid, C.REASON_INVALID_SPEC, e.value.error or "invalid spec")
        for e in invalid
    }
    allocations = policy_inputs.Allocations(
        claims=snap.claims,
        slices=snap.slices,
        kai_reservations=snap.gpu_pods.get(KAI_RESERVATION_NAMESPACE, []),
        dra=dra or DRAConfig(),
    )
    budgets = {ns: [e.value.budget for e in snap.budgets.get(ns, ()) if e.value.budget is not None] for ns in scope}
    found = policy_groups.engine_groups(
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


