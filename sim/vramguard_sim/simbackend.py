"""The simulated backend: a scenario played through the NVML code on a fake host.

``SimBackend`` advances the scenario's processes on its simulated devices to
the current simulation time (``simgpu``: the profiles say what each process
wants, the devices what it gets; an allocation that does not fit kills its
process with an out-of-memory error, recorded in ``SimBackend.oom_kills``),
sets the state of a ``FakeNVML`` (devices, processes, faults) and samples it
with the real ``NVMLBackend``, so the NVML code paths and their error handling run as
on a GPU node. It also writes a fake host: ``<root>/proc/<pid>/cgroup`` for
every simulated process and a cgroup tree ``<root>/cgroup`` with each pod's and
container's memory files, which the agent then reads exactly as it reads the
real /proc and /sys/fs/cgroup.

Pods are named by namespace/name in the scenario. Their uids and container
ids come from the API server when the agent sees the pod there (so reports
join with real Pod objects); otherwise the uid is derived (uuid5 of the
node/namespace/name) and a container id is sha256(uid/name). A static pod's
cgroup carries its config hash: the mirror pod's annotation, or md5 of
namespace/name.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pynvml import NVML_ERROR_DRIVER_NOT_LOADED

from vramguard_agent.gpu import GPUSample
from vramguard_agent.nvml import NVMLBackend
from vramguard_agent.pods import PodMeta

from .fakenvml import FakeGPU, FakeMigDevice, FakeNVML, FakeProcess
from .scenario import VIRTUALIZATION, SimContainer, SimNode, SimPod, SimProcess
from .simcgroups import (
    DriverState,
    cgroup_namespaces,
    container_cgroup_path,
    device_limits,
    pod_cgroup_path,
    proc_cgroup_text,
)
from .simgpu import SimDevices, SimOOMKill

SIM_NAMESPACE = uuid.UUID("8f0c3a52-3d4e-4c1b-9a57-6f1e2b7d9c10")
FIRST_PID = 20001
MAX_OOM_RECORDS = 1000


def gpu_uuid(node: str, index: int) -> str:
    """The simulated GPU's UUID (stable per node and index)."""
    return f"GPU-{uuid.uuid5(SIM_NAMESPACE, f'{node}/gpu/{index}')}"


def mig_uuid(node: str, index: int, slot: int) -> str:
    """The simulated MIG device's UUID."""
    return f"MIG-{uuid.uuid5(SIM_NAMESPACE, f'{node}/gpu/{index}/mig/{slot}')}"


def device_uuid(node: SimNode, index: int, slot: int | None) -> str:
    """The UUID the fake NVML reports for GPU ``index`` of ``node`` (its MIG
    device ``slot`` when not None)."""
    if slot is not None:
        return mig_uuid(node.name, index, slot)
    return node.gpu_uuids()[index] or gpu_uuid(node.name, index)


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A simulated pod's identity on the host: API uid, cgroup uid, container ids by name."""

    uid: str
    cgroup_uid: str
    containers: Mapping[str, str]


def resolve(node: SimNode, api_pods: Mapping[str, PodMeta]) -> dict[tuple[str, str], PodIdentity]:
    """Identities of the scenario's pods, from the API's pods where they exist."""
    by_name = {(m.namespace, m.name): m for m in api_pods.values()}
    result = {}
    for pod in node.pods:
        meta = by_name.get((pod.namespace, pod.name))
        uid = meta.uid if meta else pod.uid or str(uuid.uuid5(SIM_NAMESPACE, f"{node.name}/{pod.namespace}/{pod.name}"))
        cgroup_uid = uid
        if pod.static:
            digest = hashlib.md5(f"{pod.namespace}/{pod.name}".encode()).hexdigest()
            cgroup_uid = (meta.config_hash if meta else None) or digest
        api_ids = {name: cid for cid, name in (meta.containers if meta else {}).items()}
        containers = {
            c.name: api_ids.get(c.name) or hashlib.sha256(f"{uid}/{c.name}".encode()).hexdigest()
            for c in pod.containers
        }
        result[(pod.namespace, pod.name)] = PodIdentity(uid, cgroup_uid, containers)
    return result


def assign_pids(node: SimNode) -> dict[int, SimProcess]:
    """Host pid of every simulated process: its ``pid`` or the next free one from FIRST_PID."""
    processes = [p for pod in node.pods for c in pod.containers for p in c.processes] + list(node.host_processes)
    taken = {p.pid for p in processes if p.pid is not None}
    result: dict[int, SimProcess] = {}
    next_pid = FIRST_PID
    for p in processes:
        if p.pid is None:
            while next_pid in taken:
                next_pid += 1
            taken.add(next_pid)
            result[next_pid] = p
        else:
            result[p.pid] = p
    return result


# --- the fake host -----------------------------------------------------------


class FakeHost:
    """Writes the fake /proc and cgroup trees of one simulated node under ``root``."""

    def __init__(self, root: str | Path, node: SimNode) -> None:
        self.root = Path(root)
        self.node = node
        self.proc_root = self.root / "proc"
        self.cgroup_root = self.root / "cgroup"
        self._written: dict[Path, str] = {}
        self._identities: dict[tuple[str, str], PodIdentity] | None = None

    def _write(self, path: Path, text: str) -> None:
        if self._written.get(path) == text:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)  # readers never see a half-written file
        self._written[path] = text

    def write(
        self,
        identities: dict[tuple[str, str], PodIdentity],
        pids: Mapping[int, SimProcess],
        t: float,
    ) -> None:
        """Write the proc files (when identities changed) and memory files at time ``t``."""
        if identities != self._identities:
            self._write_proc(identities, pids)
            self._identities = identities
        self._write_memory(identities, t)

    def _paths(self, pod: SimPod, identity: PodIdentity) -> tuple[str, dict[str, str]]:
        pod_path = pod_cgroup_path(self.node.cgroup, pod.qos, identity.cgroup_uid)
        containers = {
            c.name: container_cgroup_path(self.node.cgroup, pod_path, identity.containers[c.name])
            for c in pod.containers
        }
        return pod_path, containers

    def _write_proc(self, identities: dict[tuple[str, str], PodIdentity], pids: Mapping[int, SimProcess]) -> None:
        owner: dict[int, str] = {}
        by_process = {id(p): pid for pid, p in pids.items()}
        for pod in self.node.pods:
            _, containers = self._paths(pod, identities[(pod.namespace, pod.name)])
            for c in pod.containers:
                for p in c.processes:
                    owner[by_process[id(p)]] = containers[c.name]
        for hp in self.node.host_processes:
            owner[by_process[id(hp)]] = hp.cgroup
        for pid, path in owner.items():
            self._write(self.proc_root / str(pid) / "cgroup", proc_cgroup_text(self.node.cgroup, path))

    def _hierarchy(self) -> Path:
        if self.node.cgroup.version == 1:
            return self.cgroup_root / "memory"
        self._write(self.cgroup_root / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
        return self.cgroup_root

    def _write_memory(self, identities: dict[tuple[str, str], PodIdentity], t: float) -> None:
        base = self._hierarchy()
        for pod in self.node.pods:
            pod_path, containers = self._paths(pod, identities[(pod.namespace, pod.name)])
            figures = [self._container_figures(c, t) for c in pod.containers]
            for c, (ram, cache, oom) in zip(pod.containers, figures, strict=True):
                self._memory_files(base / containers[c.name].lstrip("/"), ram, cache, oom)
            pod_oom = sum(f[2] for f in figures) if self.node.cgroup.version == 2 else 0
            self._memory_files(
                base / pod_path.lstrip("/"),
                sum(f[0] for f in figures),
                sum(f[1] for f in figures),
                pod_oom,
            )

    @staticmethod
    def _container_figures(c: SimContainer, t: float) -> tuple[int, int, int]:
        return c.ram.at(t), c.page_cache.at(t), c.oom_kills

    def _memory_files(self, directory: Path, ram: int, cache: int, oom: int) -> None:
        if self.node.cgroup.version == 2:
            self._write(directory / "memory.current", f"{ram + cache}\n")
            self._write(
                directory / "memory.stat",
                f"anon {ram}\nfile {cache}\nactive_file 0\ninactive_file {cache}\n",
            )
            self._write(directory / "memory.events", f"low 0\nhigh 0\nmax 0\noom {oom}\noom_kill {oom}\n")
        else:
            self._write(directory / "memory.usage_in_bytes", f"{ram + cache}\n")
            self._write(
                directory / "memory.stat",
                f"cache {cache}\nrss {ram}\ninactive_file {cache}\ntotal_inactive_file {cache}\n",
            )
            self._write(
                directory / "memory.oom_control",
                f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom}\n",
            )


# --- the backend -----------------------------------------------------------


def fake_gpus(
    node: SimNode, pids: Mapping[int, SimProcess], t: float, held: Mapping[int, int] | None = None
) -> list[FakeGPU]:
    """The node's GPUs at time ``t``, per-GPU faults applied. ``held``: the bytes
    each running process holds on its device (``SimDevices.holdings``: what
    the device gave it); None: every process alive at ``t`` holds what its
    profile wants, whether or not it fits (a static state, for benchmarks)."""
    gpus: list[FakeGPU] = []
    for index, spec in enumerate(node.gpu_list()):
        gpu = FakeGPU(
            uuid=device_uuid(node, index, None),
            name=spec.model,
            total_bytes=spec.memory,
            reserved_bytes=spec.reserved,
            overhead_bytes=spec.overhead,
            virtualization_mode=VIRTUALIZATION[spec.virtualization],
            mig_capable=spec.mig_capable or spec.mig is not None,
        )
        if spec.mig is not None:
            gpu.mig_devices = [
                FakeMigDevice(
                    uuid=mig_uuid(node.name, index, slot),
                    profile=m.profile,
                    gpu_instance_id=m.gpu_instance_id if m.gpu_instance_id is not None else slot + 1,
                    compute_instance_id=m.compute_instance_id,
                    total_bytes=m.memory,
                    overhead_bytes=m.overhead,
                )
                for slot, m in enumerate(spec.mig)
            ]
        gpus.append(gpu)
    for pid, p in pids.items():
        if held is None and p.active(t):
            used = p.memory.at(t)
        elif held is not None and pid in held:
            used = held[pid]
        else:
            continue
        gpu = gpus[p.gpu]
        target = gpu.mig_devices[p.mig] if gpu.mig_devices is not None and p.mig is not None else gpu
        target.processes.append(FakeProcess(pid=pid, used_bytes=used, kind=p.kind))
    for fault in node.faults_at(t):
        for index, gpu in enumerate(gpus):
            if fault.gpu is None or fault.gpu == index:
                _apply_gpu_fault(fault.type, fault.mig, gpu)
    return gpus


def _apply_gpu_fault(kind: str, mig: int | None, gpu: FakeGPU) -> None:
    if kind == "gpu-lost":
        gpu.lost = True
    elif kind == "not-available":
        gpu.not_available = True
    elif kind == "hide-processes":
        gpu.hide_processes = True
    elif kind == "mig-listing-not-supported" and gpu.mig_devices is not None:
        for slot, device in enumerate(gpu.mig_devices):
            if mig is None or mig == slot:
                device.listing_not_supported = True


class SimBackend:
    """A ``GPUBackend`` playing ``node`` of a scenario; see the module docstring.

    ``api_pods`` returns the pods the agent knows from the API (uid → meta);
    ``host_root`` is where the fake host is written (None: write nothing, the
    caller supplies a tree made by ``vramguard-sim fake-host``); the simulation
    time is ``offset_s`` plus ``speed`` times the seconds of ``clock`` since
    construction (``speed`` > 1 plays the scenario faster than the clock, so that
    a demo shows an hour of leak in a minute). Raises ``ValueError`` for a speed
    that is not a positive finite number.

    The devices are stateful: each ``sample`` moves the processes from where
    the previous one left them (``SimDevices.advance``). ``oom_kills`` holds the
    last ``MAX_OOM_RECORDS`` processes killed by out-of-memory errors. A
    scenario pod that ``api_pods`` showed and no longer does (deleted,
    evicted) has its containers stopped, freeing their memory, until a pod of
    that name is shown again.

    The fake NVML's per-cgroup memory limits are what the devices enforce
    (``simcgroups``); with ``driver_state`` (a file) they survive an agent
    restart, as a real driver's do.
    """

    name: Literal["nvml", "sim"] = "sim"

    def __init__(
        self,
        node: SimNode,
        api_pods: Callable[[], Mapping[str, PodMeta]] = dict,
        host_root: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        offset_s: float = 0.0,
        speed: float = 1.0,
        driver_state: str | Path | None = None,
    ) -> None:
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"sim speed: {speed!r} is not a positive number")
        self.node = node
        self.api_pods = api_pods
        self.host = FakeHost(host_root, node) if host_root is not None else None
        self.clock = clock
        self.offset_s = offset_s
        self.speed = speed
        self._start = clock()
        self.pids = assign_pids(node)
        self.devices = SimDevices(node, self.pids, lambda gpu, mig: device_uuid(node, gpu, mig))
        self.oom_kills: deque[SimOOMKill] = deque(maxlen=MAX_OOM_RECORDS)
        self.fake = FakeNVML(driver_version=node.driver_version)
        self.fake.refuse_max_below_usage = True  # Linux 6.14's dmem.max (docs/agent.md, "Memory limits")
        self.driver_state = DriverState(Path(driver_state)) if driver_state is not None else None
        if self.driver_state is not None:
            self.fake.memory_limits = self.driver_state.load()
        self.nvml = NVMLBackend(self.fake)
        self.identities = resolve(node, {})
        self.identity_version = 0

    def now(self) -> float:
        """Simulation (scenario) time, seconds: ``offset_s + speed × elapsed``."""
        return self.offset_s + self.speed * (self.clock() - self._start)

    def sample(self) -> GPUSample:
        """Advance the fake host and the fake NVML to now, and sample through NVML."""
        t = self.now()
        api = self.api_pods()
        self.devices.sync_pods({(m.namespace, m.name) for m in api.values()})
        identities = resolve(self.node, api)
        if identities != self.identities:
            # Pods learnt from the API (or gone): the same pids now live in other cgroups.
            self.identities, self.identity_version = identities, self.identity_version + 1
        if self.host is not None:
            self.host.write(self.identities, self.pids, t)
        self._set_state(t)
        return self.nvml.sample()

    def _set_state(self, t: float) -> None:
        fake, active = self.fake, {f.type for f in self.node.faults_at(t)}
        self._keep_driver_state()  # what the last sample's memory-limit calls set
        owners, fake.pid_cgroups = cgroup_namespaces(self.node, self.identities, self.pids)
        self.devices.set_limits(device_limits(fake.memory_limits, owners))
        self.oom_kills.extend(self.devices.advance(t))
        fake.gpus = fake_gpus(self.node, self.pids, t, self.devices.holdings())
        fake.init_error = NVML_ERROR_DRIVER_NOT_LOADED if "nvml-unavailable" in active else None
        fake.privileged = self.node.nvml_privileged and "mig-parent-no-permission" not in active
        fake.no_v3 = "no-v3" in active
        fake.no_memory_v2 = "no-memory-v2" in active

    def container_names(self) -> dict[str, str]:
        """Container id → name for the simulated containers (kwok pods show no ids)."""
        return {cid: name for identity in self.identities.values() for name, cid in identity.containers.items()}

    def pod_metas(self) -> dict[str, PodMeta]:
        """Scenario pods as ``PodMeta`` keyed by cgroup uid, for runs without an API server."""
        metas = {}
        for pod in self.node.pods:
            identity = self.identities[(pod.namespace, pod.name)]
            metas[identity.cgroup_uid] = PodMeta(
                uid=identity.uid,
                namespace=pod.namespace,
                name=pod.name,
                qos_class=pod.qos,
                containers={cid: name for name, cid in identity.containers.items()},
                config_hash=identity.cgroup_uid if pod.static else None,
                gpu=True,
            )
        return metas

    def _keep_driver_state(self) -> None:
        if self.driver_state is not None:
            self.driver_state.save(self.fake.memory_limits)

    def close(self) -> None:
        """Keep the fake driver's limits (``driver_state``) and shut the fake NVML down."""
        self._keep_driver_state()
        self.nvml.close()
