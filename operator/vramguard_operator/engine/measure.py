"""Measurement: node reports as the engine reads them, each pod's measured
usage, and every limit of a budget checked against it (``Measure``).

Pure functions of the reports, the pods, the budget spec and ``now``; no
wording (the leak's figures are kept as numbers and worded by ``messages``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from vramguard_api.budget import LEAK_KINDS, LEAK_MEMORY, GPUMemoryBudgetSpec, LeakMemory, ViolationKind
from vramguard_api.leak import seconds_to_limit
from vramguard_api.limits import DeviceLimit
from vramguard_api.trend import TrendFeatures
from vramguard_api.usage import NodeGPUUsage, PodUsage
from vramguard_operator.engine.inputs import PodFacts
from vramguard_operator.engine.keys import ViolationKey
from vramguard_operator.engine.leak_rule import LeakThresholds, leak_cleared, leak_growth, leak_holds
from vramguard_operator.engine.report_checks import report_problem

DataState = Literal["Fresh", "Stale", "Missing", "Invalid"]


@dataclass(slots=True)
class Node:
    """A node's report as the engine reads it: its state, the pods it measured by
    uid, each device's usable memory (bytes, None when unknown), whether the
    report holds every GPU process on the node, for an ``Invalid`` one why
    its numbers are not believed, and for memory limits (``engine.caps``) the
    devices that report them unsupported (uuid -> why) and whether the agent
    applies them (``enforceCaps``; None: not said)."""

    state: DataState
    report: NodeGPUUsage | None = None
    by_uid: dict[str, PodUsage] = field(default_factory=dict)
    usable: dict[str, int | None] = field(default_factory=dict)
    complete: bool = True
    limits_unsupported: dict[str, str] = field(default_factory=dict)
    enforce_caps: bool | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PodData:
    """One selected, running pod's measured usage in bytes (None: unknown);
    ``devices`` holds ``(uuid, used, usable)`` per device; ``reason``: why its
    node's report is not believed (state ``Invalid``); ``trend`` and ``ram_trend``:
    the trend features of its VRAM and of its RAM working set."""

    pod: PodFacts
    state: DataState
    vram: int | None
    ram: int | None
    devices: tuple[tuple[str, int | None, int | None], ...]
    trend: TrendFeatures | None
    reason: str | None = None
    ram_trend: TrendFeatures | None = None

    def leak_series(self, memory: LeakMemory) -> tuple[TrendFeatures | None, int | None]:
        """The trend features and the current value (bytes) of one memory."""
        return (self.trend, self.vram) if memory == "VRAM" else (self.ram_trend, self.ram)


def read_nodes(
    reports: Mapping[str, NodeGPUUsage],
    now: datetime,
    freshness: float,
    unknown: Mapping[str, str] | None = None,
) -> dict[str, Node]:
    """Each node's report read at ``now``: Missing without a status, Invalid when
    ``unknown`` names the node or its numbers contradict themselves
    (``report_checks``), Stale when its ``sampleTime`` is more than
    ``freshness`` seconds from ``now`` (either way)."""
    out: dict[str, Node] = {name: Node("Invalid", reports.get(name), reason=why) for name, why in (unknown or {}).items()}
    for name, rep in reports.items():
        if name in out:
            continue
        st = rep.status
        if st is None:
            out[name] = Node("Missing")
            continue
        problem = report_problem(st)
        if problem is not None:
            out[name] = Node("Invalid", rep, reason=problem)
            continue
        age = (now - st.sample_time).total_seconds()
        # a sample time further ahead than the bound is clock skew: it cannot be trusted
        if abs(age) > freshness:
            out[name] = Node("Stale", rep)
            continue
        # Complete: every GPU process on the node is in the report. Not so when lists
        # were cut, or a device's processes are not all known or it cannot be read.
        complete = not st.truncated and all(d.processes_complete and d.health == "Healthy" for d in st.devices)
        node = Node("Fresh", rep, complete=complete)
        node.by_uid = {p.uid: p for p in st.pods}
        node.usable = {d.uuid: (d.memory.usable_bytes if d.memory else None) for d in st.devices}
        node.limits_unsupported = {
            d.uuid: f"{d.memory_limits_reason or 'Unsupported'}: {d.memory_limits_message or ''}".rstrip(": ")
            for d in st.devices
            if d.memory_limits == "Unsupported"
        }
        node.enforce_caps = st.agent.enforce_caps if st.agent is not None else None
        out[name] = node
    return out


def pod_data(pod: PodFacts, nodes: Mapping[str, Node]) -> PodData:
    """What the report of ``pod``'s node says about it (see docs/engine.md,
    "Unknown and stale data")."""
    node = nodes.get(pod.node_name or "")
    if node is None:
        return PodData(pod, "Missing", None, None, (), None)
    if node.state != "Fresh":
        return PodData(pod, node.state, None, None, (), None, node.reason)
    usage = node.by_uid.get(pod.uid)
    if usage is None:
        # Every GPU process on the node is in a complete report, attributed or not:
        # a pod absent from it holds no VRAM there. Its RAM is unknown.
        return PodData(pod, "Fresh", 0 if node.complete else None, None, (), None)
    measured = usage.attribution == "Measured"
    devices = tuple((d.uuid, d.used_bytes if measured else None, node.usable.get(d.uuid)) for d in usage.devices)
    return PodData(
        pod,
        "Fresh",
        usage.vram_bytes if measured else None,
        usage.ram_working_set_bytes,
        devices,
        usage.trend if measured else None,
        ram_trend=usage.ram_trend,
    )


@dataclass(frozen=True, slots=True)
class LeakFigures:
    """A leak measurement's figures: growth and its lower bound (bytes per hour),
    the window they cover (seconds), and the projection to the limit of the memory
    the pod runs into (``cap`` bytes, reached in ``seconds_left``; None when not
    projected)."""

    growth: float | None
    low: float | None
    window_seconds: float
    cap: int | None
    seconds_left: float | None


@dataclass(slots=True)
class Measure:
    """One limit checked against one measured value (bytes; for Leak, bytes per hour).

    ``over``/``hard``/``clear``/``pause`` are None when the data cannot tell
    (stale, unknown attribution, a total with an unknown member); ``observed``
    is then None, or a total's partial sum (for display only). ``pod``: the
    measured pod (None for a total). ``projected_evict``: for a Leak with
    ``evictBefore``, when the projected exhaustion makes Evict due.
    Not changed once built (a plain slots class: the engine builds hundreds of
    thousands per evaluation, and a frozen one costs more to build)."""

    key: ViolationKey
    observed: int | None
    limit: int
    over: bool | None
    hard: bool | None
    clear: bool | None
    pause: bool | None
    pod: PodData | None = None
    leak: LeakFigures | None = None
    projected_evict: datetime | None = None


def limit_measure(
    key: ViolationKey, observed: int | None, limit: int, overshoot: float, margin: float, pod: PodData | None
) -> Measure:
    """``observed`` checked against ``limit``: over it, over it by more than the
    ``overshoot`` fraction (hard), at most ``limit × (1 − margin)`` (clear), at
    most the limit (pause: no escalation)."""
    if observed is None:
        return Measure(key, None, limit, None, None, None, None, pod)
    return Measure(
        key,
        observed,
        limit,
        over=observed > limit,
        hard=observed > limit * (1 + overshoot),
        clear=observed <= limit * (1 - margin),
        pause=observed <= limit,
        pod=pod,
    )


def leak_measure(key: ViolationKey, d: PodData, lim: BudgetLimits, now: datetime) -> Measure:
    """The leak rule (``leak_rule``) on the trend features of the memory of
    ``key``'s kind (Leak: VRAM, RAMLeak: RAM working set) with ``lim``'s
    thresholds, and the projection of that memory to its cap (VRAM: see
    ``vram_cap``; RAM: the budget's perPod.ram)."""
    th = lim.leak
    assert th is not None
    limit = int(th.min_growth_bytes_per_hour)
    memory = LEAK_MEMORY[key.kind]
    trend, current = d.leak_series(memory)
    if trend is None or current is None:
        return Measure(key, None, limit, None, None, None, None, d)
    holds = leak_holds(trend, th)
    growth, low = leak_growth(trend, th)  # of the rise the verdict rests on
    observed = None if growth is None else max(0, int(growth))
    cap = vram_cap(lim, d) if memory == "VRAM" else lim.pod_ram
    left = seconds_to_limit(current, cap, growth)
    projected = None
    if left is not None and th.evict_before_seconds is not None:
        projected = now + timedelta(seconds=max(0.0, left - th.evict_before_seconds))
    figures = LeakFigures(growth, low, trend.window_seconds, cap, left)
    over_pause = None if holds is None else not holds
    return Measure(key, observed, limit, holds, holds, leak_cleared(trend, th), over_pause, d, figures, projected)


def vram_cap(lim: BudgetLimits, d: PodData) -> int | None:
    """The VRAM a leaking pod runs into (bytes, on the scale of its total VRAM):
    perPod.vram, else the device limit (named, or perDevice) or the usable
    memory of the device it uses most, shifted by what it uses on its other
    devices."""
    if lim.pod_vram is not None:
        return lim.pod_vram
    if not d.devices:
        return None
    uuid, used, usable = max(d.devices, key=lambda x: x[1] or 0)
    if lim.per_device is not None or uuid in lim.device_limits:
        cap = lim.device_limit(uuid, usable)
        # the projection runs on the pod's total VRAM: shift the device cap by its other devices
        return None if cap is None or d.vram is None else cap + (d.vram - (used or 0))
    if usable is None or d.vram is None:
        return None
    return usable + (d.vram - (used or 0))


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """A budget's limits in numbers, parsed once per evaluation: per-pod VRAM and
    RAM and the totals (bytes, None when unset), the per-device limit, the
    warning threshold, overshoot and recovery margin (fractions), the
    tolerated duration (seconds), the leak thresholds (None: leak detection
    off) and the limits on named devices (bytes by device UUID, replacing
    ``perDevice`` there: ``EngineInput.device_limits``)."""

    pod_vram: int | None
    pod_ram: int | None
    per_device: DeviceLimit | None
    totals: tuple[tuple[ViolationKind, int], ...]
    threshold: float
    overshoot: float
    tolerance_seconds: float
    margin: float
    leak: LeakThresholds | None
    device_limits: Mapping[str, int]

    @classmethod
    def of(cls, spec: GPUMemoryBudgetSpec, margin: float, device_limits: Mapping[str, int]) -> BudgetLimits:
        """Parse ``spec``; raises ``ValueError`` naming the field on a bad leak
        threshold or tolerance duration."""
        ld = spec.leak_detection
        leak = LeakThresholds.of(ld) if ld is not None and ld.enabled else None
        lim = spec.limits
        total = lim.total
        totals: tuple[tuple[ViolationKind, int | None], ...] = (
            () if total is None else (("TotalVRAM", total.vram_bytes()), ("TotalRAM", total.ram_bytes()))
        )
        return cls(
            pod_vram=lim.per_pod.vram_bytes() if lim.per_pod else None,
            pod_ram=lim.per_pod.ram_bytes() if lim.per_pod else None,
            per_device=lim.per_device,
            totals=tuple((kind, limit) for kind, limit in totals if limit is not None),
            threshold=spec.warning_threshold,
            overshoot=spec.tolerance.overshoot_percent / 100,
            tolerance_seconds=spec.tolerance.seconds(),
            margin=margin,
            leak=leak,
            device_limits=device_limits,
        )

    def device_limit(self, uuid: str, usable: int | None) -> int | None:
        """The limit on one device (bytes): a named device limit, else the
        budget's perDevice (None: none, or a fraction of unknown memory)."""
        if uuid in self.device_limits:
            return self.device_limits[uuid]
        return None if self.per_device is None else self.per_device.bytes_for(usable)


def budget_measures(
    lim: BudgetLimits, namespace: str, name: str, data: list[PodData], touched: set[str | None], now: datetime
) -> Iterator[Measure]:
    """Every limit of the budget checked against its running pods (``data``), then
    its totals. Fast path: a pod without state in this budget (not in ``touched``)
    whose value is unknown or below the warning threshold changes nothing, so no
    measurement is built for it. (One loop: this runs for every selected pod of
    every budget, and a generator per pod would cost more than the checks.)"""
    over, margin, thr = lim.overshoot, lim.margin, lim.threshold
    pod_vram, pod_ram, per_device, named = lim.pod_vram, lim.pod_ram, lim.per_device, lim.device_limits
    for d in data:
        pn = d.pod.name
        quiet = pn not in touched
        if pod_vram is not None and not (quiet and below(d.vram, pod_vram, thr)):
            yield limit_measure(ViolationKey(namespace, name, "PodVRAM", pn), d.vram, pod_vram, over, margin, d)
        if pod_ram is not None and not (quiet and below(d.ram, pod_ram, thr)):
            yield limit_measure(ViolationKey(namespace, name, "PodRAM", pn), d.ram, pod_ram, over, margin, d)
        if per_device is not None or named:
            for uuid, used, usable in d.devices:
                limit = lim.device_limit(uuid, usable)
                if limit is None and (per_device is None or uuid in named):
                    continue  # no limit on this device
                if quiet and below(used, limit, thr):
                    continue
                key = ViolationKey(namespace, name, "DeviceVRAM", pn, uuid)
                if limit is None:
                    yield Measure(key, used, 0, None, None, None, None, d)
                else:
                    yield limit_measure(key, used, limit, over, margin, d)
        if lim.leak is not None:
            for memory in lim.leak.memories:
                if not (quiet and None in d.leak_series(memory)):
                    yield leak_measure(ViolationKey(namespace, name, LEAK_KINDS[memory], pn), d, lim, now)
    yield from _total_measures(lim, namespace, name, data)


def below(value: int | None, limit: int | None, threshold: float) -> bool:
    """Whether ``value`` can raise neither a warning nor a violation of ``limit``:
    unknown, no limit, or below ``threshold`` × ``limit`` (the fast path of
    ``budget_measures``, and of ``quiet``)."""
    return value is None or limit is None or value < threshold * limit


def silent(lim: BudgetLimits, d: PodData) -> bool:
    """Whether no limit of a budget (``lim``, without named device limits) can
    measure ``d`` for a pod without state in the budget: every per-pod and
    per-device value takes the fast path, and no leak trend is read."""
    thr = lim.threshold
    if not (below(d.vram, lim.pod_vram, thr) and below(d.ram, lim.pod_ram, thr)):
        return False
    if lim.leak is not None and any(None not in d.leak_series(m) for m in lim.leak.memories):
        return False
    return all(below(used, lim.device_limit(uuid, usable), thr) for uuid, used, usable in d.devices)


def _total_measures(lim: BudgetLimits, namespace: str, name: str, data: list[PodData]) -> Iterator[Measure]:
    """The totals: a sum over the running pods, known only when every member is."""
    for kind, limit in lim.totals:
        values = [d.vram if kind == "TotalVRAM" else d.ram for d in data]
        known = all(v is not None for v in values)
        used = sum(v for v in values if v is not None)
        key = ViolationKey(namespace, name, kind)
        if known:
            yield limit_measure(key, used, limit, lim.overshoot, lim.margin, None)
        else:
            yield Measure(key, used, limit, None, None, None, None)  # partial sum, for display only
