"""Prometheus metrics, and the /metrics, /healthz and /readyz endpoints.

Device metrics carry dcgm-exporter's labels so that existing dashboards join
them with DCGM's: ``gpu`` (index), ``UUID`` (for a MIG device, its parent GPU's
UUID, as dcgm-exporter does), ``device`` (``nvidia<index>``), ``modelName``,
``Hostname`` (the node name), ``GPU_I_PROFILE`` and ``GPU_I_ID`` (MIG; empty
otherwise); per-pod series add ``namespace``, ``pod`` and ``container``.
A figure that is unknown is left out, never exported as 0. The series come
from the latest sample only, so pods that are gone disappear at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from vramguard_api.usage import GPUDevice, MemoryPressure, NodeGPUUsageStatus

from .report import NodeReport

log = logging.getLogger(__name__)

DEVICE_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_PROFILE", "GPU_I_ID"]
POD_LABELS = ["namespace", "pod", "Hostname"]
CONTAINER_LABELS = ["namespace", "pod", "container", "Hostname"]


class ContainerDeviceUsage(NamedTuple):
    """One container's VRAM on one device (bytes), for the per-container series.

    A tuple: a sample makes one per process, so it must be cheap to create."""

    namespace: str
    pod: str
    container: str
    device_uuid: str
    used_bytes: int


@dataclass(slots=True)
class Snapshot:
    """What the collector exports: the latest report (plain or the API model:
    they share attribute names) and a function listing per-container device
    usage, called at scrape time."""

    node: str
    status: NodeReport | NodeGPUUsageStatus | None = None
    container_devices: Callable[[], Iterable[ContainerDeviceUsage]] = list


class UsageCollector:
    """A prometheus-client collector over the latest ``Snapshot``."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        """No fixed description: the series depend on the sample."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families of the latest sample."""
        snap = self._snapshot()
        if snap.status is None:
            return
        yield from _device_families(snap)
        yield from _pod_families(snap)
        yield from _limit_families(snap)
        yield from _host_memory_families(snap)
        yield from _dmem_families(snap)


def _device_labels(device: GPUDevice, by_uuid: dict[str, GPUDevice], node: str) -> list[str]:
    parent = by_uuid.get(device.parent_uuid) if device.parent_uuid else None
    model = (parent.model_name if parent else device.model_name) or ""
    return [
        str(device.index),
        device.parent_uuid or device.uuid,
        f"nvidia{device.index}",
        model,
        node,
        device.mig_profile or "",
        "" if device.gpu_instance_id is None else str(device.gpu_instance_id),
    ]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


# The per-device gauges: key -> (name, help), in exposition order.
_DEVICE_GAUGES = {
    "total": ("vramguard_gpu_memory_total_bytes", "Total framebuffer memory (NVML)."),
    "reserved": ("vramguard_gpu_memory_reserved_bytes", "Reserved framebuffer memory (NVML v2)."),
    "usable": ("vramguard_gpu_memory_usable_bytes", "Usable memory: total minus reserved."),
    "used": ("vramguard_gpu_memory_used_bytes", "Used framebuffer memory (NVML)."),
    "process": ("vramguard_gpu_process_memory_bytes", "Sum of per-process memory."),
    "complete": ("vramguard_gpu_processes_complete", "1 when every process's memory is known and accounted."),
    "healthy": ("vramguard_gpu_healthy", "1 when the device answers NVML."),
    "unattributed": ("vramguard_gpu_unattributed_memory_bytes", "Memory of GPU processes in no pod."),
    # Percent, as dcgm-exporter's DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_MEM_COPY_UTIL are.
    "gpu_util": ("vramguard_gpu_utilization_percent", "Percent of time a kernel ran (NVML utilization.gpu)."),
    "mem_util": ("vramguard_gpu_memory_copy_utilization_percent", "Percent of time memory was read or written."),
}


def _device_families(snap: Snapshot) -> Iterator[Metric]:
    assert snap.status is not None
    status, node = snap.status, snap.node
    by_uuid = {d.uuid: d for d in status.devices}
    families = {key: _gauge(name, doc, DEVICE_LABELS) for key, (name, doc) in _DEVICE_GAUGES.items()}
    unattributed: dict[str, int] = {}
    for u in status.unattributed:
        unattributed[u.device] = unattributed.get(u.device, 0) + (u.used_bytes or 0)
    for d in status.devices:
        labels = _device_labels(d, by_uuid, node)
        if d.memory is not None:
            families["total"].add_metric(labels, d.memory.total_bytes)
            families["usable"].add_metric(labels, d.memory.usable_bytes)
            if d.memory.reserved_bytes is not None:
                families["reserved"].add_metric(labels, d.memory.reserved_bytes)
            if d.memory.used_bytes is not None:
                families["used"].add_metric(labels, d.memory.used_bytes)
        if d.process_bytes is not None:
            families["process"].add_metric(labels, d.process_bytes)
        families["complete"].add_metric(labels, 1 if d.processes_complete else 0)
        families["healthy"].add_metric(labels, 1 if d.health == "Healthy" else 0)
        families["unattributed"].add_metric(labels, unattributed.get(d.uuid, 0))
        if d.gpu_utilization_percent is not None:
            families["gpu_util"].add_metric(labels, d.gpu_utilization_percent)
        if d.memory_utilization_percent is not None:
            families["mem_util"].add_metric(labels, d.memory_utilization_percent)
    yield from families.values()
    yield _pod_utilization_family(snap, by_uuid)
    yield _container_family(snap, by_uuid)


def _container_family(snap: Snapshot, by_uuid: dict[str, GPUDevice]) -> Metric:
    family = _gauge(
        "vramguard_container_gpu_memory_used_bytes",
        "A container's GPU memory on one device.",
        [*DEVICE_LABELS, "namespace", "pod", "container"],
    )
    for c in snap.container_devices():
        device = by_uuid.get(c.device_uuid)
        if device is not None:
            family.add_metric([*_device_labels(device, by_uuid, snap.node), c.namespace, c.pod, c.container], c.used_bytes)
    return family


def _pod_utilization_family(snap: Snapshot, by_uuid: dict[str, GPUDevice]) -> Metric:
    assert snap.status is not None
    family = _gauge(
        "vramguard_pod_gpu_sm_utilization_percent",
        "SM utilisation of a pod's processes on one device (NVML process utilisation, summed).",
        [*DEVICE_LABELS, "namespace", "pod"],
    )
    for p in snap.status.pods:
        for d in p.devices:
            device = by_uuid.get(d.uuid)
            if device is not None and d.sm_utilization_percent is not None:
                labels = [*_device_labels(device, by_uuid, snap.node), p.namespace or "", p.name or p.uid]
                family.add_metric(labels, d.sm_utilization_percent)
    return family


def _pod_families(snap: Snapshot) -> Iterator[Metric]:
    assert snap.status is not None
    node = snap.node
    vram = _gauge("vramguard_pod_gpu_memory_used_bytes", "A pod's GPU memory over all devices.", POD_LABELS)
    ram = _gauge(
        "vramguard_pod_memory_working_set_bytes",
        "A pod's RAM working set (kubelet definition).",
        POD_LABELS,
    )
    growth = _gauge(
        "vramguard_pod_gpu_memory_growth_bytes_per_hour",
        "Robust growth rate of a pod's GPU memory.",
        POD_LABELS,
    )
    floor = _gauge("vramguard_pod_gpu_memory_floor_rise_bytes", "Rise of a pod's GPU memory floor.", POD_LABELS)
    c_ram = _gauge(
        "vramguard_container_memory_working_set_bytes",
        "A container's RAM working set.",
        CONTAINER_LABELS,
    )
    c_oom = CounterMetricFamily(
        "vramguard_container_oom_kills",
        "OOM kills in a container's cgroup.",
        labels=CONTAINER_LABELS,
    )
    for p in snap.status.pods:
        labels = [p.namespace or "", p.name or p.uid, node]
        if p.vram_bytes is not None:
            vram.add_metric(labels, p.vram_bytes)
        if p.ram_working_set_bytes is not None:
            ram.add_metric(labels, p.ram_working_set_bytes)
        if p.trend is not None and p.trend.growth_bytes_per_hour is not None:
            growth.add_metric(labels, p.trend.growth_bytes_per_hour)
        if p.trend is not None and p.trend.floor_rise_bytes is not None:
            floor.add_metric(labels, p.trend.floor_rise_bytes)
        for c in p.containers:
            c_labels = [p.namespace or "", p.name or p.uid, c.name or c.container_id[:12], node]
            if c.ram_working_set_bytes is not None:
                c_ram.add_metric(c_labels, c.ram_working_set_bytes)
            if c.oom_kills is not None:
                c_oom.add_metric(c_labels, c.oom_kills)
    yield from (vram, ram, growth, floor, c_ram, c_oom)


def _limit_families(snap: Snapshot) -> Iterator[Metric]:
    """Per-cgroup memory limits: each device's support, each pod's limits the driver holds."""
    assert snap.status is not None
    status, node = snap.status, snap.node
    by_uuid = {d.uuid: d for d in status.devices}
    support = _gauge(
        "vramguard_gpu_memory_limits_supported",
        "1 when the driver holds per-cgroup memory limits on the device (reason: why or why not).",
        [*DEVICE_LABELS, "reason"],
    )
    for d in status.devices:
        if d.memory_limits is not None:
            labels = [*_device_labels(d, by_uuid, node), d.memory_limits_reason or ""]
            support.add_metric(labels, 1 if d.memory_limits == "Supported" else 0)
    labels = [*POD_LABELS, "UUID"]
    held = _gauge("vramguard_pod_gpu_memory_limit_bytes", "A memory limit the driver holds for a pod.", [*labels, "limit"])
    applied = _gauge(
        "vramguard_pod_gpu_memory_limits_applied",
        "1 when the driver holds the limits the pod's annotation wants (state: Applied, Pending, ...).",
        [*labels, "state"],
    )
    for p in status.pods:
        for e in p.memory_limits or []:
            pod = [p.namespace or "", p.name or p.uid, node, e.uuid]
            applied.add_metric([*pod, e.state], 1 if e.state == "Applied" else 0)
            if e.hard_limit_bytes is not None:
                held.add_metric([*pod, "hard"], e.hard_limit_bytes)
            if e.soft_limit_bytes is not None:
                held.add_metric([*pod, "soft"], e.soft_limit_bytes)
    yield from (support, held, applied)


# PSI lines as node_exporter and cAdvisor name them: "some" is waiting, "full" is stalled.
_PRESSURE_NAMES = {"some": "waiting", "full": "stalled"}


def _host_memory_families(snap: Snapshot) -> Iterator[Metric]:
    """Swap and memory pressure of the node and its pods (read only; docs/swap-and-pressure.md)."""
    assert snap.status is not None
    status, node = snap.status, snap.node
    swap = _gauge("vramguard_pod_memory_swap_bytes", "Swap in use by a pod's cgroup.", POD_LABELS)
    rates = {
        "in": _gauge("vramguard_node_swap_in_bytes_per_second", "Swap-in rate of the node (pswpin).", ["Hostname"]),
        "out": _gauge("vramguard_node_swap_out_bytes_per_second", "Swap-out rate of the node (pswpout).", ["Hostname"]),
    }
    node_psi = {
        kind: CounterMetricFamily(
            f"vramguard_node_pressure_memory_{word}_seconds",
            f"Time tasks of the node were {word} on memory (PSI {kind} total).",
            labels=["Hostname"],
        )
        for kind, word in _PRESSURE_NAMES.items()
    }
    pod_psi = {
        kind: CounterMetricFamily(
            f"vramguard_pod_pressure_memory_{word}_seconds",
            f"Time tasks of a pod were {word} on memory (PSI {kind} total of memory.pressure).",
            labels=POD_LABELS,
        )
        for kind, word in _PRESSURE_NAMES.items()
    }
    host = status.host_memory
    if host is not None:
        for direction, value in (("in", host.swap_in_bytes_per_second), ("out", host.swap_out_bytes_per_second)):
            if value is not None:
                rates[direction].add_metric([node], value)
        _add_pressure(node_psi, [node], host.pressure)
    for p in status.pods:
        labels = [p.namespace or "", p.name or p.uid, node]
        if p.swap_bytes is not None:
            swap.add_metric(labels, p.swap_bytes)
        _add_pressure(pod_psi, labels, p.memory_pressure)
    yield from (swap, *rates.values(), *node_psi.values(), *pod_psi.values())


def _dmem_families(snap: Snapshot) -> Iterator[Metric]:
    """Pods' charges on the kernel's dmem regions (docs/dmem.md); ``region`` names the device."""
    assert snap.status is not None
    labels = [*POD_LABELS, "region"]
    families = {
        "current": _gauge("vramguard_pod_dmem_current_bytes", "A pod cgroup's dmem.current on a region.", labels),
        "max": _gauge("vramguard_pod_dmem_max_bytes", "A pod cgroup's dmem.max on a region (absent: max).", labels),
    }
    for p in snap.status.pods:
        for r in p.dmem or ():
            pod = [p.namespace or "", p.name or p.uid, snap.node, r.region]
            for key, value in (("current", r.current_bytes), ("max", r.max_bytes)):
                if value is not None:
                    families[key].add_metric(pod, value)
    yield from families.values()


def _add_pressure(families: dict[str, CounterMetricFamily], labels: list[str], psi: MemoryPressure | None) -> None:
    for kind, family in families.items():
        line = getattr(psi, kind) if psi is not None else None
        if line is not None:
            family.add_metric(labels, line.total_microseconds / 1e6)


class AgentMetrics:
    """The agent's own metrics and the usage collector, in one registry."""

    def __init__(self, node: str) -> None:
        self.registry = CollectorRegistry()
        self.snapshot = Snapshot(node=node)
        self._lock = threading.Lock()
        self.registry.register(UsageCollector(self.current))
        self.sample_seconds = Histogram(
            "vramguard_agent_sample_duration_seconds",
            "Wall time of one sample (NVML, /proc, cgroups, report).",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.samples = Counter(
            "vramguard_agent_samples",
            "Samples taken, by result.",
            ["result"],
            registry=self.registry,
        )
        self.writes = Counter(
            "vramguard_agent_report_writes",
            "NodeGPUUsage writes, by result.",
            ["result"],
            registry=self.registry,
        )
        self.last_sample = Gauge(
            "vramguard_agent_last_sample_timestamp_seconds",
            "Unix time of the last sample.",
            registry=self.registry,
        )
        self.memory_limit_calls = Counter(
            "vramguard_agent_memory_limit_calls",
            "NVML memory-limit calls (get, set, clear), by result.",
            ["operation", "result"],
            registry=self.registry,
        )
        self.last_write = Gauge(
            "vramguard_agent_last_report_timestamp_seconds",
            "Unix time of the last written report.",
            registry=self.registry,
        )
        self.healthy_devices = Gauge(
            "vramguard_agent_healthy_devices",
            "Devices that answered NVML in the last sample; 0 when the agent can read none (it is then not ready).",
            ["node"],
            registry=self.registry,
        )

    def current(self) -> Snapshot:
        """The latest snapshot (swapped whole, never mutated)."""
        with self._lock:
            return self.snapshot

    def update(self, snapshot: Snapshot) -> None:
        """Publish a new snapshot to the collector."""
        with self._lock:
            self.snapshot = snapshot

    def exposition(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)


@dataclass(slots=True)
class Health:
    """Liveness and readiness, updated by the sampling loop.

    Live while the loop has ticked within ``stale_after_s``; ready after the first
    sample and, when the agent talks to a cluster, after the first pod list, and
    only while the last sample could read a device (``unreadable`` says why not):
    an agent that can read no GPU (a wrong runtime class, no driver) must not
    roll out green.
    """

    stale_after_s: float
    clock: Callable[[], float] = time.monotonic
    last_tick: float | None = None
    sampled: bool = False
    pods_synced: Callable[[], bool] = lambda: True
    unreadable: str | None = None

    def tick(self) -> None:
        """The loop is alive."""
        self.last_tick = self.clock()

    def live(self) -> tuple[bool, str]:
        """(ok, message) for /healthz."""
        if self.last_tick is None:
            return True, "starting"
        age = self.clock() - self.last_tick
        return (age <= self.stale_after_s, f"last loop {age:.1f}s ago")

    def ready(self) -> tuple[bool, str]:
        """(ok, message) for /readyz."""
        if not self.sampled:
            return False, "no sample yet"
        if not self.pods_synced():
            return False, "pods not listed yet"
        if self.unreadable is not None:
            return False, f"no GPU device can be read: {self.unreadable}"
        return True, "ok"


def serve(address: str, metrics: AgentMetrics, health: Health) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on ``host:port`` in a daemon thread."""
    host, _, port = address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, message = health.live() if path == "/healthz" else health.ready()
                self._send(200 if ok else 503, (message + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - signature of the base class
            log.debug("http: " + format, *args)

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
