"""One sample of the node: GPU backend → pid attribution → RAM → history → report.

``Sampler.sample()`` does the I/O (NVML through the backend, ``/proc/<pid>/cgroup``,
the cgroup filesystem) and hands the figures to the pure functions of
``report``. Attributions are cached per pid while the pid keeps appearing in
NVML's lists (a process does not change pods; a pid reused by a new GPU
process between two samples of the same device is the accepted blind spot),
so a steady node reads /proc only for new processes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from vramguard_api.history import HistoryStore
from vramguard_api.meta import Condition
from vramguard_api.usage import AgentInfo, NodeGPUUsageStatus

from . import __version__
from .aggregation import Aggregation, aggregate
from .caps import CapEnforcer
from .cgroups import Attribution, NotInPod, attribute_pid
from .dmem import DmemReader, vram_source
from .ends import EndTracker
from .gpu import BackendUnavailable, GPUBackend, GPUSample
from .hostmem import HostMemoryReader
from .memory import CgroupMemoryReader
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
    def status(self) -> NodeGPUUsageStatus:
        """The report as the API model (built on first use, then kept)."""
        return self.report.to_status()


class Sampler:
    """Takes samples of one node.

    ``pods`` returns the node's pods from the API keyed by uid and static-pod
    config hash (``PodIndex.snapshot``); ``container_names`` returns extra
    container id → name pairs (the simulated backend's); ``wall_clock`` gives
    Unix seconds for sample times and histories. ``cache_key`` returns a value
    whose change clears the attribution cache (the simulated host can move a pid
    to another cgroup; a real host cannot). ``caps``, when given, applies and
    reports pods' memory limits after each GPU sample (``caps.CapEnforcer``).
    ``host_memory`` reads the node's swap and memory pressure (default: under ``proc_root``);
    ``dmem`` reads pods' dmem charges (cgroup v2; default: under the memory reader's root).
    """

    def __init__(
        self,
        backend: GPUBackend,
        proc_root: str | Path = "/proc",
        memory: CgroupMemoryReader | None = None,
        history: HistoryStore | None = None,
        pods: Callable[[], Mapping[str, PodMeta]] = dict,
        container_names: Callable[[], Mapping[str, str]] = dict,
        sample_interval_s: float = 10.0,
        bounds: Bounds = DEFAULT_BOUNDS,
        wall_clock: Callable[[], float] = time.time,
        cache_key: Callable[[], object] = lambda: None,
        history_clock: Callable[[], float] | None = None,
        caps: CapEnforcer | None = None,
        host_memory: HostMemoryReader | None = None,
        dmem: DmemReader | None = None,
    ) -> None:
        self.backend = backend
        self.proc_root = Path(proc_root)
        # "is None", not "or": an empty store is falsy (it has a length).
        self.memory = memory if memory is not None else CgroupMemoryReader()
        self.history = history if history is not None else HistoryStore()
        self.pods = pods
        self.container_names = container_names
        self.sample_interval_s = sample_interval_s
        self.bounds = bounds
        self.wall_clock = wall_clock
        self.history_clock = history_clock or wall_clock
        self.cache_key = cache_key
        self.caps = caps
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
        """Take one sample and build the node's status."""
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
        wanted: dict[str, set[str]] = {uid: set() for uid in [*gpu_pods, *self._limit_pods(pods)]}
        for uid, vram in agg.pods.items():
            wanted.setdefault(uid, set()).update(vram.containers)
        memory = self.memory.read(wanted, now=history_s)  # a simulation refreshes RAM in scenario time
        limits = {}
        if self.caps is not None:
            limits = self.caps.reconcile(gpu, pods, self.memory.pod_cgroup_path, self.memory.version == 2)
        # A GPU pod without a process holds 0 (kept: the leak detector reads zeros as restarts).
        idle = None if agg.listing_failed else 0
        vram_now = {uid: idle for uid in gpu_pods} | {uid: vram.total for uid, vram in agg.pods.items()}
        dmem = self.dmem.read(wanted, self._pod_directory) if self.memory.version == 2 else {}
        for uid, regions in dmem.items():  # the leak detector follows the pod's VRAM from either source
            if uid in vram_now:
                attributed = uid in agg.pods and bool(agg.pods[uid].devices)
                vram_now[uid] = vram_source(vram_now[uid], attributed, regions)[0]
        self.history.add(history_s, vram_now)
        names = self.container_names()
        inputs = PodInputs(
            pods=pods,
            memory=memory,
            trends=self.history.trends(vram_now, history_s),
            gpu_pods=gpu_pods,
            container_names=names,
            memory_limits=limits,
            sm_utilization=pod_sm_utilization(gpu, attributions),
            dmem=dmem,
        )
        agent = AgentInfo(
            version=__version__,
            backend=self.backend.name,
            sampleIntervalSeconds=self.sample_interval_s,
            driverVersion=gpu.driver_version if gpu else None,
            enforceCaps=self.caps is not None and self.caps.enforce,
        )
        host = self.host_memory.read()
        report = build_report(gpu, error, agg, inputs, agent, now, self._conditions, self.bounds, host)
        self._conditions = report.conditions
        self.ends.observe(gpu, attributions, report, now)
        return SampleResult(report, functools.partial(container_devices, agg, pods, names), error)

    def _pod_directory(self, uid: str) -> Path | None:
        relative = self.memory.pod_cgroup_path(uid)
        return None if relative is None else self.memory.root / relative.lstrip("/")

    def _limit_pods(self, pods: Mapping[str, PodMeta]) -> list[str]:
        """Cgroup uids whose cgroup the memory limits need: pods with the annotation, the agent's own."""
        if self.caps is None:
            return []
        uids = [uid for uid, m in pods.items() if m.memory_limits is not None and uid == (m.config_hash or m.uid)]
        return [*uids, *([self.caps.own_pod_uid] if self.caps.own_pod_uid else [])]

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
