"""The simulated cluster: pods of the workloads on the nodes' devices, over time.

``Fleet.step(t)`` advances the physical world by one tick, in this order:
arrivals (new pods, pending); terminations whose grace period ended (the
process is killed, its memory freed, its replica free); containers whose
CrashLoopBackOff ended (restarted); scheduling (pending pods onto free
replicas); progress (Jobs complete); memory (every running process moves to
what it wants: shrinking first, then growing in a pseudo-random order drawn
from the tick and the pid; an allocation that does not fit kills its process).

What the kubelet and the workload controllers do (``docs/simulation.md``):

- a container killed by an out-of-memory error exits; Deployments'
  (``restartPolicy: Always``) restart after the CrashLoopBackOff delay; Jobs'
  (``OnFailure``) too, until ``backoffLimit`` failures fail the Job. A restarted
  Job resumes from its last checkpoint; a restarted server starts afresh;
- an evicted pod terminates: its process keeps running (and allocating) for
  its grace period, then is killed and its memory freed; its controller creates
  a replacement at once, which the scheduler places where a replica is free
  (the evicted pod's replica is busy until it is gone);
- scheduling: the node with the most free replicas (ties at random), on it the
  device with the fewest pods.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vramguard_api.kubelet import consecutive_failures, crash_loop_backoff
from vramguard_api.units import quantity_decimal
from vramguard_operator.engine.types import ContainerFacts, PodFacts
from vramguard_sim.gpumem import REASON_DEVICE_FULL, GPUProcess, OOMKill
from vramguard_sim.simulate.nodes import GPU, SimNode
from vramguard_sim.simulate.workloads import COMPONENT, WARMUP_S, WorkloadSpec

CONTAINER = "main"


@dataclass(frozen=True, slots=True)
class OOMRecord:
    """A pod killed by an out-of-memory error: when, which, on which device,
    what it held and asked for, its share, and whether it stayed within it
    (``wanted_bytes`` ≤ ``share_bytes``: an "innocent" OOM kill); ``reason``:
    the device's (``gpumem``: the device was full, the pod's hard limit, or
    evicted above its soft limit for another's allocation)."""

    t_s: float
    namespace: str
    pod: str
    kind: str
    node: str
    device: str
    held_bytes: int
    requested_bytes: int
    free_bytes: int
    share_bytes: int
    reason: str = REASON_DEVICE_FULL

    @property
    def wanted_bytes(self) -> int:
        return self.held_bytes + self.requested_bytes

    @property
    def within_share(self) -> bool:
        return self.wanted_bytes <= self.share_bytes


class Replica:
    """One pod's worth of a workload: a Job, or one replica of a Deployment.
    Holds the work done (``progress_s``, seconds), the last checkpoint, the
    Job's failures, and its current pod."""

    __slots__ = ("spec", "index", "progress_s", "checkpoint_s", "failures", "pod", "done", "started")

    def __init__(self, spec: WorkloadSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.progress_s = spec.done_s
        self.checkpoint_s = _checkpoint(spec, spec.done_s)
        self.failures = 0
        self.pod: SimPod | None = None
        self.done = False
        self.started = False


def _checkpoint(spec: WorkloadSpec, progress: float) -> float:
    ck = spec.checkpoint_s
    return 0.0 if not ck else (progress // ck) * ck


class SimPod:
    """A pod: its API view (``facts``, the Pod as a JSON dict in ``api``), its
    place (node, device, pid), its container's state and its CPU speed."""

    __slots__ = (
        "uid", "name", "namespace", "labels", "replica", "pid", "created_s", "gpu", "facts", "up",
        "down_until", "started_s", "failures", "restarts", "speed", "kill_s", "gone", "api", "proc", "wants",
    )

    def __init__(self, uid: str, name: str, replica: Replica, pid: int, created_s: float) -> None:
        spec = replica.spec
        self.uid, self.name, self.namespace = uid, name, spec.namespace
        self.labels = {"app": spec.name, "app.kubernetes.io/component": COMPONENT[spec.kind]}
        if spec.is_job:
            self.labels["job-name"] = spec.name
        self.replica = replica
        self.pid = pid
        self.created_s = created_s
        self.gpu: GPU | None = None
        self.facts = PodFacts(
            self.namespace, name, uid, dict(self.labels), None, "Pending",
            (ContainerFacts(CONTAINER, spec.cpu, spec.cpu),),
        )
        self.api: dict[str, Any] | None = None
        self.up = False
        self.down_until: float | None = None
        self.started_s = 0.0
        self.failures = 0
        self.restarts = 0
        self.speed = 1.0
        self.kill_s: float | None = None
        self.gone = False
        self.proc: GPUProcess | None = None  # its process on its device while the container runs
        self.wants = spec.shape.wants

    @property
    def spec(self) -> WorkloadSpec:
        return self.replica.spec

    @property
    def terminating(self) -> bool:
        return self.kill_s is not None

    def held(self) -> int:
        """Bytes its process holds now (0 while its container is down)."""
        return 0 if self.proc is None else self.proc.used_bytes

    def set_facts(self, facts: PodFacts) -> None:
        """A new API view (annotations, CPU resources, deletion): the CPU speed
        follows the container's CPU limit (throttled: limit / the spec's CPU)."""
        self.facts = facts
        limit = facts.containers[0].cpu_limit if facts.containers else None
        full = float(quantity_decimal(self.spec.cpu))
        self.speed = 1.0 if limit is None else min(1.0, float(quantity_decimal(limit)) / full)


class Fleet:
    """Nodes, workloads and pods; see the module doc. ``seed`` draws the
    scheduler's ties (the workloads come drawn already)."""

    def __init__(self, nodes: list[SimNode], workloads: Iterable[WorkloadSpec], seed: int, tick_s: float) -> None:
        self.nodes = nodes
        self.tick_s = tick_s
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5C4ED]))
        self.arrivals = deque(sorted(workloads, key=lambda w: (w.arrival_s, w.name)))
        self.pending: deque[SimPod] = deque()
        self.pods: dict[str, SimPod] = {}  # every pod that exists (pending, running, terminating)
        self.running: list[SimPod] = []  # pods whose container is up
        self.by_pid: dict[int, SimPod] = {}
        self.changed: set[SimPod] = set()  # lifecycle changes this tick
        self.removed: list[SimPod] = []  # pods gone this tick
        self.dying: dict[SimPod, float] = {}  # terminating pods -> when their grace period ends
        self.waiting: dict[SimPod, float] = {}  # containers in CrashLoopBackOff -> restart time
        self.ooms: list[OOMRecord] = []
        self.jobs_completed = 0
        self.jobs_failed = 0
        self.restarts = 0
        self._next_uid = 0
        self._tick = 0
        self.memory_integral = 0.0  # byte-seconds of device memory used

    @property
    def usable_bytes(self) -> int:
        """Usable memory of every device of the fleet."""
        return sum(g.device.usable_bytes for n in self.nodes for g in n.gpus)

    @property
    def slots(self) -> int:
        """Replicas of every device (the pods the fleet can run at once)."""
        return sum(g.capacity for n in self.nodes for g in n.gpus)

    # --- the tick --------------------------------------------------------------------

    def step(self, t: float) -> None:
        """Advance the world to ``t`` (one tick after the last)."""
        self.changed.clear()
        self.removed.clear()
        self._tick += 1
        while self.arrivals and self.arrivals[0].arrival_s <= t:
            spec = self.arrivals.popleft()
            for i in range(spec.replicas):
                self._new_pod(Replica(spec, i), t)
        for pod in [p for p, at in self.dying.items() if at <= t]:
            self._remove(pod)
        for pod in [p for p, at in self.waiting.items() if at <= t]:
            self._start_container(pod, t)
        self._schedule(t)
        self._run(t)
        self.memory_integral += self.tick_s * sum(g.device.used_bytes for n in self.nodes for g in n.gpus)

    def _new_pod(self, replica: Replica, t: float) -> SimPod:
        self._next_uid += 1
        n = self._next_uid
        name = f"{replica.spec.name}-{n}" if replica.spec.is_job else f"{replica.spec.name}-{replica.index}-{n}"
        pod = SimPod(f"sim-{n:06d}", name, replica, 10000 + n, t)
        replica.pod = pod
        self.pods[pod.uid] = pod
        self.pending.append(pod)
        return pod

    def _schedule(self, t: float) -> None:
        while self.pending:
            free = [(n.free_replicas(), n) for n in self.nodes]
            most = max((f for f, _ in free), default=0)
            if most <= 0:
                return
            best = [n for f, n in free if f == most]
            node = best[int(self.rng.integers(len(best)))] if len(best) > 1 else best[0]
            gpu = node.least_used_gpu()
            assert gpu is not None
            pod = self.pending.popleft()
            pod.gpu = gpu
            gpu.pods.append(pod)
            pod.facts = replace(pod.facts, node_name=node.name, phase="Running")
            pod.api = _pod_api(pod, node.name)
            self._start_container(pod, t)

    def _start_container(self, pod: SimPod, t: float) -> None:
        assert pod.gpu is not None
        replica = pod.replica
        if pod.down_until is not None:
            pod.restarts += 1
            self.restarts += 1
            self.waiting.pop(pod, None)
        if replica.started:  # a restart or a replacement: a Job resumes from its checkpoint
            replica.progress_s = replica.checkpoint_s if pod.spec.is_job else 0.0
        replica.started = True
        pod.down_until, pod.up, pod.started_s = None, True, t
        pod.proc = pod.gpu.device.start(pod.pid, owner=pod.uid)
        self.by_pid[pod.pid] = pod
        self.running.append(pod)
        self.changed.add(pod)

    def _run(self, t: float) -> None:
        """One pass over the running containers: work done (Jobs complete), then
        memory: shrinking processes free at once, growing ones allocate in a
        pseudo-random order (the hot loop of the simulation: kept flat)."""
        dt, tick, warmup = self.tick_s, self._tick, WARMUP_S
        growing = []
        done = []
        for pod in self.running:
            r = pod.replica
            if pod.kill_s is None:
                r.progress_s += dt * pod.speed
                spec = r.spec
                if spec.work_s is not None:
                    if spec.checkpoint_s:
                        r.checkpoint_s = (r.progress_s // spec.checkpoint_s) * spec.checkpoint_s
                    if r.progress_s >= spec.work_s:
                        done.append(pod)
                        continue
            warm = (t - pod.started_s + dt) / warmup
            gpu = pod.gpu
            want = int(pod.wants(r.progress_s) * (warm if warm < 1.0 else 1.0) * gpu.share_bytes)  # type: ignore[union-attr]
            if want <= pod.proc.used_bytes:  # type: ignore[union-attr]
                gpu.device.resize(pod.pid, want)  # type: ignore[union-attr]
            else:
                growing.append(((pod.pid * 2654435761 + tick * 40503) & 0xFFFFFFFF, pod, want))
        for pod in done:
            pod.replica.done = True
            self.jobs_completed += 1
            self._remove(pod)
        growing.sort(key=lambda e: e[0])
        for _, pod, want in growing:
            if not pod.up:
                continue
            for kill in pod.gpu.device.resize(pod.pid, want):  # type: ignore[union-attr]
                self._oom(self.by_pid[kill.pid], kill, t)

    # --- what happens to a pod ------------------------------------------------------

    def _oom(self, pod: SimPod, kill: OOMKill, t: float) -> None:
        assert pod.gpu is not None
        self.ooms.append(
            OOMRecord(t, pod.namespace, pod.name, pod.spec.kind, pod.gpu.node.name, kill.device,
                      kill.held_bytes, kill.requested_bytes, kill.free_bytes, pod.gpu.share_bytes, kill.reason)
        )
        self._stop_container(pod)
        self.changed.add(pod)
        if pod.terminating:  # its last container exited: the pod is gone
            self._remove(pod)
            return
        pod.failures = consecutive_failures(pod.failures, t - pod.started_s)
        replica = pod.replica
        if replica.spec.is_job:
            replica.failures += 1
            if replica.failures > replica.spec.backoff_limit:
                self.jobs_failed += 1
                replica.done = True
                self._remove(pod)
                return
        pod.down_until = t + crash_loop_backoff(pod.failures)
        self.waiting[pod] = pod.down_until

    def _stop_container(self, pod: SimPod) -> None:
        if pod.up:
            pod.up = False
            pod.proc = None
            self.running.remove(pod)
            assert pod.gpu is not None
            pod.gpu.device.exit(pod.pid)
            self.by_pid.pop(pod.pid, None)

    def _remove(self, pod: SimPod) -> None:
        """The pod is gone: its process (if any) killed, its replica free."""
        self._stop_container(pod)
        pod.gone = True
        pod.down_until = None
        self.waiting.pop(pod, None)
        self.dying.pop(pod, None)
        self.pods.pop(pod.uid, None)
        if pod.gpu is not None:
            pod.gpu.pods.remove(pod)
        self.changed.add(pod)
        self.removed.append(pod)

    def evict(self, pod: SimPod, t: float) -> None:
        """The Eviction API accepted: the pod terminates (its process keeps
        running for the grace period), and its controller replaces it at once
        (a Job's eviction counts as one of its failures)."""
        pod.kill_s = t + pod.spec.grace_s
        pod.set_facts(replace(pod.facts, terminating=True))
        if pod.up:
            self.dying[pod] = pod.kill_s
        else:  # no container running (back-off): gone at once
            self._remove(pod)
        self.changed.add(pod)
        replica = pod.replica
        if replica.spec.is_job:
            replica.failures += 1
            if replica.failures > replica.spec.backoff_limit:
                self.jobs_failed += 1
                replica.done = True
                return
        self._new_pod(replica, t)

    def disruption_allowed(self, pod: SimPod) -> bool:
        """Whether a PodDisruptionBudget (maxUnavailable 1, on Deployments with
        one) allows evicting ``pod``: every other replica is healthy (running,
        its container up, not terminating)."""
        spec = pod.spec
        if not spec.pdb:
            return True
        healthy = sum(
            1 for p in self.pods.values() if p.spec is spec and p.up and not p.terminating and p.gpu is not None
        )
        return healthy - (spec.replicas - 1) >= 1


def _pod_api(pod: SimPod, node: str) -> dict[str, Any]:
    """The Pod as the operator's GPU-pod index keeps it (``gpu_pod_entry``)."""
    cpu = pod.spec.cpu
    return {
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "labels": dict(pod.labels),
                     "annotations": {}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": CONTAINER, "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": cpu},
                                                  "requests": {"nvidia.com/gpu": "1", "cpu": cpu}}}
            ],
        },
        "status": {"phase": "Running"},
    }
