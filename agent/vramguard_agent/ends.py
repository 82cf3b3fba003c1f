"""The agent notices every end: GPU processes that leave NVML's list, containers
that are gone, cgroup OOM kills in containers that keep running.

``EndTracker.observe(gpu, attributions, report, now)`` compares one sample with
the last and turns each end into an ``EndRecord`` (``vramguard_api.ends``) with
what the last sample saw: the pod's and the processes' bytes per device, the
device's free and usable memory, the neighbours with their bytes, the pod's
largest recent allocation step, the RAM working set and the pod cgroup's
OOM-kill counter before and after. Nothing is concluded from a sample that
could not see (a failed process listing, a truncated pod list): an end is only
an absence in a complete view.

Bounded: the ring holds ``RING_SIZE`` records not yet acknowledged (the
oldest dropped first, counted in ``dropped``) and the ``RECENT_KEPT`` last
acknowledged ones (what ``vramguard oom`` lists); ``published()`` gives the
oldest ``MAX_END_RECORDS`` unacknowledged records and, in the room left, the
most recent acknowledged ones; per-pod state is rebuilt every sample from the
pods present, so nothing grows with pods that are gone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from vramguard_api.ends import MAX_END_NEIGHBOURS, MAX_END_PIDS, MAX_END_RECORDS, EndDevice, EndNeighbour, EndRecord

from .cgroups import Attribution, NotInPod
from .gpu import GPUSample
from .report import NodeReport, PodEntry

RING_SIZE = 4 * MAX_END_RECORDS
RECENT_KEPT = MAX_END_RECORDS // 2
STEPS_KEPT = 6  # allocation steps remembered per pod and device: about a minute at 10 s samples


@dataclass(slots=True)
class _View:
    """One sample, as the tracker needs it: the sample's own objects (kept by
    reference, not copied: a steady tick only builds the small indexes below)."""

    gpu: GPUSample | None
    attributions: Mapping[int, Attribution | NotInPod]
    pods: dict[str, PodEntry]
    complete_pods: bool
    pids: set[int] = field(default_factory=set)  # processes in listed devices
    listed: set[str] = field(default_factory=set)  # devices whose process list was read
    memory: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)  # uuid -> (free, usable)
    on_device: dict[str, dict[str, int]] = field(default_factory=dict)  # uuid -> {pod uid: bytes}
    steps: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)  # (pod uid, uuid) -> rises

    def procs(self, pids: set[int]) -> dict[int, dict[str, int | None]]:
        """Bytes by device of the given pids (read from the sample when needed)."""
        out: dict[int, dict[str, int | None]] = {}
        for device in self.gpu.devices if self.gpu is not None else ():
            for proc in device.processes or ():
                if proc.pid in pids:
                    out.setdefault(proc.pid, {})[device.uuid] = proc.used_bytes
        return out


class EndTracker:
    """Turns successive samples into end records; see the module docstring."""

    def __init__(self) -> None:
        self.ring: deque[EndRecord] = deque(maxlen=RING_SIZE)  # not yet acknowledged, oldest first
        self.recent: deque[EndRecord] = deque(maxlen=RECENT_KEPT)  # acknowledged, kept for listing
        self.acknowledged = 0
        self.dropped = 0
        self.last_id = 0
        self._last: _View | None = None

    def observe(self, gpu: GPUSample | None, attributions: Mapping[int, Attribution | NotInPod],
                report: NodeReport, now: datetime) -> list[EndRecord]:
        """Record the ends between the last sample and this one; returns the new records."""
        view = _view(gpu, attributions, report, self._last)
        new = _ends(self._last, view, now) if self._last is not None else []
        self._last = view
        for record in new:
            self.last_id = max(self.last_id + 1, int(now.timestamp() * 1_000_000))
            record.id = self.last_id
            if len(self.ring) == self.ring.maxlen:
                self.dropped += 1
            self.ring.append(record)
        return new

    def acknowledge(self, last_id: int) -> None:
        """The operator has published the records at or below ``last_id``: keep
        them only among the recent ones."""
        self.acknowledged = max(self.acknowledged, last_id)
        while self.ring and self.ring[0].id <= self.acknowledged:
            self.recent.append(self.ring.popleft())

    def restore(self, records: list[EndRecord], acknowledged: int) -> None:
        """Take back the records an earlier agent published (from the answer to
        the first status write), ``acknowledged`` being the operator's annotation."""
        self.acknowledged = max(self.acknowledged, acknowledged)
        for record in sorted(records, key=lambda r: r.id):
            if record.id > self.last_id:
                (self.recent if record.id <= self.acknowledged else self.ring).append(record)
                self.last_id = record.id

    def published(self) -> list[EndRecord]:
        """The oldest unacknowledged records (at most ``MAX_END_RECORDS``), after
        the most recent acknowledged ones that fit beside them; by id."""
        waiting = list(self.ring)[:MAX_END_RECORDS]
        room = MAX_END_RECORDS - len(waiting)
        return [*(list(self.recent)[-room:] if room else []), *waiting]

    def pending(self, written_up_to: int) -> bool:
        """Whether a record newer than ``written_up_to`` waits to be written."""
        return bool(self.ring) and self.ring[-1].id > written_up_to


def _view(gpu: GPUSample | None, attributions: Mapping[int, Attribution | NotInPod], report: NodeReport,
          last: _View | None) -> _View:
    view = _View(gpu, attributions, {p.uid: p for p in report.pods}, not report.truncated)
    for device in gpu.devices if gpu is not None else ():
        if device.processes is not None:
            view.listed.add(device.uuid)
            view.pids.update(p.pid for p in device.processes)
    view.memory = {d.uuid: (d.memory.free_bytes, d.memory.usable_bytes) if d.memory else (None, None)
                   for d in report.devices}
    before_on = last.on_device if last is not None else {}
    steps = last.steps if last is not None else {}  # updated in place: only rises change it
    for pod in report.pods:
        for entry in pod.devices:
            used = entry.used_bytes
            if used is None:
                continue
            view.on_device.setdefault(entry.uuid, {})[pod.uid] = used
            before = before_on.get(entry.uuid, {}).get(pod.uid)
            if before is not None and used > before:
                key = (pod.uid, entry.uuid)
                steps[key] = (*steps.get(key, ())[1 - STEPS_KEPT:], used - before)
    same_pods = last is not None and last.pods.keys() == view.pods.keys()
    view.steps = steps if same_pods else {k: v for k, v in steps.items() if k[0] in view.pods}
    return view


def _ends(last: _View, now_view: _View, now: datetime) -> list[EndRecord]:
    records: list[EndRecord] = []
    ended_containers: dict[str, list[int]] = {}
    if now_view.complete_pods:
        current = {c.container_id for p in now_view.pods.values() for c in p.containers}
        for pod in last.pods.values():
            for c in pod.containers:
                if c.container_id not in current:
                    ended_containers[c.container_id] = []
    gone = last.pids - now_view.pids
    procs = last.procs(gone) if gone else {}
    for pid in sorted(gone):
        where = last.attributions.get(pid)
        if not isinstance(where, Attribution) or not set(procs.get(pid, ())) <= now_view.listed:
            continue
        if where.container_id in ended_containers:
            ended_containers[where.container_id].append(pid)
        else:
            records.append(_record(last, now_view, now, "ProcessExit", where.pod_uid, where.container_id, [pid],
                                   procs))
    for pod in last.pods.values():
        for c in pod.containers:
            if c.container_id in ended_containers:
                pids = ended_containers[c.container_id]
                records.append(_record(last, now_view, now, "ContainerEnd", pod.uid, c.container_id, pids, procs))
    recorded = {r.pod_uid for r in records}
    for uid, pod in last.pods.items():
        after = now_view.pods.get(uid)
        if uid not in recorded and after is not None and (after.oom_kills or 0) > (pod.oom_kills or 0) and (
                pod.oom_kills is not None):
            records.append(_record(last, now_view, now, "CgroupOOMKill", uid, None, [], procs))
    return records


def _record(last: _View, now_view: _View, now: datetime, kind: str, uid: str, container_id: str | None,
            pids: list[int], procs: Mapping[int, Mapping[str, int | None]]) -> EndRecord:
    pod = last.pods.get(uid)
    container = next((c for c in pod.containers if c.container_id == container_id), None) if pod else None
    after = now_view.pods.get(uid)
    process_bytes: dict[str, int] = {}
    for pid in pids:
        for uuid, used in procs.get(pid, {}).items():
            process_bytes[uuid] = process_bytes.get(uuid, 0) + (used or 0)
    uuids = dict.fromkeys([*((e.uuid for e in pod.devices) if pod else ()), *process_bytes])
    ram = container.ram_working_set_bytes if container and container.ram_working_set_bytes is not None else (
        pod.ram_working_set_bytes if pod else None)
    return EndRecord(
        id=0, time=now, kind=kind, podUID=uid,  # type: ignore[arg-type]
        namespace=pod.namespace if pod else None, name=pod.name if pod else None,
        containerID=container_id, containerName=container.name if container else None,
        pids=pids[:MAX_END_PIDS],
        devices=[_device(last, uuid, uid, process_bytes.get(uuid)) for uuid in uuids],
        ramWorkingSetBytes=ram,
        oomKillsBefore=pod.oom_kills if pod else None,
        oomKillsAfter=after.oom_kills if after is not None else None,
    )


def _device(last: _View, uuid: str, uid: str, process_bytes: int | None) -> EndDevice:
    free, usable = last.memory.get(uuid, (None, None))
    on = last.on_device.get(uuid, {})
    others = sorted(((u, b) for u, b in on.items() if u != uid), key=lambda e: -e[1])
    steps = last.steps.get((uid, uuid))
    return EndDevice(
        uuid=uuid, podBytes=on.get(uid), processBytes=process_bytes,
        stepBytes=max(steps) if steps else None, freeBytes=free, usableBytes=usable,
        neighbours=[_neighbour(last, u, b) for u, b in others[:MAX_END_NEIGHBOURS]],
    )


def _neighbour(last: _View, uid: str, used: int) -> EndNeighbour:
    pod = last.pods.get(uid)
    return EndNeighbour(uid=uid, namespace=pod.namespace if pod else None, name=pod.name if pod else None,
                        usedBytes=used)
