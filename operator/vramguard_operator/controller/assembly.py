"""The parts of a running operator and their order: the informers
(``watches``), the reconcile thread (``reconcile``), the status writer
(``status_writer``) and, with ``--shards``, the shard Leases (``shards``).
``handlers.operator_startup`` builds one at kopf's startup and stops it at
its cleanup.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vramguard_operator.controller import dra_versions, watches
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.controller.applier import Applier
from vramguard_operator.controller.events import EventRecorder
from vramguard_operator.controller.informer import Informer
from vramguard_operator.controller.kubeapi import error_text
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.oom import OOMPublisher, oom_counter
from vramguard_operator.controller.reconcile import Reconciler
from vramguard_operator.controller.settings import OperatorSettings
from vramguard_operator.controller.shards import ShardConfig, ShardManager, shard_of
from vramguard_operator.controller.status_writer import StatusWriter
from vramguard_operator.plan.allocation_entries import DRA_GROUP, DRA_VERSION
from vramguard_operator.policy.ratelimit import EvictionLimiter

log = logging.getLogger("vramguard.operator")


def discover_dra(api: client.ApiClient) -> str | None:
    """The DRA version to read (``dra_versions``), logged; None when none is
    served (the informers then ask for v1, and a 404 keeps them empty: a
    cluster upgraded later is read within five minutes)."""
    try:
        version = dra_versions.pick_version(dra_versions.served_versions(api))
    except ApiException as err:
        log.warning("API discovery of %s failed (%s); reading %s", DRA_GROUP, error_text(err), DRA_VERSION)
        return DRA_VERSION
    (log.info if version else log.warning)("%s", dra_versions.describe(version))
    return version


def shard_config(settings: OperatorSettings) -> ShardConfig | None:
    """The shard settings, None without shards. Raises ``ValueError`` for a
    Lease duration too short for the request timeout."""
    if settings.shards <= 1:
        return None
    identity = settings.shard_identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    namespace = settings.lease_namespace or os.environ.get("POD_NAMESPACE") or "default"
    cfg = ShardConfig(settings.shards, identity, namespace, settings.lease_duration)
    cfg.check(settings.config.request_timeout)
    return cfg


class Operator:
    """Every part, built (``start`` starts them, ``stop`` stops them)."""

    def __init__(self, settings: OperatorSettings, api: client.ApiClient, metrics: Metrics) -> None:
        cfg = settings.config
        self.settings = settings
        sharding = shard_config(settings)
        self.shards = None if sharding is None else ShardManager(
            sharding, client.CoordinationV1Api(api), on_change=self._shards_changed)
        owned = self.shards.owns if self.shards is not None else (lambda ns: True)
        actions = KubeActions(api, timeout_seconds=cfg.request_timeout)
        limiter = EvictionLimiter(cfg.default_rate_limit, cfg.eviction_retry)
        recorder = EventRecorder(actions.core, timeout_seconds=cfg.request_timeout)
        self.applier = Applier(actions, recorder, limiter, metrics, fence=owned)
        self.writer = StatusWriter(self.applier, cfg.status_refresh, fence=owned, metrics=metrics)
        self.informers: dict[str, Informer[Any]] = {}
        self.reconciler = Reconciler(cfg, self.applier, metrics, self.writer,
                                     kinds=self._kinds(settings), owned=owned,
                                     watched=watches.matcher(settings.namespaces))
        self.writer.on_limits = self.reconciler.wrote_limits
        # OOM records (controller/oom.py) are published beside the reconcile loop, from the same changes.
        self.oom = OOMPublisher(api, recorder, oom_counter(metrics.registry), lambda: self.store("nodes"),
                                cfg.request_timeout, budgets=lambda: self.store("budgets"))
        dra_version = discover_dra(api)
        self.informers = watches.build(api, self._sink, settings.namespaces, cfg.unlabelled_pods,
                                       settings.watch_timeout, dra_version or DRA_VERSION)
        self.metrics = metrics
        metrics.shards.set(1 if self.shards is None else 0)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _sink(self, item: Any) -> None:
        self.reconciler.sink(item)
        self.oom.observe(item)

    @staticmethod
    def _kinds(settings: OperatorSettings) -> list[str]:
        kinds = [k for k in watches.ORDER if k != "pods-unlabelled"]
        return [*kinds, "pods-unlabelled"] if settings.config.unlabelled_pods else kinds

    def _shards_changed(self, held: frozenset[int]) -> None:
        """A shard gained: evaluate its namespaces from the API's state."""
        assert self.shards is not None
        n = self.shards.cfg.shards
        self.metrics.shards.set(len(held))
        self.applier.limiter.set_share(max(1, len(held)) / n)
        self.reconciler.gain(lambda ns: shard_of(ns, n) in held)

    def start(self) -> None:
        """Start the writer, the shards, the reconcile thread and the informers."""
        self.writer.start()
        if self.shards is not None:
            self.shards.start()
        loop = threading.Thread(target=self.reconciler.run, args=(self._stop,), name="vramguard-reconcile",
                                daemon=True)
        feed = threading.Thread(target=watches.start, args=(self.informers,), name="vramguard-watch-start",
                                daemon=True)
        oom = threading.Thread(target=self.oom.run, args=(self._stop,), name="vramguard-oom", daemon=True)
        self._threads = [loop, feed, oom]
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop deciding first, then writing, then the Leases (freed for the others)."""
        self._stop.set()
        self.reconciler.sink(("stop", None))  # wakes the loop
        self.oom.queue.put(None)  # wakes the OOM publisher
        for t in self._threads:
            t.join(timeout)
        for inf in self.informers.values():
            inf.stop()
        self.writer.stop()
        self.writer.join(timeout)
        self.writer.flush()  # what the last evaluations decided, before the Leases go
        if self.shards is not None:
            self.shards.stop()
            self.shards.join(timeout)

    def leads(self) -> bool:
        """Whether this replica does the cluster-wide work (policy statuses)."""
        return self.shards is None or self.shards.leads()

    def store(self, kind: str) -> dict[Any, Any]:
        """A copy of one informer's store (empty before it is built)."""
        inf = self.informers.get(kind)
        return {} if inf is None else dict(inf.store())
