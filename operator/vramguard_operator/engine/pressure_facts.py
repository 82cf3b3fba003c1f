"""The facts the device-pressure rule (``pressure.decide``) reads, built from one
evaluation after its budgets (docs/device-pressure.md, "Shares and rules").

For each device of a fresh node report with a pod of the evaluation on it:

- usable and used memory from the report's device entry; the device is
  *known* only when the report is complete (not truncated), the device
  healthy with every process known (``processesComplete``), no unattributed
  process on it, and every pod on it attributed and measured there;
- each pod of the evaluation on it (pods the report lists that are not in the
  evaluation are neither protected nor acted on here): what it holds there;
  its **share** there, the strictest per-device limit of the budgets that
  select it (``perDevice``, or a limit on that named device: a DRA claim's or
  a sharer's grant; implicit budgets included), else the node's share of the
  device (``EngineInput.device_shares``), unknown while a budget of its
  namespace is held (an invalid spec: which pods it selects is not known);
  its **rule**, the ``devicePressure``
  of the budgets that select it (the most protective, when several do), else
  its namespace's (``EngineInput.pressure_rules``); its mode (``Exempt`` in an
  exempt namespace; ``DryRun`` when the cluster policy or any budget that
  selects it is in DryRun); whether it is leaving (terminating, finished, or
  evicted by a budget earlier in this evaluation); the budget whose status
  records what the rule does to it (the one that set its share, else the
  first that selects it); and whether it was the device's chosen pod at the
  last evaluation (from that budget's status).

Shares are worked out for the devices whose data can be acted on (a device's
threshold may be the room a pod within its share needs to reach it), in one
pass over the budgets' selections.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vramguard_api.budget import GPUMemoryBudget, Violation, ViolationKind
from vramguard_api.steps import Action
from vramguard_api.usage import DeviceUsage, GPUDevice, NodeGPUUsageStatus, PodUsage
from vramguard_operator.engine.inputs import EngineInput, PodFacts
from vramguard_operator.engine.keys import BudgetRef
from vramguard_operator.engine.measure import Node
from vramguard_operator.engine.pressure import DeviceFacts, Occupant, OccupantMode, PressureRule
from vramguard_operator.engine.work import Selection

KIND: ViolationKind = "DevicePressure"
_DONE = ("Succeeded", "Failed")

PreviousKey = tuple[str, str, str]
"""(namespace, pod name, device UUID) of a status entry of kind DevicePressure."""


@dataclass(frozen=True, slots=True)
class Previous:
    """A DevicePressure entry of a budget's status, as the last evaluation left it."""

    budget: BudgetRef
    entry: Violation


def previous_entries(inp: EngineInput) -> dict[PreviousKey, Previous]:
    """The DevicePressure entries of the given budgets' statuses, by (namespace,
    pod, device)."""
    out: dict[PreviousKey, Previous] = {}
    for b in inp.budgets:
        st = b.status
        if st is None or not st.violations:
            continue
        meta = b.metadata
        ref = BudgetRef(meta.namespace or "", meta.name or "", meta.uid or "")
        for v in st.violations:
            if v.kind == KIND and v.pod and v.device:
                out.setdefault((ref.namespace, v.pod, v.device), Previous(ref, v))
    return out


def budget_rule(budget: GPUMemoryBudget, source: str) -> PressureRule | None:
    """A budget's own ``devicePressure`` as a rule from ``source`` (None when unset)."""
    dp = budget.spec.device_pressure
    if dp is None:
        return None
    return PressureRule(dp.min_free_fraction(), dp.min_free_bytes(), dp.action, source, dp.protect_shares)


@dataclass(slots=True)
class _Context:
    """What every device of one evaluation shares."""

    inp: EngineInput
    pods: Mapping[str, PodFacts]
    evicting: frozenset[str]
    overrides: Mapping[str, PressureRule]  # pod uid -> its budgets' rule
    previous: Mapping[PreviousKey, Previous]
    selections: Sequence[Selection]
    held_namespaces: frozenset[str] = frozenset()

    def rule(self, pod: PodFacts) -> PressureRule | None:
        found = self.overrides.get(pod.uid)
        return found if found is not None else self.inp.pressure_rules.get(pod.namespace)

    def leaving(self, pod: PodFacts) -> bool:
        return pod.terminating or pod.phase in _DONE or pod.uid in self.evicting

    def budgets_of(self, uids: set[str]) -> dict[str, list[Selection]]:
        """The selections of each pod in ``uids`` (one pass over the budgets)."""
        out: dict[str, list[Selection]] = defaultdict(list)
        for sel in self.selections:
            for p in sel.matched:
                if p.uid in uids:
                    out[p.uid].append(sel)
        return out


def device_facts(
    inp: EngineInput,
    nodes: Mapping[str, Node],
    selections: Sequence[Selection],
    evicting: Iterable[str],
    held_namespaces: frozenset[str] = frozenset(),
) -> list[DeviceFacts]:
    """The facts of every device with a pod of ``inp`` on it and a rule that
    applies to one of its pods, in node and device order (see the module doc).
    ``selections``: the valid budgets as evaluated; ``evicting``: pods a
    budget's Evict was returned for in this evaluation; ``held_namespaces``:
    namespaces with a held budget (which pods it selects, and so their
    shares, is not known: the share of their pods is left unknown)."""
    overrides = _overrides(selections)
    if not inp.pressure_rules and not overrides:
        return []
    pods = {p.uid: p for p in inp.pods}
    ctx = _Context(inp, pods, frozenset(evicting), overrides, previous_entries(inp), selections, held_namespaces)
    drafts = [d for name in sorted(nodes) for d in _node_drafts(ctx, name, nodes[name])]
    known = {o.pod.uid for d in drafts if d.known for o in d.occupants}
    if not known:
        return drafts
    by_pod = ctx.budgets_of(known)
    return [_with_shares(ctx, d, by_pod) if d.known else d for d in drafts]


def _overrides(selections: Sequence[Selection]) -> dict[str, PressureRule]:
    found: dict[str, list[PressureRule]] = defaultdict(list)
    for sel in selections:
        rule = budget_rule(sel.budget, f"budget {sel.ref.namespace}/{sel.ref.name}")
        if rule is not None:
            for p in sel.matched:
                found[p.uid].append(rule)
    return {uid: r for uid, rules in found.items() if (r := PressureRule.combine(rules)) is not None}


def _node_drafts(ctx: _Context, name: str, node: Node) -> list[DeviceFacts]:
    """The devices of one fresh node, with their occupants' rules but no shares yet."""
    if node.state != "Fresh" or node.report is None or node.report.status is None:
        return []
    st = node.report.status
    on = device_entries(st)
    unattributed = {u.device for u in st.unattributed}
    out = []
    for dev in st.devices:
        entries = on.get(dev.uuid, [])
        occupants = tuple(
            _draft(ctx, ctx.pods[pu.uid], pu, du) for pu, du in entries if pu.uid in ctx.pods
        )
        if not any(o.rule is not None and o.mode != "Exempt" for o in occupants):
            continue
        why = unknown_reason(st, dev, entries, dev.uuid in unattributed)
        usable = dev.memory.usable_bytes if dev.memory is not None else None
        used = dev.memory.used_bytes if dev.memory is not None else None
        out.append(DeviceFacts(dev.uuid, name, usable, used, not why, occupants, why))
    return out


def device_entries(st: NodeGPUUsageStatus) -> dict[str, list[tuple[PodUsage, DeviceUsage]]]:
    """The report's pod entries on each device, by device UUID."""
    on: dict[str, list[tuple[PodUsage, DeviceUsage]]] = defaultdict(list)
    for pu in st.pods:
        for du in pu.devices:
            on[du.uuid].append((pu, du))
    return on


def unknown_reason(
    st: NodeGPUUsageStatus, dev: GPUDevice, entries: list[tuple[PodUsage, DeviceUsage]], unattributed: bool
) -> str:
    """Why the device's data cannot be acted on ("" when it can): ``entries``,
    the report's pods on it (``device_entries``); ``unattributed``, whether a
    process on it belongs to no known pod."""
    if st.truncated:
        return "the node report is truncated"
    if dev.health != "Healthy":
        return f"the device is {dev.health}"
    if dev.memory is None or dev.memory.used_bytes is None:
        return "the device's memory could not be read"
    if not dev.processes_complete:
        return "not every process on the device is known"
    if unattributed:
        return "a process on the device belongs to no known pod"
    for pu, du in entries:
        if pu.attribution != "Measured" or du.used_bytes is None:
            return f"the memory of pod {pu.name or pu.uid} on the device is unknown"
    return ""


def _draft(ctx: _Context, pod: PodFacts, pu: PodUsage, du: DeviceUsage) -> Occupant:
    exempt = pod.namespace in ctx.inp.policy.exempt_namespaces
    mode: OccupantMode = "Exempt" if exempt else "Enforce"
    used = du.used_bytes if pu.attribution == "Measured" else None
    return Occupant(pod.ref, used, None, ctx.rule(pod), mode, ctx.leaving(pod))


def _with_shares(ctx: _Context, d: DeviceFacts, by_pod: Mapping[str, list[Selection]]) -> DeviceFacts:
    """``d`` with each occupant's share, mode, budget and previous choice."""
    occupants = tuple(_full(ctx, o, by_pod.get(o.pod.uid, []), d) for o in d.occupants)
    return DeviceFacts(d.uuid, d.node, d.usable, d.used, d.known, occupants, d.unknown_reason)


def _full(ctx: _Context, o: Occupant, sels: list[Selection], d: DeviceFacts) -> Occupant:
    share, home = None, None
    if o.pod.namespace in ctx.held_namespaces:
        # A held budget may give this pod a larger share than the node's: no
        # action on unknown data, so the pod is neither chosen nor protected.
        home = sels[0].ref if sels else None
        return Occupant(o.pod, o.used, None, o.rule, o.mode, o.leaving, home, False)
    for sel in sels:
        limit = sel.limits.device_limit(d.uuid, d.usable) if _limits_device(sel, d.uuid) else None
        if limit is not None and (share is None or limit < share):
            share, home = limit, sel.ref
    if share is None:
        share = ctx.inp.device_shares.get(d.uuid)
        home = sels[0].ref if sels else None
    mode = o.mode
    if mode == "Enforce" and (
        ctx.inp.policy.mode == "DryRun" or any(s.budget.spec.enforcement.mode == "DryRun" for s in sels)
    ):
        mode = "DryRun"
    prev = ctx.previous.get((o.pod.namespace, o.pod.name, d.uuid))
    chosen = prev is not None and prev.entry.step == Action.EVICT and (prev.entry.dry_run or False) == (mode == "DryRun")
    return Occupant(o.pod, o.used, share, o.rule, mode, o.leaving, home, chosen)


def _limits_device(sel: Selection, uuid: str) -> bool:
    """Whether the budget sets a limit on the device (``perDevice``, or a limit on it by name)."""
    return sel.limits.per_device is not None or uuid in sel.limits.device_limits
