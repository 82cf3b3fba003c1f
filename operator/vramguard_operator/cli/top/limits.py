"""The limits of each pod in ``vramguard top``, read from the node reports,
the budgets (lowered by the GPUMemoryPolicy ceilings exactly as the operator
lowers them, ``ceilings.effective_budget``) and, for a pod no budget selects,
the ``vramguard.io/limits`` annotation. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import GPUDevice, PodUsage
from vramguard_operator.cli.top.model import LIMIT_NAMES, Limit, Snapshot
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.plan.entries import budget_entry, policy_entry, report_entry, report_node
from vramguard_operator.policy.ceilings import effective_budget
from vramguard_operator.policy.implicit import read_limits
from vramguard_operator.policy.merge import merge

Totals = dict[tuple[str, str], tuple[int | None, int | None]]
"""Each budget's total (VRAM, RAM) bytes over its selected pods, by (namespace, name)."""


@dataclass
class BudgetView:
    """A budget as ``top`` reads it: its model with the effective (ceiling-
    lowered) limits, each limit's source, its selector, warning threshold and
    the uids of the pods it selects."""

    name: str
    namespace: str
    model: GPUMemoryBudget  # with the effective (ceiling-lowered) limits
    sources: dict[str, str]
    matches: Any
    threshold: float
    selected: list[str] = field(default_factory=list)  # pod uids


@dataclass(frozen=True)
class UsageView:
    """A pod's usage in its node's report, the report's devices by uuid, and
    whether the report is fresh."""

    pod: PodUsage
    node: str
    devices: Mapping[str, GPUDevice]
    fresh: bool


def parse_reports(snap: Snapshot) -> tuple[dict[str, UsageView], set[str], list[str]]:
    """Pod usage by uid, the nodes with a fresh report, and problems."""
    usage: dict[str, UsageView] = {}
    fresh_nodes: set[str] = set()
    notes: list[str] = []
    for body in snap.reports:
        entry = report_entry(body).value
        if isinstance(entry, str):
            notes.append(entry)
            continue
        node, status = report_node(body), entry.status
        if status is None:
            continue
        age = (snap.now - status.sample_time).total_seconds()
        fresh = age <= snap.freshness_s
        if fresh:
            fresh_nodes.add(node)
        devices = {d.uuid: d for d in status.devices}
        for p in status.pods:
            usage[p.uid] = UsageView(p, node, devices, fresh)
    return usage, fresh_nodes, notes


def parse_policies(snap: Snapshot, notes: list[str]) -> list[GPUMemoryPolicy]:
    """The policies that parse; what does not is added to ``notes``."""
    policies: list[GPUMemoryPolicy] = []
    for body in snap.policies:
        p = policy_entry(body).value
        if isinstance(p, str):
            notes.append(p)
        else:
            policies.append(p)
    return policies


def namespace_labels(snap: Snapshot, ns: str) -> dict[str, str]:
    """A namespace's labels, with the one the API server sets on every namespace."""
    return {"kubernetes.io/metadata.name": ns, **snap.namespace_labels.get(ns, {})}


def parse_budgets(
    snap: Snapshot, notes: list[str], policies: list[GPUMemoryPolicy] | None = None
) -> dict[str, list[BudgetView]]:
    """The budgets that parse, by namespace, with the policies' ceilings
    applied (``policies``: those that parse, read here when not given); what
    does not parse is added to ``notes``."""
    if policies is None:
        policies = parse_policies(snap, notes)
    out: dict[str, list[BudgetView]] = {}
    for body in snap.budgets:
        entry = budget_entry(body).value
        if entry.budget is None:
            notes.append(entry.error or f"GPUMemoryBudget {entry.namespace}/{entry.name}: does not parse")
            continue
        ns = entry.namespace
        labels = namespace_labels(snap, ns)
        try:
            matcher = compile_selector(entry.budget.spec.selector)
            model, sources = effective_budget(entry.budget, merge(policies, ns, labels))
        except ValueError as err:
            notes.append(f"GPUMemoryBudget {ns}/{entry.name}: {err}")
            continue
        named = {k: f"gmb/{entry.name}" if v == "budget" else v for k, v in sources.items()}
        threshold = entry.budget.spec.warning_threshold
        out.setdefault(ns, []).append(BudgetView(entry.name, ns, model, named, matcher, threshold))
    return out


def device_label(d: GPUDevice | None) -> str:
    """``gpu<index>``, ``gpu<index>/<MIG profile>``, ``gpu?`` when unknown."""
    if d is None:
        return "gpu?"
    return f"gpu{d.index}/{d.mig_profile}" if d.mig_profile else f"gpu{d.index}"


def _usable(d: GPUDevice | None) -> int | None:
    return None if d is None or d.memory is None else d.memory.usable_bytes


def budget_limits(b: BudgetView, u: UsageView | None, totals: Totals) -> list[Limit]:
    """The limits budget ``b`` sets on a pod with usage ``u`` (None: not
    measured): per device (on the device where the ratio is highest), per pod
    and the budget's totals (``totals``: by (namespace, name))."""
    lim = b.model.spec.limits
    out: list[Limit] = []
    if lim.per_device is not None:
        best: Limit | None = None
        devices = u.pod.devices if u is not None else []
        for dev in devices:
            cap = lim.per_device.bytes_for(_usable(u.devices.get(dev.uuid) if u else None))
            if cap is None:
                continue
            cand = Limit("dev", cap, dev.used_bytes, b.sources.get("perDevice", f"gmb/{b.name}"))
            if best is None or (cand.ratio or 0) > (best.ratio or 0):
                best = cand
        if best is None:
            fixed = lim.per_device.bytes_for(None)
            if fixed is not None:
                best = Limit("dev", fixed, None, b.sources.get("perDevice", f"gmb/{b.name}"))
        if best is not None:
            out.append(best)
    vram = u.pod.vram_bytes if u is not None else None
    ram = u.pod.ram_working_set_bytes if u is not None else None
    for path, mem, kind, used in (
        ("perPod.vram", lim.per_pod, "vram", vram),
        ("perPod.ram", lim.per_pod, "ram", ram),
        ("total.vram", lim.total, "vram", totals[(b.namespace, b.name)][0]),
        ("total.ram", lim.total, "ram", totals[(b.namespace, b.name)][1]),
    ):
        if mem is None:
            continue
        value = mem.vram_bytes() if kind == "vram" else mem.ram_bytes()
        if value is not None:
            out.append(Limit(LIMIT_NAMES[path], value, used, b.sources.get(path, f"gmb/{b.name}")))
    return out


def implicit_limits(annotations: Mapping[str, str], u: UsageView | None) -> list[Limit]:
    """The limits of a pod's implicit budget (no budget selects it, or something
    booked its memory), from its ``vramguard.io/limits`` annotation, compared
    with its usage ``u``; a limit on one device (``perDevice[<uuid>]``, from a
    DRA claim or a sharer's grant) with that device's usage."""
    out: list[Limit] = []
    for path, entry in sorted(read_limits(annotations).items()):
        uuid = path[len("perDevice[") : -1] if path.startswith("perDevice[") and path.endswith("]") else None
        if (path not in LIMIT_NAMES and uuid is None) or not isinstance(entry, Mapping):
            continue
        try:
            value = int(entry["bytes"])
        except (KeyError, TypeError, ValueError):
            continue
        source = str(entry.get("source") or "policy")
        out.append(Limit(LIMIT_NAMES["perDevice" if uuid else path], value, _implicit_used(path, uuid, u), source))
    return out


def _implicit_used(path: str, uuid: str | None, u: UsageView | None) -> int | None:
    """The usage an implicit limit is compared with (None: unknown)."""
    if u is None:
        return None
    if uuid is not None:
        on = [d.used_bytes for d in u.pod.devices if d.uuid == uuid]
        return on[0] if on else 0  # a device the pod does not use (yet) holds nothing of it
    if path == "perDevice":
        known = [d.used_bytes for d in u.pod.devices if d.used_bytes is not None]
        return max(known) if known else (0 if not u.pod.devices and u.pod.vram_bytes == 0 else None)
    if path == "perPod.vram":
        return u.pod.vram_bytes
    return u.pod.ram_working_set_bytes

