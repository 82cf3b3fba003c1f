"""The devices of ``vramguard top`` under a device-pressure rule: free memory,
the free memory the rule keeps, and what vramguard does about it (pure;
docs/device-pressure.md).

For each device of a node report that holds a pod of the snapshot, the rule
of its pods (a selecting budget's ``devicePressure``, else the namespace's
policies', merged as the operator merges them); the largest threshold of them
applies. The action comes from the selecting budgets' DevicePressure status
entries (a pod no budget selects shows none) and from pods terminating on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import GPUDevice, NodeGPUUsageStatus
from vramguard_operator.cli.top.limits import BudgetView, device_label, namespace_labels, parse_budgets, parse_policies
from vramguard_operator.cli.top.model import Snapshot
from vramguard_operator.controller.indexes import report_entry, report_node
from vramguard_operator.engine.pressure_facts import budget_rule, device_entries, unknown_reason
from vramguard_operator.engine.types import PressureRule
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.pressure import namespace_rule


@dataclass(frozen=True)
class DeviceRow:
    """One device under a rule. ``state``: ``pressure`` (free under the
    minimum), ``ok``, ``unknown`` (the report cannot tell: vramguard does
    nothing there) or ``stale``; ``action``: what vramguard does (``evicting
    <pod>``, ``would evict <pod>``, ``waiting for <pod>``) or ``-``."""

    node: str
    label: str
    uuid: str
    free_bytes: int | None
    min_free_bytes: int
    rule: str
    pods: tuple[str, ...]
    state: str
    action: str


def build_devices(snap: Snapshot) -> list[DeviceRow]:
    """The devices of the snapshot's pods that a device-pressure rule applies to,
    pressure first, then by node and label."""
    notes: list[str] = []
    policies = parse_policies(snap, notes)
    budgets = parse_budgets(snap, notes, policies)
    pods = {(p.get("metadata") or {}).get("uid") or "": p for p in snap.pods}
    out = []
    for body in snap.reports:
        entry = report_entry(body).value
        if isinstance(entry, str) or entry.status is None:
            continue
        fresh = (snap.now - entry.status.sample_time).total_seconds() <= snap.freshness_s
        for d in entry.status.devices:
            row = _device(snap, report_node(body), entry.status, d, fresh, pods, budgets, policies)
            if row is not None:
                out.append(row)
    order = {"pressure": 0, "unknown": 1, "stale": 2, "ok": 3}
    return sorted(out, key=lambda r: (order[r.state], r.node, r.label))


def _device(
    snap: Snapshot,
    node: str,
    st: NodeGPUUsageStatus,
    d: GPUDevice,
    fresh: bool,
    pods: Mapping[str, Mapping[str, object]],
    budgets: Mapping[str, list[BudgetView]],
    policies: Sequence[GPUMemoryPolicy],
) -> DeviceRow | None:
    on = [p for p in st.pods if p.uid in pods and any(x.uuid == d.uuid for x in p.devices)]
    if not on or d.memory is None:
        return None
    rules: list[PressureRule] = []
    names, actions = [], []
    for p in on:
        meta = pods[p.uid].get("metadata") or {}
        assert isinstance(meta, Mapping)
        ns, name, labels = meta.get("namespace") or "", meta.get("name") or "", meta.get("labels") or {}
        names.append(str(name))
        mine = [b for b in budgets.get(str(ns), ()) if b.matches(labels)]
        rule = _rule(snap, str(ns), mine, policies)
        if rule is not None:
            rules.append(rule)
        actions += _actions(mine, str(name), d.uuid, meta.get("deletionTimestamp") is not None)
    if not rules:
        return None
    usable = d.memory.usable_bytes
    best = max(rules, key=lambda r: r.min_free(usable))
    used = d.memory.used_bytes
    free = None if used is None else max(0, usable - used)
    why = unknown_reason(st, d, device_entries(st).get(d.uuid, []), any(u.device == d.uuid for u in st.unattributed))
    state = "stale" if not fresh else "unknown" if why or free is None else "pressure" if free < best.min_free(usable) else "ok"
    return DeviceRow(
        node, device_label(d), d.uuid, free, best.min_free(usable), f"{best.text()} ({best.source})",
        tuple(sorted(names)), state, "; ".join(actions) or "-",
    )


def _rule(
    snap: Snapshot, ns: str, mine: Sequence[BudgetView], policies: Sequence[GPUMemoryPolicy]
) -> PressureRule | None:
    """A pod's rule: its budgets' devicePressure, else its namespace's."""
    found = PressureRule.combine(r for b in mine if (r := budget_rule(b.model, f"gmb/{b.name}")) is not None)
    return found if found is not None else namespace_rule(merge(policies, ns, namespace_labels(snap, ns)))


def _actions(mine: Sequence[BudgetView], pod: str, uuid: str, terminating: bool) -> list[str]:
    for b in mine:
        for v in (b.model.status.violations if b.model.status else None) or ():
            if v.kind == "DevicePressure" and v.pod == pod and v.device == uuid:
                if terminating:
                    return [f"waiting for {pod}"]
                return [f"would evict {pod}" if v.dry_run else f"evicting {pod}"]
    return [f"waiting for {pod}"] if terminating else []

