"""The devices of ``vramguard top`` under a device-pressure rule: free memory,
the free memory the rule keeps, and what vramguard does about it (pure;
docs/device-pressure.md).

For each device of a node report that holds a pod of the snapshot, the rule
of its pods (a selecting budget's ``devicePressure``, else the namespace's
policies', merged as the operator merges them); the largest threshold of them
applies, or the room a pod within its share needs to reach it when larger
(its share as ``vramguard top`` reads it: the smallest per-device limit of its
row; a pod without one counts no room). The action comes from the selecting budgets' DevicePressure status
entries (a pod no budget selects shows none) and from pods terminating on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import GPUDevice, NodeGPUUsageStatus, PodUsage
from vramguard_operator.cli.top.limits import BudgetView, device_label, namespace_labels, parse_budgets, parse_policies
from vramguard_operator.cli.top.model import Row, Snapshot
from vramguard_operator.engine.pressure_facts import budget_rule, device_entries, unknown_reason
from vramguard_operator.engine.types import PressureRule
from vramguard_operator.plan.entries import report_entry, report_node
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.pressure import namespace_rule


@dataclass(frozen=True)
class DeviceRow:
    """One device under a rule. ``min_free_bytes``: the free memory the rule
    keeps there (``rule`` says which). ``state``: ``pressure`` (free under the
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


def build_devices(snap: Snapshot, rows: Sequence[Row] = ()) -> list[DeviceRow]:
    """The devices of the snapshot's pods that a device-pressure rule applies to,
    pressure first, then by node and label. ``rows``: the pod rows
    (``build_rows``), whose per-device limits give the pods' shares (for the
    room a pod within its share needs to reach it)."""
    notes: list[str] = []
    policies = parse_policies(snap, notes)
    budgets = parse_budgets(snap, notes, policies)
    pods = {(p.get("metadata") or {}).get("uid") or "": p for p in snap.pods}
    shares = {(r.namespace, r.pod): min((x.limit_bytes for x in r.limits if x.name == "dev"), default=None)
              for r in rows}
    reader = _Device(snap, budgets, policies, shares, pods)
    out = []
    for body in snap.reports:
        entry = report_entry(body).value
        if isinstance(entry, str) or entry.status is None:
            continue
        fresh = (snap.now - entry.status.sample_time).total_seconds() <= snap.freshness_s
        for d in entry.status.devices:
            row = reader.row(report_node(body), entry.status, d, fresh)
            if row is not None:
                out.append(row)
    order = {"pressure": 0, "unknown": 1, "stale": 2, "ok": 3}
    return sorted(out, key=lambda r: (order[r.state], r.node, r.label))


@dataclass(frozen=True)
class _Device:
    """What every device's row reads."""

    snap: Snapshot
    budgets: Mapping[str, list[BudgetView]]
    policies: Sequence[GPUMemoryPolicy]
    shares: Mapping[tuple[str, str], int | None]
    pods: Mapping[str, Mapping[str, Any]]

    def row(self, node: str, st: NodeGPUUsageStatus, d: GPUDevice, fresh: bool) -> DeviceRow | None:
        on = [p for p in st.pods if p.uid in self.pods and any(x.uuid == d.uuid for x in p.devices)]
        if not on or d.memory is None:
            return None
        usable = d.memory.usable_bytes
        rules: list[PressureRule] = []
        names, actions, rooms = [], [], []
        for p in on:
            meta = self.pods[p.uid].get("metadata") or {}
            ns, name, labels = meta.get("namespace") or "", meta.get("name") or "", meta.get("labels") or {}
            names.append(name)
            mine = [b for b in self.budgets.get(ns, ()) if b.matches(labels)]
            rule = _rule(self.snap, ns, mine, self.policies)
            if rule is not None:
                rules.append(rule)
                rooms.append((self._room(rule, ns, name, p, d.uuid, meta), name))
            actions += _actions(mine, name, d.uuid, meta.get("deletionTimestamp") is not None)
        if not rules:
            return None
        best = max(rules, key=lambda r: r.min_free(usable))
        threshold, text = best.min_free(usable), f"{best.text()} ({best.source})"
        room, needy = max(rooms)
        if room > threshold:
            threshold, text = room, f"{text}; room for {needy}"
        used = d.memory.used_bytes
        free = None if used is None else max(0, usable - used)
        on_it = device_entries(st).get(d.uuid, [])
        why = unknown_reason(st, d, on_it, any(u.device == d.uuid for u in st.unattributed))
        state = "stale" if not fresh else "unknown" if why or free is None else "pressure" if free < threshold else "ok"
        return DeviceRow(node, device_label(d), d.uuid, free, threshold, text, tuple(sorted(names)), state,
                         "; ".join(actions) or "-")

    def _room(self, rule: PressureRule, ns: str, name: str, p: PodUsage, uuid: str, meta: Mapping[str, Any]) -> int:
        """What a pod within its share needs to reach it (0: unprotected, above it, leaving, or unknown)."""
        share = self.shares.get((ns, name))
        used = next((x.used_bytes for x in p.devices if x.uuid == uuid), None)
        if not rule.protect_shares or share is None or used is None or meta.get("deletionTimestamp"):
            return 0
        return max(0, share - used)


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

