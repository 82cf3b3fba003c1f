"""Helpers of the hardening end-to-end tests (issue 17): a report publisher that
keeps a node's report fresh (and survives an API server that does not answer),
a recorder of every version of a namespace's pods (to prove the order of the
steps on them), the Events of one object by reason, the local cluster's etcd
process, and a state key file."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from .operator_harness import Usage, events_about, publish

CACHE = Path(os.environ.get("VG_CACHE", Path.home() / ".cache" / "vramguard"))


class Publisher:
    """Publishes ``usages()`` as ``node``'s report every ``period`` seconds, as a
    running agent does; an API error (an outage) is counted and retried."""

    def __init__(self, custom: client.CustomObjectsApi, node: str, usages: Callable[[], Iterable[Usage]],
                 period: float = 1.5) -> None:
        self.custom, self.node, self.usages, self.period = custom, node, usages, period
        self.failures = 0
        self.slowest = 0.0  # seconds, the longest a write took (an outage: no answer)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"publish-{node}")

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                publish(self.custom, self.node, self.usages())
            except Exception:  # an outage: the agent retries at its next sample
                self.failures += 1
            self.slowest = max(self.slowest, time.monotonic() - started)
            self._stop.wait(self.period)


@dataclass(frozen=True)
class PodVersion:
    """One version of a pod as a watch delivered it."""

    name: str
    resource_version: int
    cpu_limit: str | None
    steps: tuple[str | None, ...]
    terminating: bool
    deleted: bool


class PodHistory:
    """Every version of the pods of a namespace, from a watch started before the
    test acts (a watch that breaks, as in an outage, is resumed)."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.versions: list[PodVersion] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"pods-{namespace}")

    def __enter__(self) -> PodHistory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(self.core.list_namespaced_pod, self.namespace, timeout_seconds=5,
                                              resource_version=rv, _request_timeout=10)
                for ev in stream:
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    self.versions.append(_version(pod, ev["type"] == "DELETED"))
                    if self._stop.is_set():
                        return
            except Exception:  # an outage, or an expired resourceVersion: list again
                rv = None
                self._stop.wait(0.5)

    def of(self, name: str) -> list[PodVersion]:
        """The versions of one pod, in resourceVersion order, each once."""
        seen: dict[int, PodVersion] = {}
        for v in self.versions:
            if v.name == name:
                seen[v.resource_version] = v
        return [seen[k] for k in sorted(seen)]


def _version(pod: Any, deleted: bool) -> PodVersion:
    text = (pod.metadata.annotations or {}).get("vramguard.io/violations")
    steps = tuple(r.get("step") for r in json.loads(text)) if text else ()
    limits = pod.spec.containers[0].resources.limits or {}
    return PodVersion(pod.metadata.name, int(pod.metadata.resource_version), limits.get("cpu"), steps,
                      pod.metadata.deletion_timestamp is not None, deleted)


def event_counts(core: client.CoreV1Api, namespace: str, uid: str) -> dict[str, list[int]]:
    """The Events about one object: by reason, the count of each Event object."""
    out: dict[str, list[int]] = {}
    for e in events_about(core, namespace, uid):
        out.setdefault(e.reason, []).append(e.count or 1)
    return out


def in_order(core: client.CoreV1Api, namespace: str, uid: str, reasons: Iterable[str]) -> bool:
    """Whether the Events of ``reasons`` about one object were first posted in
    that order (Event times have a resolution of one second: equal is in order)."""
    first: dict[str, Any] = {}
    for e in events_about(core, namespace, uid):
        first.setdefault(e.reason, e.first_timestamp)
    times = [first[r] for r in reasons]
    return all(a is not None and b is not None and a <= b for a, b in zip(times, times[1:], strict=False))


def etcd_pid() -> int | None:
    """The pid of the local cluster's etcd (kwokctl's binary runtime), None when unknown."""
    workdir = Path(os.environ.get("KWOK_WORKDIR", CACHE / "kwok"))
    name = os.environ.get("VG_CLUSTER_NAME", "vramguard")
    path = workdir / "clusters" / name / "pids" / "etcd.pid"
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def state_key_file() -> str:
    """A file holding a state key (as the chart's Secret mounts it)."""
    fd, path = tempfile.mkstemp(prefix="vramguard-state-key-")
    os.write(fd, os.urandom(24).hex().encode())
    os.close(fd)
    return path
