"""Pure sums of one GPU sample per pod, container and device.

``aggregate`` sums each device's processes per pod and container (from the pid
attributions) and says which devices' process lists are incomplete; the report
(``report.build_report``) is built from the result. No I/O here.

Formulas (documented in docs/agent.md):
- a pod's VRAM on a device is the sum of ``usedGpuMemory`` of its processes
  there, each pid counted once per device; unknown (None) when any of them is
  unknown; its VRAM is the sum over devices;
- a device's processes are incomplete when the listing failed, a process's
  memory is unknown, or the known sum is far below ``used - reserved``:
  short by more than ``max(MISSING_MIN_BYTES, MISSING_FRACTION * (used - reserved))``
  (drivers 535.54/535.86 lost processes; a container without the host PID
  namespace sees an empty list);
- a device that is not Healthy (Lost, Error) has its processes unknown, like
  one whose listing failed. A pod that may have processes on such a device is
  Unknown, never Measured with the sum of its other devices: the pods seen on
  it in its last good listing (``last_seen``, kept by the sampler), the pods
  listed on it now when the listing is partial, and every GPU pod without a
  process elsewhere. A device that vanishes from NVML's enumeration altogether
  is not covered (NVML keeps a lost GPU's index, so it is reported Lost).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vramguard_api.usage import UnattributedProcess

from .cgroups import Attribution, NotInPod
from .gpu import DeviceSample, GPUSample

GIB = 1024**3
MISSING_MIN_BYTES = 1 * GIB
MISSING_FRACTION = 0.2


@dataclass(slots=True)
class PodVRAM:
    """One pod's VRAM in a sample, keyed by its cgroup uid (a static pod's config hash).

    ``devices`` and ``containers[cid]`` map device UUID → bytes (None: unknown).
    Processes in the pod's cgroup but in no container count for the pod only.
    """

    cgroup_uid: str
    qos: str | None
    devices: dict[str, int | None] = field(default_factory=dict)
    containers: dict[str, dict[str, int | None]] = field(default_factory=dict)

    @property
    def total(self) -> int | None:
        """VRAM over all devices, bytes; None when any part is unknown."""
        return sum_or_none(self.devices.values())

    def add(self, device: str, container_id: str | None, used: int | None) -> None:
        """Add one process's usage on ``device``."""
        _accumulate(self.devices, device, used)
        if container_id is not None:
            _accumulate(self.containers.setdefault(container_id, {}), device, used)


@dataclass(slots=True)
class Aggregation:
    """The per-pod and per-device sums of one sample."""

    pods: dict[str, PodVRAM] = field(default_factory=dict)
    unattributed: list[UnattributedProcess] = field(default_factory=list)
    process_bytes: dict[str, int | None] = field(default_factory=dict)
    complete: dict[str, bool] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    short: dict[str, str] = field(default_factory=dict)
    seen: dict[str, set[str]] = field(default_factory=dict)
    """Device UUID -> cgroup uids of the pods with a process on it, for each
    device whose listing succeeded (a MIG parent: the union of its MIG devices)."""
    sampled: bool = True
    """False when there was no GPU sample at all (the backend is unavailable)."""

    @property
    def listing_failed(self) -> bool:
        """True when some device's processes could not be listed, or nothing
        could be sampled."""
        return bool(self.problems) or not self.sampled


def sum_or_none(values: Iterable[int | None]) -> int | None:
    """The sum of ``values`` (bytes); None when any of them is None (unknown)."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _accumulate(target: dict[str, int | None], key: str, used: int | None) -> None:
    if key in target:
        prev = target[key]
        target[key] = None if prev is None or used is None else prev + used
    else:
        target[key] = used


def processes_short(memory_used: int, memory_reserved: int | None, process_sum: int) -> bool:
    """True when the known process sum is far below ``used - reserved`` (see module doc)."""
    expected = max(0, memory_used - (memory_reserved or 0))
    return expected - process_sum > max(MISSING_MIN_BYTES, MISSING_FRACTION * expected)


def aggregate(
    sample: GPUSample | None,
    attributions: Mapping[int, Attribution | NotInPod],
    last_seen: Mapping[str, Iterable[str]] | None = None,
) -> Aggregation:
    """Sum the sample's processes per pod, container and device.

    ``attributions`` maps host pid → attribution; a pid absent from it (the
    process exited before its cgroup was read) is left out of the pods and the
    unattributed list, though its memory still counts in the device's sum.
    ``last_seen`` maps a device UUID to the cgroup uids of the pods seen on it
    in its last good listing (``Aggregation.seen`` of an earlier sample): those
    pods are unknown on the device while its listing fails or it is unhealthy.
    """
    if sample is None:
        return Aggregation(sampled=False)
    result = Aggregation()
    for device in sample.devices:
        if device.health != "Healthy":
            _failed_device(device, result)
        elif not device.mig_enabled:  # MIG parents are summed from their MIG devices below
            _aggregate_device(device, attributions, result)
    for parent in (d for d in sample.devices if d.mig_enabled and d.health == "Healthy"):
        children = [d.uuid for d in sample.devices if d.parent_uuid == parent.uuid]
        result.process_bytes[parent.uuid] = sum_or_none(result.process_bytes.get(c) for c in children)
        result.complete[parent.uuid] = all(result.complete.get(c, False) for c in children)
        if all(c in result.seen for c in children):
            result.seen[parent.uuid] = set().union(*(result.seen[c] for c in children))
    _unknown_on_failed_devices(result, last_seen or {})
    return result


def _failed_device(device: DeviceSample, result: Aggregation) -> None:
    """A device that is not Healthy: its processes are unknown."""
    result.process_bytes[device.uuid] = None
    result.complete[device.uuid] = False
    result.problems[device.uuid] = f"device {device.health}: processes unknown ({device.error or 'no detail'})"


def _unknown_on_failed_devices(result: Aggregation, last_seen: Mapping[str, Iterable[str]]) -> None:
    """Mark unknown (None) on each failed device every pod that may have
    processes there: seen on it last time, or listed on it by a partial listing."""
    for uuid in result.problems:
        listed_now = {uid for uid, pod in result.pods.items() if uuid in pod.devices}
        for uid in set(last_seen.get(uuid, ())) | listed_now:
            pod = result.pods.get(uid)
            if pod is None:
                pod = result.pods[uid] = PodVRAM(cgroup_uid=uid, qos=None)
            pod.devices[uuid] = None
            for devices in pod.containers.values():
                if uuid in devices:
                    devices[uuid] = None


def _aggregate_device(
    device: DeviceSample, attributions: Mapping[int, Attribution | NotInPod], result: Aggregation
) -> None:
    uuid = device.uuid
    if device.processes is None:
        result.process_bytes[uuid] = None
        result.complete[uuid] = False
        result.problems[uuid] = f"processes unknown ({device.process_error or 'listing failed'})"
        return
    if not device.process_error:
        result.seen[uuid] = set()
    known = sum(p.used_bytes or 0 for p in device.processes)
    unknown = any(p.used_bytes is None for p in device.processes)
    result.process_bytes[uuid] = None if unknown else known
    complete = not unknown and device.process_error is None
    if device.process_error:
        result.problems[uuid] = device.process_error
    # Unknown is not missing: the cross-check needs every process's figure.
    memory = device.memory
    if not unknown and memory is not None and processes_short(memory.used, memory.reserved, known):
        complete = False
        result.short[uuid] = (
            f"process sum {known} B is far below used {memory.used} B minus reserved {memory.reserved or 0} B"
        )
    result.complete[uuid] = complete
    pods, seen = result.pods, result.seen.get(uuid)
    for process in device.processes:
        found = attributions.get(process.pid)
        if found is None:
            continue
        if isinstance(found, NotInPod):
            result.unattributed.append(
                UnattributedProcess(
                    pid=process.pid,
                    device=uuid,
                    usedBytes=process.used_bytes,
                    reason=found.reason[:256],
                )
            )
            continue
        pod = pods.get(found.pod_uid)
        if pod is None:
            pod = pods[found.pod_uid] = PodVRAM(cgroup_uid=found.pod_uid, qos=found.qos)
        pod.add(uuid, found.container_id, process.used_bytes)
        if seen is not None:
            seen.add(found.pod_uid)
