"""Checks of a node report before its numbers are believed.

A NodeGPUUsage that passed the API's schema can still contradict itself: a
faulty or compromised agent (or a second object claiming the node) can say a
pod holds more VRAM than the node has, list a pod or a device twice (and then
whichever entry is read last would win), give a device no usable memory (a
fraction limit of it is then zero, and every pod violates), or say a device
uses less than the pods on it. Such a report marks its node's data unknown:
nothing is decided on it (as for a stale report), and the reason goes to the
budgets' ``DataStale`` condition and to an Event on the report
(docs/engine.md, "Unknown and stale data").

``RULES`` is the one table of what a report must satisfy: each rule has a
name (given in the message, so an operator reading the condition knows which
one broke) and a check returning why the report breaks it, or None. The
agent's own reports satisfy every rule: it sums a pod's integer device figures
into ``vramBytes`` without rounding (``vramguard_agent.aggregation.PodVRAM``),
and reads each device's memory before listing processes on it.

A report naming pod uids that are not pods on its node is not contradicting
itself (a pod may have been deleted between the agent's read and ours):
``unknown_pods`` says so, for a warning; the report is still believed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple

from vramguard_api.units import format_bytes
from vramguard_api.usage import DeviceMemory, NodeGPUUsageStatus, PodUsage

MIN_USED_SLACK = 512 << 20
"""Least slack (bytes) between a device's memory and the sum of the pods on
it: the agent reads the device and its processes one after the other, and a
process may allocate (or free, and another allocate) in between."""
USED_SLACK_FRACTION = 0.05
"""Slack as a share of the device's total memory (5%: 4 GiB of an 80 GiB GPU)."""


def _duplicates(values: Iterable[str]) -> list[str]:
    return sorted(v for v, n in Counter(values).items() if n > 1)


def _who(p: PodUsage) -> str:
    return f"pod {p.namespace or ''}/{p.name or p.uid}"


def _slack(mem: DeviceMemory) -> int:
    return max(MIN_USED_SLACK, int(mem.total_bytes * USED_SLACK_FRACTION))


class _Report:
    """What several rules read, computed once per report: the devices' memory
    by UUID (None: no figures) and the bytes the pods report on each device
    (unknown entries count 0)."""

    __slots__ = ("st", "memory", "on_device")

    def __init__(self, st: NodeGPUUsageStatus) -> None:
        self.st = st
        self.memory: dict[str, DeviceMemory | None] = {d.uuid: d.memory for d in st.devices}
        self.on_device: Counter[str] = Counter()
        for p in st.pods:
            for u in p.devices:
                self.on_device[u.uuid] += u.used_bytes or 0


def duplicate_device(r: _Report) -> str | None:
    dup = _duplicates(d.uuid for d in r.st.devices)
    return f"device {dup[0]} is listed more than once" if dup else None


def duplicate_pod(r: _Report) -> str | None:
    dup = _duplicates(p.uid for p in r.st.pods)
    return f"pod uid {dup[0]} is listed more than once" if dup else None


def device_memory(r: _Report) -> str | None:
    for d in r.st.devices:
        mem = d.memory
        if mem is None:
            continue
        if mem.usable_bytes == 0:
            return f"device {d.uuid} has no usable memory (usableBytes 0)"
        if mem.usable_bytes > mem.total_bytes:
            return f"device {d.uuid}: usableBytes {mem.usable_bytes} is above its totalBytes {mem.total_bytes}"
    return None


def device_used(r: _Report) -> str | None:
    # usedBytes may count the reserved memory (driver generations differ,
    # NVML-NOTES.md), so its bound is usable + reserved: the total.
    for d in r.st.devices:
        mem = d.memory
        if mem is not None and mem.used_bytes is not None and mem.used_bytes > mem.total_bytes:
            return (
                f"device {d.uuid} reports usedBytes {mem.used_bytes}, above its totalBytes {mem.total_bytes} "
                f"(usableBytes {mem.usable_bytes})"
            )
    return None


def pod_on_no_device(r: _Report) -> str | None:
    if r.st.devices:
        return None
    for p in r.st.pods:
        if p.vram_bytes:
            return f"{_who(p)} reports {format_bytes(p.vram_bytes)} of VRAM on a node that lists no device"
    return None


def unlisted_device(r: _Report) -> str | None:
    if r.st.truncated:
        return None  # the agent cut the device list (its bounds); pods may name a device cut
    unlisted = r.on_device.keys() - r.memory.keys()
    if not unlisted:
        return None
    for p in r.st.pods:
        for u in p.devices:
            if u.uuid in unlisted:
                return f"{_who(p)} reports usage on device {u.uuid}, which the report does not list"
    return None


def usage_without_memory(r: _Report) -> str | None:
    bare = {uuid for uuid, mem in r.memory.items() if mem is None}
    if not bare:
        return None
    for p in r.st.pods:
        for u in p.devices:
            if u.uuid in bare and (u.used_bytes or 0) > 0:
                return f"{_who(p)} reports {u.used_bytes} bytes on device {u.uuid}, which has no memory figures"
        # VRAM on no device entry could be on the device without figures: no bound holds it
        if p.vram_bytes and not p.devices:
            return (
                f"{_who(p)} reports {format_bytes(p.vram_bytes)} of VRAM on no device entry, "
                "beside a device with no memory figures"
            )
    return None


def pod_sum(r: _Report) -> str | None:
    # The agent writes vramBytes as the exact sum of the pod's device entries
    # (no rounding), or leaves it absent when one of them is unknown. A pod of
    # attribution Unknown has no VRAM the operator reads; one without entries
    # is bounded by the node's devices only (pod_above_device).
    for p in r.st.pods:
        if p.vram_bytes is None or not p.devices or p.attribution != "Measured":
            continue
        entries = 0
        for u in p.devices:
            if u.used_bytes is None:
                break
            entries += u.used_bytes
        else:
            if p.vram_bytes != entries:
                return (
                    f"{_who(p)} reports vramBytes {p.vram_bytes}, not the sum of its device entries "
                    f"({entries} over {len(p.devices)} devices)"
                )
    return None


def pod_above_device(r: _Report) -> str | None:
    known = None not in r.memory.values()
    node_total = sum(m.total_bytes for m in r.memory.values() if m is not None)
    for p in r.st.pods:
        vram = p.vram_bytes or 0
        if known and r.st.devices and vram > node_total:
            return f"{_who(p)} reports vramBytes {vram}, above the {format_bytes(node_total)} of the node's devices"
        for u in p.devices:
            mem = r.memory.get(u.uuid)
            if mem is not None and (u.used_bytes or 0) > mem.total_bytes:
                return f"{_who(p)} reports {u.used_bytes} bytes on device {u.uuid}, above its {format_bytes(mem.total_bytes)}"
    return None


def pods_above_usable(r: _Report) -> str | None:
    for d in r.st.devices:
        mem = d.memory
        if mem is None:
            continue
        pods, slack = r.on_device.get(d.uuid, 0), _slack(mem)
        if pods > mem.usable_bytes + slack:
            return (
                f"device {d.uuid}: its pods report {format_bytes(pods)}, above its "
                f"{format_bytes(mem.usable_bytes)} usable memory (beyond a slack of {format_bytes(slack)})"
            )
    return None


def used_below_pods(r: _Report) -> str | None:
    for d in r.st.devices:
        mem = d.memory
        if mem is None or mem.used_bytes is None:
            continue
        pods, slack = r.on_device.get(d.uuid, 0), _slack(mem)
        if pods > mem.used_bytes + slack:
            return (
                f"device {d.uuid} reports {format_bytes(mem.used_bytes)} used, below the "
                f"{format_bytes(pods)} its pods use (beyond a slack of {format_bytes(slack)})"
            )
    return None


class Rule(NamedTuple):
    """One rule a report must satisfy: its name and its check."""

    name: str
    check: Callable[[_Report], str | None]


RULES: tuple[Rule, ...] = (
    Rule("DuplicateDevice", duplicate_device),
    Rule("DuplicatePod", duplicate_pod),
    Rule("DeviceMemory", device_memory),
    Rule("DeviceUsedAboveTotal", device_used),
    Rule("PodOnNoDevice", pod_on_no_device),
    Rule("UnlistedDevice", unlisted_device),
    Rule("UsageWithoutMemory", usage_without_memory),
    Rule("PodSumMismatch", pod_sum),
    Rule("PodAboveDevice", pod_above_device),
    Rule("PodsAboveUsable", pods_above_usable),
    Rule("UsedBelowPods", used_below_pods),
)
"""Every rule, in the order they are checked; the first broken one is reported."""


def report_problem(st: NodeGPUUsageStatus) -> str | None:
    """Why the report's numbers cannot all be true, or None: the first rule of
    ``RULES`` it breaks, as ``"<why> (rule <Name>)"``."""
    report = _Report(st)
    for rule in RULES:
        why = rule.check(report)
        if why is not None:
            return f"{why} (rule {rule.name})"
    return None


def unknown_pods(st: NodeGPUUsageStatus, pod_uids: Collection[str]) -> str | None:
    """The report's pod uids that are not among ``pod_uids`` (the pods the API
    places on its node), as one line, or None. A warning only: the report is
    still believed (a pod may be deleted between the agent's read and ours)."""
    unknown = sorted(p.uid for p in st.pods if p.uid not in pod_uids)
    if not unknown:
        return None
    more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
    return f"{len(unknown)} pod uids are not pods on this node: {', '.join(unknown[:3])}{more}"
