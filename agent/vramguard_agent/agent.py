"""The agent's run loop: sample on a fixed interval, export metrics, publish.

Each tick takes one sample, swaps the metrics snapshot, asks the pure
``publish.decide`` whether to write, and writes through the ``Reporter``.
Nothing raised by a sample or a write ends the loop: errors are logged,
counted in metrics, and the next tick comes on time.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vramguard_api.ends import acknowledged_id, ends_of
from vramguard_api.history import DEFAULT_MAX_POINTS, DEFAULT_TREND_INTERVAL_S, DEFAULT_WINDOW_S, HistoryStore

from .caps import CapEnforcer
from .gpu import GPUBackend
from .memory import DEFAULT_REFRESH_S, CgroupMemoryReader
from .metrics import AgentMetrics, Health, Snapshot, serve
from .nvml_limits import NVMLMemoryLimits
from .pods import PodIndex, PodMeta, PodWatcher
from .publish import Digest, PublishPolicy, decide, digest
from .reporter import Reporter
from .sampler import Sampler, SampleResult

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_INTERVAL_S = 10.0
DEFAULT_METRICS_ADDRESS = ":9402"


@dataclass(slots=True)
class AgentConfig:
    """Settings of one agent (the CLI fills them from flags and the environment)."""

    node_name: str
    backend: Literal["nvml", "sim"] = "nvml"
    scenario: Path | None = None
    proc_root: Path | None = None
    cgroup_root: Path | None = None
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S
    policy: PublishPolicy = field(default_factory=PublishPolicy)
    history_window_s: float = DEFAULT_WINDOW_S
    history_points: int = DEFAULT_MAX_POINTS
    trend_interval_s: float = DEFAULT_TREND_INTERVAL_S
    ram_interval_s: float = DEFAULT_REFRESH_S
    metrics_address: str | None = DEFAULT_METRICS_ADDRESS
    kubeconfig: str | None = None
    sim_offset_s: float = 0.0
    sim_speed: float = 1.0
    sim_driver_state: Path | None = None
    enforce_caps: bool = False
    pod_uid: str | None = None
    simgpu_socket: Path | None = None


@dataclass(slots=True)
class Components:
    """What ``build`` assembles; ``close()`` releases it all."""

    sampler: Sampler
    backend: GPUBackend
    index: PodIndex | None = None
    watcher: PodWatcher | None = None
    reporter: Reporter | None = None
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Stop the watcher, shut the backend down, remove temporary files."""
        if self.watcher is not None:
            self.watcher.stop()
        self.backend.close()
        for fn in self.cleanup:
            fn()


def build(cfg: AgentConfig, api_client: Any | None = None, publish: bool = False) -> Components:
    """Assemble backend and sampler; with ``api_client`` also the pod watcher, and
    with ``publish`` the reporter that writes the NodeGPUUsage."""
    index: PodIndex | None = None
    watcher: PodWatcher | None = None
    reporter: Reporter | None = None
    if api_client is not None:
        from kubernetes import client

        core = client.CoreV1Api(api_client)
        index = PodIndex()
        watcher = PodWatcher(core, cfg.node_name, index)
        if publish:
            reporter = Reporter(client.CustomObjectsApi(api_client), cfg.node_name, core_v1=core)
    cleanup: list[Callable[[], None]] = []
    backend, proc_root, cgroup_root, pods, names = _backend(cfg, index, cleanup)

    def cache_key() -> object:
        # The simulated host re-homes pids when it learns pods' uids from the API.
        return getattr(backend, "identity_version", None)

    # A simulation keeps its history in scenario time (it may run faster than the clock).
    history_clock = getattr(backend, "now", None) if cfg.backend == "sim" else None

    caps = CapEnforcer(
        _memory_limits(backend),
        enforce=cfg.enforce_caps,
        pods_synced=index.synced.is_set if index is not None else (lambda: True),
        own_pod_uid=cfg.pod_uid,
        own_cgroup=own_cgroup(),
    )
    sampler = Sampler(
        backend,
        proc_root=proc_root,
        memory=CgroupMemoryReader(cgroup_root, refresh_s=cfg.ram_interval_s),
        history=HistoryStore(cfg.history_window_s, cfg.history_points, cfg.trend_interval_s),
        ram_history=HistoryStore(cfg.history_window_s, cfg.history_points, cfg.trend_interval_s),
        pods=pods,
        container_names=names,
        sample_interval_s=cfg.sample_interval_s,
        cache_key=cache_key,
        history_clock=history_clock,
        caps=caps,
    )
    return Components(sampler, backend, index, watcher, reporter, cleanup)


def own_cgroup(proc_self: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's cgroup v2 path (``0::/path``), as its cgroup namespace shows it;
    None on cgroup v1 or when unreadable. On a host it is the real path; in a pod
    with its own cgroup namespace it is ``/`` (the agent's pod uid names it there)."""
    try:
        lines = proc_self.read_text().splitlines()
    except OSError:
        return None
    paths = [line[3:] for line in lines if line.startswith("0::")]
    return paths[0] if len(lines) == 1 and paths and paths[0].startswith("/") else None


def _memory_limits(backend: GPUBackend) -> NVMLMemoryLimits:
    """Memory-limit calls over the NVML library the backend samples with (the fake's for sim)."""
    from .nvml import NVMLBackend

    nvml = backend if isinstance(backend, NVMLBackend) else backend.nvml  # type: ignore[attr-defined]
    return NVMLMemoryLimits(nvml.library)


def _backend(
    cfg: AgentConfig, index: PodIndex | None, cleanup: list[Callable[[], None]]
) -> tuple[GPUBackend, Path, Path, Callable[[], dict[str, PodMeta]], Callable[[], dict[str, str]]]:
    proc_root = cfg.proc_root or Path("/proc")
    cgroup_root = cfg.cgroup_root or Path("/sys/fs/cgroup")
    api_pods: Callable[[], dict[str, PodMeta]] = index.snapshot if index is not None else dict
    if cfg.backend == "nvml":
        from .nvml import NVMLBackend

        if cfg.simgpu_socket is not None:  # the real node's simulated driver, read through the same NVML calls
            from .drivernvml import DriverNVML

            return NVMLBackend(DriverNVML(cfg.simgpu_socket)), proc_root, cgroup_root, api_pods, dict
        return NVMLBackend(), proc_root, cgroup_root, api_pods, dict
    from .scenario import load_scenario
    from .sim import SimBackend

    if cfg.scenario is None:
        raise ValueError("backend sim: --scenario is required")
    node = load_scenario(cfg.scenario).node(cfg.node_name)
    host_root: Path | None = None
    if cfg.proc_root is None:
        # No tree given: the simulation writes its own fake host and removes it at the end.
        host_root = Path(tempfile.mkdtemp(prefix=f"vramguard-sim-{cfg.node_name}-"))
        cleanup.append(lambda: shutil.rmtree(host_root, ignore_errors=True))
        proc_root, cgroup_root = host_root / "proc", cfg.cgroup_root or host_root / "cgroup"
    sim = SimBackend(
        node, api_pods=api_pods, host_root=host_root, offset_s=cfg.sim_offset_s, speed=cfg.sim_speed,
        driver_state=cfg.sim_driver_state,
    )
    # Without an API server, the scenario's own names stand in for the API's.
    pods = api_pods if index is not None else sim.pod_metas
    return sim, proc_root, cgroup_root, pods, sim.container_names


class Agent:
    """The run loop over assembled ``Components``."""

    def __init__(self, cfg: AgentConfig, parts: Components, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.parts = parts
        self.clock = clock
        self.metrics = AgentMetrics(cfg.node_name)
        index = parts.index
        self.health = Health(
            stale_after_s=max(60.0, 3 * cfg.sample_interval_s),
            pods_synced=(index.synced.is_set if index is not None else (lambda: True)),
        )
        self.last_written: Digest | None = None
        self.last_written_at: float | None = None
        self.ends_written = 0  # the newest end record written
        self.ends_restored = False
        caps = parts.sampler.caps
        if caps is not None:
            caps.on_operation = lambda op, result: self.metrics.memory_limit_calls.labels(op, result).inc()

    def step(self) -> SampleResult | None:
        """One tick: sample, update metrics, publish when ``decide`` says so."""
        self.health.tick()
        started = time.perf_counter()
        try:
            result = self.parts.sampler.sample()
        except Exception:  # noqa: BLE001 - a bug in one sample must not stop the agent
            log.exception("sample failed")
            self.metrics.samples.labels("error").inc()
            return None
        self.metrics.sample_seconds.observe(time.perf_counter() - started)
        self.metrics.samples.labels("ok" if result.backend_error is None else "backend-unavailable").inc()
        self.metrics.last_sample.set(time.time())
        self.metrics.update(Snapshot(self.cfg.node_name, result.report, result.container_devices))
        self.health.sampled = True
        self._publish(result)
        return result

    def _publish(self, result: SampleResult) -> None:
        reporter = self.parts.reporter
        if reporter is None:
            return
        now = self.clock()
        ends = self.parts.sampler.ends
        current = digest(result.report)
        decision = decide(self.last_written, self.last_written_at, current, now, self.cfg.policy)
        if not decision.write and not ends.pending(self.ends_written):  # a new end is written at once
            return
        try:
            status = result.status
            status.ends = ends.published()
        except Exception:  # noqa: BLE001 - a report the API model refuses is a bug: log it, keep sampling
            log.exception("report not written: the API model refused it")
            self.metrics.writes.labels("error").inc()
            return
        # The first write leaves status.ends as the API server has it: its answer returns
        # what an earlier agent published and the operator has not acknowledged.
        if reporter.publish(status, omit=() if self.ends_restored else ("ends",)):
            log.debug("report written: %s", decision.reason or "end records")
            if not self.ends_restored:
                ends.restore(ends_of(reporter.last_object), acknowledged_id(reporter.last_object))
                self.ends_restored = True
            else:
                self.ends_written = ends.last_id
            ends.acknowledge(acknowledged_id(reporter.last_object))
            self.last_written, self.last_written_at = current, now
            self.metrics.writes.labels("ok").inc()
            self.metrics.last_write.set(time.time())
        else:
            self.metrics.writes.labels("error").inc()

    def run(self, stop: threading.Event) -> None:
        """Tick every ``sample_interval_s`` (fixed rate, no drift) until ``stop`` is set."""
        server = serve(self.cfg.metrics_address, self.metrics, self.health) if self.cfg.metrics_address else None
        if self.parts.watcher is not None:
            self.parts.watcher.start()
            # Give the first list a moment, so the first report carries pod names.
            self.parts.index.synced.wait(timeout=min(5.0, self.cfg.sample_interval_s))  # type: ignore[union-attr]
        next_tick = self.clock()
        try:
            while not stop.is_set():
                self.step()
                next_tick += self.cfg.sample_interval_s
                now = self.clock()
                if next_tick < now:  # a slow sample: skip the ticks it overran
                    next_tick = now
                stop.wait(next_tick - now)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()
            self.parts.close()
