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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from vramguard_api.units import format_bytes
from vramguard_api.usage import NodeGPUUsageStatus

MIN_USED_SLACK = 512 << 20
"""Least slack (bytes) between a device's ``usedBytes`` and the sum of the pods
on it: the agent reads the device and its processes one after the other, and
a process may allocate in between."""
USED_SLACK_FRACTION = 0.05
"""Slack as a share of the device's total memory (5%: 4 GiB of an 80 GiB GPU)."""


def _duplicates(values: Iterable[str]) -> list[str]:
    return sorted(v for v, n in Counter(values).items() if n > 1)


def report_problem(st: NodeGPUUsageStatus) -> str | None:
    """Why the report's numbers cannot all be true, or None. Checks, in order:
    duplicated device UUIDs and pod uids, a device without usable memory (or
    more usable than total), a pod above the total memory of the node's
    devices or of one device, and a device whose ``usedBytes`` is below the
    sum of its pods' usage by more than the slack (the larger of 512 MiB and
    5% of its total)."""
    devices = st.devices
    dup = _duplicates(d.uuid for d in devices)
    if dup:
        return f"device {dup[0]} is listed more than once"
    dup = _duplicates(p.uid for p in st.pods)
    if dup:
        return f"pod uid {dup[0]} is listed more than once"
    totals: dict[str, int] = {}
    for d in devices:
        mem = d.memory
        if mem is None:
            continue
        if mem.usable_bytes == 0:
            return f"device {d.uuid} has no usable memory (usableBytes 0)"
        if mem.usable_bytes > mem.total_bytes:
            return (
                f"device {d.uuid}: usableBytes {mem.usable_bytes} is above its totalBytes {mem.total_bytes}"
            )
        totals[d.uuid] = mem.total_bytes
    return _pod_problem(st, totals) or _used_problem(st)


def _pod_problem(st: NodeGPUUsageStatus, totals: dict[str, int]) -> str | None:
    """A pod's VRAM above all the node's device memory, or above one device's."""
    known = len(totals) == len(st.devices)
    node_total = sum(totals.values())
    for p in st.pods:
        who = f"pod {p.namespace or ''}/{p.name or p.uid}"
        vram = p.vram_bytes or 0
        if vram and not st.devices:
            return f"{who} reports {format_bytes(vram)} of VRAM on a node that lists no device"
        if known and vram > node_total:
            return f"{who} reports vramBytes {vram}, above the {format_bytes(node_total)} of the node's devices"
        for u in p.devices:
            total = totals.get(u.uuid)
            if total is not None and (u.used_bytes or 0) > total:
                return f"{who} reports {u.used_bytes} bytes on device {u.uuid}, above its {format_bytes(total)}"
    return None


def _used_problem(st: NodeGPUUsageStatus) -> str | None:
    """A device whose used memory is below the sum of its pods' beyond the slack."""
    on_device: Counter[str] = Counter()
    for p in st.pods:
        for u in p.devices:
            on_device[u.uuid] += u.used_bytes or 0
    for d in st.devices:
        mem = d.memory
        if mem is None or mem.used_bytes is None:
            continue
        slack = max(MIN_USED_SLACK, int(mem.total_bytes * USED_SLACK_FRACTION))
        pods = on_device.get(d.uuid, 0)
        if pods > mem.used_bytes + slack:
            return (
                f"device {d.uuid} reports {format_bytes(mem.used_bytes)} used, below the "
                f"{format_bytes(pods)} its pods use (beyond a slack of {format_bytes(slack)})"
            )
    return None
