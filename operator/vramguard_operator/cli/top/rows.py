"""The rows of ``vramguard top``: one per GPU pod, with its usage, limits,
trend and state, sorted by pressure (``build_rows``: a ``Snapshot`` in,
``Row``s out; pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from vramguard_api.budget import DEFAULT_WARNING_THRESHOLD, LEAK_MEMORY
from vramguard_api.diagnosis import DiagnosisThresholds
from vramguard_api.ends import ends_of
from vramguard_api.oom import MEMORY_KINDS
from vramguard_api.units import format_bytes, format_seconds
from vramguard_api.usage import MemoryPressure
from vramguard_operator.cli.top.caps import cap_figures, is_capped
from vramguard_operator.cli.top.limits import (
    BudgetView,
    Totals,
    UsageView,
    budget_limits,
    device_label,
    implicit_limits,
    parse_budgets,
    parse_reports,
)
from vramguard_operator.cli.top.model import STATES, DeviceFigure, Limit, Row, Snapshot
from vramguard_operator.engine.diagnosis import PodMeasures, diagnose
from vramguard_operator.engine.oom import finding
from vramguard_operator.engine.records import records_from_annotation
from vramguard_operator.engine.types import ANNOTATION_ORIGINAL_CPU, ANNOTATION_VIOLATIONS
from vramguard_operator.policy.sharers import may_use_gpu

Reasons = tuple[set[str], list[str]]  # states found, and why


def _recorded(annotations: Mapping[str, str], ns: str, name: str) -> tuple[Reasons, set[tuple[str, str, str | None]]]:
    """States and reasons from the pod's ``vramguard.io/violations`` annotation
    (open violations that reached a step), and their (budget, kind, device)."""
    found: set[str] = set()
    why: list[str] = []
    recorded: set[tuple[str, str, str | None]] = set()
    text = annotations.get(ANNOTATION_VIOLATIONS)
    if text:
        records, _ = records_from_annotation(text, ns, name)
        for r in records:
            if r.opened_at is None:
                continue
            recorded.add((r.key.budget, r.key.kind, r.key.device))
            found.add("leak" if r.key.kind in LEAK_MEMORY else "violating")
            why.append(f"{r.key.kind} (budget {r.key.budget}): {r.step or 'open'}")
    return (found, why), recorded


def _from_statuses(
    budgets: Sequence[BudgetView], name: str, recorded: set[tuple[str, str, str | None]]
) -> Reasons:
    """States and reasons from the selecting budgets' status: violations (those
    not already recorded on the pod; pending ones are warnings) and warnings."""
    found: set[str] = set()
    why: list[str] = []
    for b in budgets:
        status = b.model.status
        if status is None:
            continue
        for v in status.violations or ():
            if v.pod not in (None, name) or (b.name, v.kind, v.device) in recorded:
                continue
            if v.opened_at is None:
                found.add("warning")
                why.append(f"{v.kind} (budget {b.name}): pending, within the tolerance")
            else:
                found.add("leak" if v.kind in LEAK_MEMORY else "violating")
                mode = " (dry run)" if v.dry_run or status.effective_mode == "DryRun" else ""
                why.append(f"{v.kind} (budget {b.name}): {v.step or 'open'}{mode}")
        for w in status.warnings or ():
            if w.pod in (None, name):
                found.add("warning")
                why.append(f"{w.kind} (budget {b.name}): above the warning threshold")
    return found, why


def _state(
    pod: Mapping[str, Any],
    budgets: Sequence[BudgetView],
    limits: Sequence[Limit],
    threshold: float,
    capped: bool = False,
) -> tuple[str, tuple[str, ...]]:
    """The pod's state and the reasons for it (see ``STATES``); ``capped``: a
    hard memory limit is asked for or held."""
    meta = pod.get("metadata") or {}
    name = meta.get("name") or ""
    annotations = meta.get("annotations") or {}
    (found, why), recorded = _recorded(annotations, meta.get("namespace") or "", name)
    more, reasons = _from_statuses(budgets, name, recorded)
    found |= more
    why += reasons
    if ANNOTATION_ORIGINAL_CPU in annotations:
        found.add("throttled")
    if capped:
        found.add("capped")
    if not found & {"leak", "violating", "warning"}:
        for lim in limits:
            if lim.ratio is not None and lim.ratio >= threshold:
                found.add("warning")
                why.append(f"{lim.name} at {lim.ratio:.0%} of {format_bytes(lim.limit_bytes)} ({lim.source})")
    state = next((s for s in STATES if s in found), "ok")
    return state, tuple(why)


def _is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    """As the operator's pod watch judges it (``sharers.may_use_gpu``): GPU
    resources, a sharer's annotations, or a ResourceClaim."""
    try:
        return may_use_gpu(pod)
    except (ValueError, TypeError):
        return False


def _selecting(live: Sequence[Mapping[str, Any]], budgets: Mapping[str, list[BudgetView]]) -> dict[str, list[BudgetView]]:
    """The budgets that select each pod, by pod uid (each budget's ``selected``
    filled on the way)."""
    selecting: dict[str, list[BudgetView]] = {}
    for pod in live:
        meta = pod.get("metadata") or {}
        uid, labels = meta.get("uid") or "", meta.get("labels") or {}
        for b in budgets.get(meta.get("namespace") or "", ()):
            if b.matches(labels):
                b.selected.append(uid)
                selecting.setdefault(uid, []).append(b)
    return selecting


def _totals(budgets: Mapping[str, list[BudgetView]], usage: Mapping[str, UsageView]) -> Totals:
    """Each budget's total VRAM and RAM over its selected pods (bytes; None
    when none of them is measured), by (namespace, name)."""
    totals: Totals = {}
    for group in budgets.values():
        for b in group:
            vram = [usage[u].pod.vram_bytes for u in b.selected if u in usage]
            ram = [usage[u].pod.ram_working_set_bytes for u in b.selected if u in usage]
            totals[(b.namespace, b.name)] = (
                sum(v for v in vram if v is not None) if vram else None,
                sum(r for r in ram if r is not None) if ram else None,
            )
    return totals


def _row(
    pod: Mapping[str, Any], u: UsageView | None, mine: Sequence[BudgetView], totals: Totals, fresh_nodes: set[str]
) -> Row:
    """The row of one pod: ``u`` its usage, ``mine`` the budgets selecting it."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    limits: list[Limit] = []
    for b in mine:
        limits.extend(budget_limits(b, u, totals))
    # the implicit budget's (an allocation: budget beside the selecting ones)
    limits.extend(implicit_limits(meta.get("annotations") or {}, u))
    threshold = min((b.threshold for b in mine), default=DEFAULT_WARNING_THRESHOLD)
    caps = cap_figures(meta.get("annotations") or {}, u)
    state, why = _state(pod, mine, limits, threshold, is_capped(caps))
    ratios = [lim.ratio for lim in limits if lim.ratio is not None]
    trend = u.pod.trend if u is not None else None
    node = spec.get("nodeName")
    devices = () if u is None else tuple(
        DeviceFigure(device_label(u.devices.get(d.uuid)), d.uuid, d.used_bytes) for d in u.pod.devices
    )
    return Row(
        namespace=meta.get("namespace") or "",
        pod=meta.get("name") or "",
        node=node,
        vram_bytes=u.pod.vram_bytes if u is not None else None,
        devices=devices,
        ram_bytes=u.pod.ram_working_set_bytes if u is not None else None,
        limits=tuple(limits),
        growth_bytes_per_hour=trend.growth_bytes_per_hour if trend is not None else None,
        trend_leak=trend.leak if trend is not None else None,
        state=state,
        why=why,
        pressure=max(ratios) if ratios else None,
        stale=node not in fresh_nodes,
        caps=caps,
        diagnosis=_diagnosis(u, limits),
        swap_bytes=u.pod.swap_bytes if u is not None else None,
        ram_pressure=_some_avg10(u.pod.memory_pressure) if u is not None else None,
    )


def _diagnosis(u: UsageView | None, limits: Sequence[Limit]) -> str | None:
    """The pod's diagnosis (``engine.diagnosis``) from its report and its lowest
    per-pod VRAM and RAM limits, at the policy's default thresholds; the leaks
    are the agent's verdicts at the default leak thresholds."""
    if u is None:
        return None
    p = u.pod

    def lowest(name: str) -> int | None:
        return min((lim.limit_bytes for lim in limits if lim.name == name), default=None)

    devices = []
    for d in p.devices:
        gpu = u.devices.get(d.uuid)
        devices.append((d.used_bytes, gpu.memory.usable_bytes if gpu is not None and gpu.memory else None))
    measures = PodMeasures(
        vram_bytes=p.vram_bytes,
        vram_limit_bytes=lowest("pod"),
        devices=tuple(devices),
        ram_bytes=p.ram_working_set_bytes,
        ram_limit_bytes=lowest("ram"),
        vram_leak=p.trend.leak if p.trend is not None else None,
        ram_leak=p.ram_trend.leak if p.ram_trend is not None else None,
    )
    found = diagnose(measures, _DEFAULTS)
    return None if found is None else found.diagnosis


_DEFAULTS = DiagnosisThresholds()


def _some_avg10(psi: MemoryPressure | None) -> float | None:
    """The share of the last 10 s some task waited for memory, percent (PSI)."""
    return psi.some.avg10 if psi is not None and psi.some is not None else None


def build_rows(snap: Snapshot) -> tuple[list[Row], list[str]]:
    """The table's rows, sorted by pressure, and notes about what could not be
    read. A row for each pod that is not finished and is measured in a node
    report, requests a GPU resource, or is selected by a budget."""
    usage, fresh_nodes, notes = parse_reports(snap)
    budgets = parse_budgets(snap, notes)
    live = [p for p in snap.pods if ((p.get("status") or {}).get("phase")) not in ("Succeeded", "Failed")]
    selecting = _selecting(live, budgets)
    totals = _totals(budgets, usage)
    ooms = last_ooms(snap)
    rows = []
    for pod in live:
        uid = (pod.get("metadata") or {}).get("uid") or ""
        u, mine = usage.get(uid), selecting.get(uid, [])
        if u is None and not mine and not _is_gpu_pod(pod):
            continue
        rows.append(replace(_row(pod, u, mine, totals, fresh_nodes), last_oom=ooms.get(uid)))
    rows.sort(key=Row.sort_key)
    return rows, [*snap.notes, *notes]


def last_ooms(snap: Snapshot) -> dict[str, str]:
    """Each pod's latest OOM in the reports' end records (docs/oom.md): its kind
    and how long ago, by pod uid. The verdict needs the devices' shares:
    ``vramguard oom`` gives it."""
    pods = {(p.get("metadata") or {}).get("uid"): p for p in snap.pods}
    latest: dict[str, tuple[datetime, str]] = {}
    for report in snap.reports:
        for record in ends_of(report):
            kind = finding(record, pods.get(record.pod_uid), {}).verdict.kind
            seen = latest.get(record.pod_uid)
            if kind in MEMORY_KINDS and (seen is None or record.time > seen[0]):
                latest[record.pod_uid] = (record.time, kind)
    return {uid: f"{kind} {format_seconds(max(0.0, (snap.now - t).total_seconds()))} ago"
            for uid, (t, kind) in latest.items()}
