"""An end record, its pod and the devices' shares -> a finding: the verdict, the
Event that explains it and the metric's labels (``docs/oom.md``). Pure.

Evidence comes from three places: the agent's end record (bytes per device,
free memory, neighbours, the pod cgroup's OOM-kill counter), the pod (the
kubelet's ``lastState.terminated``: reason, exit code and termination message
of the container that ended; its RAM limit) and the node's share of each device
(``policy.pressure.device_shares``: usable memory / replicas, the share the
device-pressure rule protects). The finding's Event reasons are
``GPUOutOfMemory``, ``HostOutOfMemory`` and ``GPUMemoryCapKill``; an end that
is not a memory kill has no Event and no count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramguard_api.ends import EndDevice, EndRecord
from vramguard_api.oom import DeviceEvidence, Evidence, Neighbour, Verdict, classify
from vramguard_api.units import format_bytes, quantity_to_bytes
from vramguard_operator.engine.outputs import EventSpec

EVENT_REASONS = {"GPUOutOfMemory": "GPUOutOfMemory", "HostOutOfMemory": "HostOutOfMemory", "CapKill": "GPUMemoryCapKill"}


@dataclass(frozen=True, slots=True)
class Finding:
    """One end, judged: the ``record``, the ``verdict``, the ``device`` the
    evidence is about (the pod's largest; None without one), the pod's
    namespace/name (the record's, else the pod object's) and the node's share
    of that device (bytes; None: unknown)."""

    record: EndRecord
    verdict: Verdict
    device: EndDevice | None
    namespace: str | None
    name: str | None
    share_bytes: int | None = None

    @property
    def who(self) -> str:
        """``namespace/name``, else the pod uid."""
        return f"{self.namespace}/{self.name}" if self.namespace and self.name else self.record.pod_uid

    @property
    def labels(self) -> tuple[str, str, str]:
        """``vramguard_oom_kills_total``'s labels: namespace, kind, verdict (the blame, or ``NotApplicable``)."""
        return self.namespace or "", self.verdict.kind, self.verdict.blame or "NotApplicable"


def terminated(pod: Mapping[str, Any] | None, record: EndRecord) -> Mapping[str, Any] | None:
    """The kubelet's ``terminated`` state of the record's container: the status
    whose ``containerID`` (``<runtime>://<id>``) ends with the record's id, in
    ``state`` or ``lastState``; None when the pod or the state is not there."""
    if pod is None or record.container_id is None:
        return None
    status = pod.get("status") or {}
    for cs in [*(status.get("containerStatuses") or ()), *(status.get("initContainerStatuses") or ())]:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            t = state.get("terminated")
            if t and str(t.get("containerID") or cs.get("containerID") or "").endswith(record.container_id):
                return t
    return None


def ram_limit(pod: Mapping[str, Any] | None, container: str | None) -> int | None:
    """The container's memory limit in bytes (None when unset, unknown or unparsable)."""
    for c in ((pod or {}).get("spec") or {}).get("containers") or ():
        if c.get("name") == container:
            raw = ((c.get("resources") or {}).get("limits") or {}).get("memory")
            try:
                return quantity_to_bytes(raw, "memory") if raw is not None else None
            except ValueError:
                return None
    return None


def evidence(record: EndRecord, pod: Mapping[str, Any] | None, shares: Mapping[str, int]) -> Evidence:
    """The classifier's evidence for one end record (see the module docstring)."""
    t = terminated(pod, record) or {}
    device = main_device(record)
    return Evidence(
        exit_code=t.get("exitCode"),
        reason=t.get("reason"),
        message=t.get("message"),
        oom_kills_delta=record.oom_kills_delta,
        ram_working_set_bytes=record.ram_working_set_bytes,
        ram_limit_bytes=ram_limit(pod, record.container_name),
        device=_device_evidence(device, shares) if device is not None else None,
    )


def main_device(record: EndRecord) -> EndDevice | None:
    """The device the pod held most on (the one an OOM is most likely about)."""
    return max(record.devices, key=lambda d: d.pod_bytes or d.process_bytes or 0, default=None)


def _device_evidence(d: EndDevice, shares: Mapping[str, int]) -> DeviceEvidence:
    share = shares.get(d.uuid)
    neighbours = tuple(Neighbour(f"{n.namespace}/{n.name}" if n.namespace and n.name else n.uid, n.used_bytes or 0,
                                 share) for n in d.neighbours)
    return DeviceEvidence(uuid=d.uuid, free_bytes=d.free_bytes, usable_bytes=d.usable_bytes,
                          held_bytes=d.pod_bytes or d.process_bytes or 0, share_bytes=share,
                          step_bytes=d.step_bytes, neighbours=neighbours)


def finding(record: EndRecord, pod: Mapping[str, Any] | None, shares: Mapping[str, int]) -> Finding:
    """Judge one end record."""
    meta = (pod or {}).get("metadata") or {}
    device = main_device(record)
    return Finding(record, classify(evidence(record, pod, shares)), device,
                   record.namespace or meta.get("namespace"), record.name or meta.get("name"),
                   shares.get(device.uuid) if device is not None else None)


def pod_event(f: Finding) -> EventSpec | None:
    """The Event on the pod (None for an end that is not a memory kill)."""
    reason = EVENT_REASONS.get(f.verdict.kind)
    if reason is None:
        return None
    return EventSpec("Warning", reason, message(f)[:1024], key=f"oom-{f.record.id}")


def budget_event(f: Finding, budget: str) -> EventSpec | None:
    """The same, for a budget involved (the victim's, or a neighbour's above its share)."""
    spec = pod_event(f)
    if spec is None:
        return None
    return EventSpec("Warning", spec.reason, f"budget {budget}: pod {f.who}: {spec.message}"[:1024],
                     key=f"oom-{f.record.id}-{budget}")


def message(f: Finding) -> str:
    """What happened, in one paragraph: kind and blame, device and free memory,
    what the pod held against its share, each neighbour above its share, and the evidence."""
    v, d = f.verdict, f.device
    container = f.record.container_name or f.record.container_id or "a process"
    head = {
        "GPUOutOfMemory": "ran out of GPU memory",
        "CapKill": "was stopped by the driver's memory cap",
        "HostOutOfMemory": "was killed for host RAM (not VRAM)",
    }.get(v.kind, "ended")
    if d is None:
        where = ""
    elif v.kind == "HostOutOfMemory":  # the device is not the cause: say what the pod held there
        where = f" (it held {format_bytes(d.pod_bytes or d.process_bytes)} of VRAM on {d.uuid})"
    else:
        where = f" on {d.uuid} ({format_bytes(d.free_bytes)} free of {format_bytes(d.usable_bytes)})"
    blame = {"Innocent": "innocent: within its share", "Own": "its own: above its share or limit",
             "Unknown": "share unknown"}.get(v.blame or "", "")
    parts = [f"container {container} of {f.who} {head}{where}" + (f"; {blame}" if blame else "")]
    parts += list(v.because)
    parts.append(f"confidence {v.confidence}")
    return "; ".join(parts)
