"""One sample of the node: GPU backend → pid attribution → RAM, then history → report.

``Sampler.read()`` does the I/O, and only reads (NVML through the backend,
``/proc/<pid>/cgroup``, the cgroup filesystem); ``Sampler.report()`` hands the
figures, with the memory limits the agent's step applied in between
(``agent.Components.tick``), to the pure functions of ``report``.
``Sampler.sample()`` is both without that step: a sample never writes.
Attributions are cached per pid while the pid keeps appearing in NVML's lists
(a process does not change pods; a pid reused by a new GPU process between two
samples of the same device is the accepted blind spot), so a steady node reads
/proc only for new processes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from vramguard_api import conditions as C
from vramguard_api.history import HistoryStore
from vramguard_api.meta import Condition
from vramguard_api.usage import AgentInfo, HostMemory, NodeGPUUsageStatus

from . import __version__
from .aggregation import Aggregation, aggregate
from .cgroups import Attribution, NotInPod, attribute_pid
from .dmem import DmemReader, DmemRegion, vram_source
from .ends import EndTracker
from .gpu import BackendUnavailable, GPUBackend, GPUSample
from .hostmem import HostMemoryReader
from .limits_plan import PodLimits
from .memory import CgroupMemoryReader, PodMemory
from .metrics import ContainerDeviceUsage
from .pods import PodMeta
from .report import DEFAULT_BOUNDS, Bounds, NodeReport, PodInputs, build_report
from .utilization import pod_sm_utilization

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SampleResult:
    """A sample's report, plus what the metrics need beyond it.

    ``container_devices`` lists each container's VRAM per device (bytes) for the
    metrics; it is computed when called (at scrape time, not every sample)."""

    report: NodeReport
    container_devices: Callable[[], list[ContainerDeviceUsage]] = list
    backend_error: str | None = None

    @property
    def unreadable(self) -> str | None:
        """Why no device could be read in this sample (NVML unavailable, or no device
        Healthy), from the report's AgentHealthy condition; None when at least one could."""
        if any(d.health == "Healthy" for d in self.report.devices):
            return None
        healthy = next((c for c in self.report.conditions if c.type == C.AGENT_HEALTHY), None)
        if healthy is not None and healthy.status == "False":
            return f"{healthy.reason}: {healthy.message}"
        return "no GPU device found"

    @property
    def status(self) -> NodeGPUUsageStatus:
        """The report as the API model (built on first use, then kept)."""
        return self.report.to_status()


@dataclass(slots=True)
class Reading:
    """What ``Sampler.read`` read: the sample's times (``now``, wall clock; ``history_s``,
    the histories' clock, seconds), the GPU sample or the backend's error, its
    aggregation by pod, the node's pods (cgroup uid → meta), the GPU pods among
    them, the pods' memory, each GPU process's attribution (host pid → its pod
    or why none), the pods' dmem charges (cgroup uid → NVIDIA regions) and the
    node's swap and memory pressure."""

    now: datetime
    history_s: float
    gpu: GPUSample | None
    error: str | None
    agg: Aggregation
    pods: Mapping[str, PodMeta]
    gpu_pods: list[str]
    memory: dict[str, PodMemory]
    attributions: Mapping[int, Attribution | NotInPod]
    dmem: dict[str, list[DmemRegion]]
    host: HostMemory


class Sampler:
    """Takes samples of one node.

    ``pods`` returns the node's pods from the API keyed by uid and static-pod
    config hash (``PodIndex.snapshot``); ``container_names`` returns extra
    container id → name pairs (the simulated backend's); ``wall_clock`` gives
    Unix seconds for sample times and histories. ``cache_key`` returns a value
    whose change clears the attribution cache (the simulated host can move a pid
    to another cgroup; a real host cannot). ``cgroups_needed(pods)`` names the
    cgroup uids whose memory and paths the memory limits need read beyond the GPU
    pods (``caps.CapEnforcer.cgroups_needed``). ``history`` keeps the pods' VRAM
    series, ``ram_history`` their RAM working sets: the same store and trend
    schedule for each, so one leak detector judges both memories.
    ``host_memory`` reads the node's swap and memory pressure (default: under ``proc_root``);
    ``dmem`` reads pods' dmem charges (cgroup v2; default: under the memory reader's root).
    """

    def __init__(
        self,
        backend: GPUBackend,
        proc_root: str | Path = "/proc",
        memory: CgroupMemoryReader | None = None,
        history: HistoryStore | None = None,
        ram_history: HistoryStore | None = None,
        pods: Callable[[], Mapping[str, PodMeta]] = dict,
        container_names: Callable[[], Mapping[str, str]] = dict,
        sample_interval_s: float = 10.0,
        bounds: Bounds = DEFAULT_BOUNDS,
        wall_clock: Callable[[], float] = time.time,
        cache_key: Callable[[], object] = lambda: None,
        history_clock: Callable[[], float] | None = None,
        cgroups_needed: Callable[[Mapping[str, PodMeta]], Iterable[str]] = lambda pods: (),
        host_memory: HostMemoryReader | None = None,
        dmem: DmemReader | None = None,
    ) -> None:
        self.backend = backend
        self.proc_root = Path(proc_root)
        # "is None", not "or": an empty store is falsy (it has a length).
        self.memory = memory if memory is not None else CgroupMemoryReader()
        self.history = history if history is not None else HistoryStore()
        # The pods' RAM working sets, for the same leak detector (issue 30).
        self.ram_history = ram_history if ram_history is not None else HistoryStore()
        self.pods = pods
        self.container_names = container_names
        self.sample_interval_s = sample_interval_s
        self.bounds = bounds
        self.wall_clock = wall_clock
        self.history_clock = history_clock or wall_clock
        self.cache_key = cache_key
        self.cgroups_needed = cgroups_needed
        self.host_memory = host_memory if host_memory is not None else HostMemoryReader(self.proc_root)
        self.dmem = dmem if dmem is not None else DmemReader(self.memory.root)
        self.ends = EndTracker()  # the ends between samples (ends.py), published with the report
        self._cache_key: object = None
        self._attributions: dict[int, Attribution | NotInPod] = {}
        self._conditions: list[Condition] | None = None
        self._invisible = 0
        # Device UUID -> pods seen on it in its last good listing; kept while the
        # device fails, so its pods stay Unknown (aggregation.aggregate).
        self._last_seen: dict[str, set[str]] = {}

    def sample(self) -> SampleResult:
        """One sample and the node's status, without memory limits: reads only."""
        return self.report(self.read())

    def read(self) -> Reading:
        """Read the node: GPU devices and processes, their pods, the pods' memory."""
        now = datetime.fromtimestamp(int(self.wall_clock()), tz=UTC)
        history_s = self.history_clock()
        gpu, error = self._gpu()
        attributions = self.attribute(gpu)
        agg = aggregate(gpu, attributions, self._last_seen)
        self._last_seen.update(agg.seen)
        if gpu is not None:  # forget devices that are gone (MIG devices destroyed)
            present = {d.uuid for d in gpu.devices}
            self._last_seen = {u: pods for u, pods in self._last_seen.items() if u in present}
        pods = self.pods()
        gpu_pods = [uid for uid, meta in pods.items() if meta.gpu and uid == (meta.config_hash or meta.uid)]
        wanted: dict[str, set[str]] = {uid: set() for uid in [*gpu_pods, *self.cgroups_needed(pods)]}
        for uid, vram in agg.pods.items():
            wanted.setdefault(uid, set()).update(vram.containers)
        memory = self.memory.read(wanted, now=history_s)  # a simulation refreshes RAM in scenario time
        dmem = self.dmem.read(wanted, self._pod_directory) if self.memory.version == 2 else {}
        host = self.host_memory.read()
        return Reading(now, history_s, gpu, error, agg, pods, gpu_pods, memory, attributions, dmem, host)

    def report(
        self, reading: Reading, limits: Mapping[str, PodLimits] | None = None, enforce_caps: bool = False
    ) -> SampleResult:
        """The node's status from ``reading`` and the pods' memory limits (by cgroup
        uid, ``caps.CapEnforcer.reconcile``); adds the sample to the histories."""
        agg, pods, gpu = reading.agg, reading.pods, reading.gpu
        # A GPU pod without a process holds 0 (kept: the leak detector reads zeros as restarts).
        idle = None if agg.listing_failed else 0
        vram_now = {uid: idle for uid in reading.gpu_pods} | {uid: vram.total for uid, vram in agg.pods.items()}
        for uid, regions in reading.dmem.items():  # the leak detector follows the pod's VRAM from either source
            if uid in vram_now:
                attributed = uid in agg.pods and bool(agg.pods[uid].devices)
                vram_now[uid] = vram_source(vram_now[uid], attributed, regions)[0]
        self.history.add(reading.history_s, vram_now)
        ram_now = {uid: m.pod.working_set_bytes for uid, m in reading.memory.items()}
        self.ram_history.add(reading.history_s, ram_now)
        names = self.container_names()
        inputs = PodInputs(
            pods=pods,
            memory=reading.memory,
            trends=self.history.trends(vram_now, reading.history_s),
            ram_trends=self.ram_history.trends(ram_now, reading.history_s),
            gpu_pods=reading.gpu_pods,
            container_names=names,
            memory_limits=limits or {},
            sm_utilization=pod_sm_utilization(gpu, reading.attributions),
            dmem=reading.dmem,
        )
        agent = AgentInfo(
            version=__version__,
            backend=self.backend.name,
            sampleIntervalSeconds=self.sample_interval_s,
            driverVersion=gpu.driver_version if gpu else None,
            enforceCaps=enforce_caps,
        )
        report = build_report(
            gpu, reading.error, agg, inputs, agent, reading.now, self._conditions, self.bounds, reading.host
        )
        self._conditions = report.conditions
        self.ends.observe(gpu, reading.attributions, report, reading.now)
        return SampleResult(report, functools.partial(container_devices, agg, pods, names), reading.error)

    def _pod_directory(self, uid: str) -> Path | None:
        relative = self.memory.pod_cgroup_path(uid)
        return None if relative is None else self.memory.root / relative.lstrip("/")

    def _gpu(self) -> tuple[GPUSample | None, str | None]:
        try:
            return self.backend.sample(), None
        except BackendUnavailable as err:
            return None, str(err)

    def attribute(self, gpu: GPUSample | None) -> dict[int, Attribution | NotInPod]:
        """Attribution of every pid in the sample (pids that are gone are left out).

        When every pid is missing from the proc root, the agent does not see the
        host's PID namespace: those processes are reported as unattributed with
        that reason instead of vanishing.
        """
        pids = {p.pid for d in gpu.devices for p in d.processes or []} if gpu else set()
        key = self.cache_key()
        if key != self._cache_key:
            self._attributions, self._cache_key = {}, key
        cache = {pid: a for pid, a in self._attributions.items() if pid in pids}
        gone: list[int] = []
        for pid in pids - cache.keys():
            try:
                cache[pid] = attribute_pid(pid, self.proc_root)
            except FileNotFoundError:
                gone.append(pid)  # exited since NVML listed it
            except OSError as err:
                cache[pid] = NotInPod(f"cannot read {self.proc_root}/{pid}/cgroup: {err.strerror or err}")
        self._attributions = cache
        # Every pid missing twice running: not exits, but a PID namespace that hides the host's.
        self._invisible = self._invisible + 1 if gone and len(gone) == len(pids) else 0
        result = dict(cache)
        if self._invisible >= 2:
            reason = f"pid not found under {self.proc_root}: the agent needs hostPID or the host's /proc"
            result.update({pid: NotInPod(reason) for pid in gone})
        return result


def container_devices(
    agg: Aggregation, pods: Mapping[str, PodMeta], extra_names: Mapping[str, str]
) -> list[ContainerDeviceUsage]:
    """Known per-container, per-device VRAM with pod and container names, for metrics."""
    result = []
    for uid, vram in agg.pods.items():
        meta = pods.get(uid)
        namespace, pod = (meta.namespace, meta.name) if meta else ("", uid)
        for cid, devices in vram.containers.items():
            name = (meta.containers.get(cid) if meta else None) or extra_names.get(cid) or cid[:12]
            for device, used in devices.items():
                if used is not None:
                    result.append(ContainerDeviceUsage(namespace, pod, name, device, used))
    return result
