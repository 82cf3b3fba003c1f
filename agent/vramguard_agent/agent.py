"""The agent's run loop: a step on a fixed interval (read a sample, apply
memory limits, report), metrics, publishing.

Each tick reads one sample (``Sampler.read``: only reads), applies the pods'
memory limits (``CapEnforcer.reconcile``: the step's only writes to the node),
builds the report, swaps the metrics snapshot, asks the pure
``publish.decide`` whether to write, and writes through the ``Reporter``.
Nothing raised by a sample or a write ends the loop: errors are logged,
counted in metrics, and the next tick comes on time. The GPU backend is found
by name (``backends``): the agent imports no simulator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramguard_api.ends import acknowledged_id, ends_of
from vramguard_api.history import HistoryStore

from . import backends
from .caps import CapEnforcer
from .config import AgentConfig
from .gpu import GPUBackend
from .memory import CgroupMemoryReader
from .metrics import AgentMetrics, Health, Snapshot, serve
from .nvml_limits import NVMLMemoryLimits
from .pods import PodIndex, PodWatcher
from .publish import Digest, decide, digest
from .reporter import Reporter
from .sampler import Sampler, SampleResult

log = logging.getLogger(__name__)

__all__ = ["Agent", "AgentConfig", "Components", "build"]  # AgentConfig: config's, named here too


@dataclass(slots=True)
class Components:
    """What ``build`` assembles; ``close()`` releases it all."""

    sampler: Sampler
    backend: GPUBackend
    caps: CapEnforcer | None = None
    index: PodIndex | None = None
    watcher: PodWatcher | None = None
    reporter: Reporter | None = None
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def tick(self) -> SampleResult:
        """The agent's step without publishing: read a sample (reads only), apply the
        pods' memory limits (``caps``: NVML set/clear, only with enforcement on), and
        build the report from both."""
        reading = self.sampler.read()
        if self.caps is None:
            return self.sampler.report(reading)
        memory = self.sampler.memory
        limits = self.caps.reconcile(reading.gpu, reading.pods, memory.pod_cgroup_path, memory.version == 2)
        return self.sampler.report(reading, limits, enforce_caps=self.caps.enforce)

    def close(self) -> None:
        """Stop the watcher, shut the backend down, remove temporary files."""
        if self.watcher is not None:
            self.watcher.stop()
        self.backend.close()
        for fn in self.cleanup:
            fn()


def build(cfg: AgentConfig, api_client: Any | None = None, publish: bool = False) -> Components:
    """Assemble backend (``cfg.backend``, found by name), memory limits and sampler;
    with ``api_client`` also the pod watcher, and with ``publish`` the reporter that
    writes the NodeGPUUsage. Raises ``ValueError`` (one line) for a backend that is
    not installed or a configuration the backend cannot use."""
    kind = backends.load(cfg.backend)
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
    parts = kind.build(cfg, index.snapshot if index is not None else None)
    caps = CapEnforcer(
        NVMLMemoryLimits(parts.nvml),
        enforce=cfg.enforce_caps,
        pods_synced=index.synced.is_set if index is not None else (lambda: True),
        own_pod_uid=cfg.pod_uid,
        own_cgroup=own_cgroup(),
    )
    sampler = Sampler(
        parts.gpu,
        proc_root=parts.proc_root,
        memory=CgroupMemoryReader(parts.cgroup_root, refresh_s=cfg.ram_interval_s),
        history=HistoryStore(cfg.history_window_s, cfg.history_points, cfg.trend_interval_s),
        ram_history=HistoryStore(cfg.history_window_s, cfg.history_points, cfg.trend_interval_s),
        pods=parts.pods,
        container_names=parts.container_names,
        sample_interval_s=cfg.sample_interval_s,
        cache_key=parts.cache_key,
        history_clock=parts.history_clock,
        cgroups_needed=caps.cgroups_needed,
    )
    return Components(sampler, parts.gpu, caps, index, watcher, reporter, parts.cleanup)


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
        self.explained: str | None | bool = False  # the last ``unreadable`` an Event explained (False: none yet)
        caps = parts.caps
        if caps is not None:
            caps.on_operation = lambda op, result: self.metrics.memory_limit_calls.labels(op, result).inc()

    def step(self) -> SampleResult | None:
        """One tick: read a sample, apply memory limits, report (``Components.tick``),
        update metrics, publish when ``decide`` says so."""
        self.health.tick()
        started = time.perf_counter()
        try:
            result = self.parts.tick()
        except Exception:  # noqa: BLE001 - a bug in one sample must not stop the agent
            log.exception("sample failed")
            self.metrics.samples.labels("error").inc()
            return None
        self.metrics.sample_seconds.observe(time.perf_counter() - started)
        self.metrics.samples.labels("ok" if result.backend_error is None else "backend-unavailable").inc()
        self.metrics.last_sample.set(time.time())
        self.metrics.update(Snapshot(self.cfg.node_name, result.report, result.container_devices))
        self.metrics.healthy_devices.labels(self.cfg.node_name).set(sum(d.health == "Healthy" for d in result.report.devices))
        self.health.sampled = True
        self.health.unreadable = result.unreadable
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
            self._explain_health(result.unreadable)
            self.metrics.writes.labels("ok").inc()
            self.metrics.last_write.set(time.time())
        else:
            self.metrics.writes.labels("error").inc()

    def _explain_health(self, unreadable: str | None) -> None:
        """An Event on the report when the agent starts reading no device (Warning) or reads one again
        (Normal); once per change, not per write. The first report explains itself only when unreadable."""
        reporter = self.parts.reporter
        if reporter is None:
            return
        if unreadable is None and not isinstance(self.explained, str):  # readable, and nothing to take back
            self.explained = None
            return
        if unreadable is not None and isinstance(self.explained, str):  # explained already
            return
        if unreadable is not None:
            sent = reporter.event("Warning", "NoReadableDevice",
                                  f"no GPU device can be read on node {self.cfg.node_name} ({unreadable}): "
                                  "nothing on this node is measured or enforced, and the agent is not ready. "
                                  "Check the pod's runtime class and the NVIDIA driver, then the agent's log.")
        else:
            sent = reporter.event("Normal", "DevicesReadable",
                                  f"GPU devices can be read again on node {self.cfg.node_name}")
        if sent:
            self.explained = unreadable

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
