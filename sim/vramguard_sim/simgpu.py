"""The scenario's processes on simulated devices: what they want, what they get.

A scenario's memory profiles say what each process *wants*; the node's devices
(``vramguard_sim.gpumem.Device``, one per GPU or MIG device) decide what it
*gets*, as a driver does: at each sample every running process moves to its
wanted size, shrinking processes first (freed memory is free at once), then
growing ones in pid order; an allocation that does not fit in the device's free
memory fails and the process dies with an out-of-memory error.

A process killed that way takes its container down (a framework exits on
"CUDA out of memory"; torchrun stops the other ranks): every process of the
container exits and its memory is freed. The kubelet then restarts the
container as the pod's ``restartPolicy`` says (``Always`` and ``OnFailure``
restart it after the CrashLoopBackOff delay, ``Never`` leaves the pod failed:
``vramguard_api.kubelet``). A restarted process plays its profile from the
beginning (a leak starts again from its start). A GPU process outside every
pod (``hostProcesses``) that is killed stays dead.

Every kill is kept as a ``SimOOMKill`` record naming the pod and container and
logged at WARNING, which is how a simulated node says which pod was killed by
OOM (the agent writes only its node's report, never Events).

Per-cgroup memory limits: a process's owner on its device is its pod
(``owner_of``: ``namespace/name``), and ``set_limits`` gives each device the
limits the (fake) driver holds per pod, which the device enforces
(``vramguard_sim.gpumem``): an allocation above the pod's hard limit fails in
that pod only; when a device runs out, the pod furthest above its soft limit
is evicted first. A process evicted for another's allocation takes its own
container down, like any out-of-memory kill.

A pod deleted from the API (an eviction among others) has its containers
stopped (``sync_pods``), as the kubelet stops them: its memory is freed. A new
pod under the same name starts afresh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vramguard_api.kubelet import consecutive_failures, crash_loop_backoff, restarts_after_failure
from vramguard_api.units import format_bytes
from vramguard_sim.gpumem import REASON_HARD_LIMIT, REASON_SOFT_LIMIT, Device, OOMKill

from .scenario import SimNode, SimPod, SimProcess

log = logging.getLogger("vramguard.sim.simgpu")


@dataclass(frozen=True, slots=True)
class SimOOMKill:
    """A simulated process killed by a failed allocation, with its pod and what
    follows. ``namespace``/``pod``/``container`` are None for a host process;
    ``restart_at_s`` is None when the container is not restarted."""

    time_s: float
    node: str
    namespace: str | None
    pod: str | None
    container: str | None
    kill: OOMKill
    restart_at_s: float | None

    def message(self) -> str:
        """One line: who, where, what it wanted, and what happens next."""
        k = self.kill
        who = f"pod {self.namespace}/{self.pod} container {self.container}" if self.pod else "host process"
        nxt = (
            f"the container restarts at t={self.restart_at_s:g}s"
            if self.restart_at_s is not None
            else ("the pod fails (restartPolicy Never)" if self.pod else "it stays dead")
        )
        if k.reason == REASON_SOFT_LIMIT:
            what = "evicted above its pod's soft limit to make room for another allocation"
        else:
            what = f"an allocation of {format_bytes(k.requested_bytes)} failed " + (
                f"at its pod's hard limit ({format_bytes(k.free_bytes)} free on the device)"
                if k.reason == REASON_HARD_LIMIT
                else f"with {format_bytes(k.free_bytes)} free"
            )
        return (
            f"node {self.node} t={self.time_s:g}s: {who} (pid {k.pid}) killed by CUDA out of memory on "
            f"{k.device}: held {format_bytes(k.held_bytes)}, {what}; {nxt}"
        )


class _Container:
    """A container's processes and its restart state (a host process is a
    container of one process without a pod)."""

    __slots__ = ("pod", "name", "pids", "failures", "started_at", "origin", "down_until", "failed")

    def __init__(self, pod: SimPod | None, name: str | None) -> None:
        self.pod = pod
        self.name = name
        self.pids: list[int] = []
        self.failures = 0
        self.started_at = 0.0
        self.origin = 0.0  # profiles are played from here: 0 on the first run, the restart time after
        self.down_until: float | None = None
        self.failed = False

    @property
    def up(self) -> bool:
        return self.down_until is None and not self.failed


def owner_of(pod: SimPod) -> str:
    """The owner of a pod's processes on their devices: ``namespace/name``."""
    return f"{pod.namespace}/{pod.name}"


class SimDevices:
    """The node's devices and the scenario's processes on them.

    ``uuid_of(gpu, mig)`` names each device (the UUIDs the fake NVML reports).
    """

    def __init__(self, node: SimNode, pids: Mapping[int, SimProcess], uuid_of: Callable[[int, int | None], str]) -> None:
        self.node = node
        self.devices: dict[tuple[int, int | None], Device] = {}
        for index, spec in enumerate(node.gpu_list()):
            if spec.mig is None:
                self.devices[(index, None)] = Device(uuid_of(index, None), spec.memory, spec.reserved, spec.overhead)
            else:
                for slot, m in enumerate(spec.mig):
                    self.devices[(index, slot)] = Device(uuid_of(index, slot), m.memory, 0, m.overhead)
        self._procs: list[tuple[int, SimProcess, _Container]] = []
        self._containers: dict[int, _Container] = {}
        by_process = {id(p): pid for pid, p in pids.items()}
        for pod in node.pods:
            for c in pod.containers:
                container = _Container(pod, c.name)
                for p in c.processes:
                    self._add(by_process[id(p)], p, container)
        for hp in node.host_processes:
            self._add(by_process[id(hp)], hp, _Container(None, None))
        self._procs.sort(key=lambda e: e[0])
        self._last_t: float | None = None
        self._seen: set[tuple[str, str]] = set()  # scenario pods the API has listed
        self._stopped: set[tuple[str, str]] = set()

    def _add(self, pid: int, p: SimProcess, container: _Container) -> None:
        container.pids.append(pid)
        self._procs.append((pid, p, container))
        self._containers[pid] = container

    def device(self, p: SimProcess) -> Device:
        """The device a process runs on."""
        return self.devices[(p.gpu, p.mig)]

    def holdings(self) -> dict[int, int]:
        """Bytes held by each running process, by pid."""
        return {pid: proc.used_bytes for d in self.devices.values() for pid, proc in d.processes.items()}

    def sync_pods(self, listed: set[tuple[str, str]]) -> None:
        """Follow the API's pods (``listed``: namespace and name of the pods it
        lists now). A scenario pod that it listed before and no longer does
        (deleted, evicted) has its containers stopped, as its kubelet would; a
        pod of the same name listed again (a new pod: a StatefulSet's, a
        re-created one) starts afresh, its profiles from their beginning, at
        the next ``advance``. A pod not listed yet (the watch not synced)
        keeps running."""
        for pod in self.node.pods:
            key = (pod.namespace, pod.name)
            if key in listed:
                self._seen.add(key)
                if key in self._stopped:
                    self._stopped.discard(key)
                    self._start_pod(*key)
            elif key in self._seen and key not in self._stopped:
                self._stopped.add(key)
                self.stop_pod(*key)

    def stop_pod(self, namespace: str, name: str) -> None:
        """The pod is gone from the API (deleted, evicted): as the kubelet
        does, its containers are stopped, and their processes exit and free
        their memory. They stay stopped until ``sync_pods`` sees the name again."""
        for pid, p, c in self._procs:
            if c.pod is not None and c.pod.namespace == namespace and c.pod.name == name:
                c.failed = True
                self.device(p).exit(pid)

    def _start_pod(self, namespace: str, name: str) -> None:
        """A new pod under a stopped pod's name: its containers start at the
        next ``advance`` (``down_until`` in the past), with no failures behind them."""
        for _, _, c in self._procs:
            if c.pod is not None and c.pod.namespace == namespace and c.pod.name == name:
                c.failed, c.failures, c.down_until = False, 0, float("-inf")

    def advance(self, t: float) -> list[SimOOMKill]:
        """Move every process to what its profile wants at ``t`` seconds; return
        the kills (also logged). A time before the last one is ignored."""
        if self._last_t is not None and t < self._last_t:
            return []
        self._last_t = t
        growing: list[tuple[int, int, SimProcess, _Container]] = []
        for pid, p, c in self._procs:
            if c.down_until is not None and t >= c.down_until:
                c.down_until, c.started_at, c.origin = None, t, t
            dev = self.device(p)
            if not (c.up and p.active(t)):
                dev.exit(pid)
                continue
            if pid not in dev.processes:
                dev.start(pid, owner=owner_of(c.pod) if c.pod else None)
            wanted = p.memory.at(t - c.origin)
            if wanted <= dev.holding(pid):
                dev.resize(pid, wanted)  # frees first: what is freed is free for the growers
            else:
                growing.append((pid, wanted, p, c))
        kills = []
        for pid, wanted, p, c in growing:
            if not c.up:  # its container died earlier in this sample
                continue
            for kill in self.device(p).resize(pid, wanted):  # the requester, or another evicted for it
                kills.append(self._died(self._containers[kill.pid], kill, t))
        return kills

    def set_limits(self, limits: Mapping[str, Mapping[str, tuple[int, int | None]]]) -> None:
        """The per-cgroup limits the driver holds: device UUID -> owner -> (soft,
        hard) bytes (``owner_of``); devices not named hold none."""
        for dev in self.devices.values():
            dev.limits = dict(limits.get(dev.uuid, {}))

    def _died(self, c: _Container, kill: OOMKill, t: float) -> SimOOMKill:
        """The container of a killed process exits (all its processes) and comes
        back, or not, as its pod's restartPolicy says."""
        for pid, p, owner in self._procs:
            if owner is c:
                self.device(p).exit(pid)
        restart_at = None
        if c.pod is not None and restarts_after_failure(c.pod.restart_policy):
            c.failures = consecutive_failures(c.failures, t - c.started_at)
            restart_at = t + crash_loop_backoff(c.failures)
            c.down_until = restart_at
        else:
            c.failed = True
        record = SimOOMKill(
            t,
            self.node.name,
            c.pod.namespace if c.pod else None,
            c.pod.name if c.pod else None,
            c.name,
            kill,
            restart_at,
        )
        log.warning("%s", record.message())
        return record
