"""Names of the pods on this node, from the API server.

The agent watches only its own node's pods (field selector ``spec.nodeName``)
and keeps, per pod uid: namespace, name, QoS class, container names by
container id (``status.containerStatuses[].containerID`` is
``<runtime>://<64 hex>``), and for static pods the config hash that their
cgroups carry (the mirror pod's ``kubernetes.io/config.mirror`` annotation).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vramguard_api.memlimits import MEMORY_LIMITS_ANNOTATION

log = logging.getLogger(__name__)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# Extended resources that mean "this pod uses a GPU".
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "gpu.intel.com/", "amd.com/gpu")


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What the report needs from a Pod object.

    ``containers`` maps a 64-hex container id to the container's name;
    ``config_hash`` is set for static pods; ``gpu`` is True when a container
    requests or is limited on an NVIDIA (or other GPU) extended resource;
    ``memory_limits`` is the raw ``vramguard.io/memory-limits`` annotation (parsed
    where it is applied, so that a bad one is reported on its pod).
    """

    uid: str
    namespace: str
    name: str
    qos_class: str | None = None
    containers: Mapping[str, str] = field(default_factory=dict)
    config_hash: str | None = None
    gpu: bool = False
    memory_limits: str | None = None


def container_id(value: str | None) -> str | None:
    """The id in ``containerd://<id>`` (or ``cri-o://``, ``docker://``); None if absent."""
    if not value:
        return None
    return value.split("://", 1)[-1] or None


def pod_meta(pod: Mapping[str, Any]) -> PodMeta:
    """Build ``PodMeta`` from a Pod as a JSON dict (the API's camelCase).

    Raises ``KeyError`` naming the missing field when metadata.uid, namespace or
    name is absent.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    for key in ("uid", "namespace", "name"):
        if not meta.get(key):
            raise KeyError(f"pod metadata.{key} is missing")
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
        *(status.get("ephemeralContainerStatuses") or []),
    ]
    containers = {cid: s["name"] for s in statuses if (cid := container_id(s.get("containerID"))) and s.get("name")}
    qos = status.get("qosClass")
    annotations = meta.get("annotations") or {}
    return PodMeta(
        uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        qos_class=qos.lower() if qos else None,
        containers=containers,
        config_hash=annotations.get(MIRROR_ANNOTATION),
        gpu=_requests_gpu(spec),
        memory_limits=annotations.get(MEMORY_LIMITS_ANNOTATION),
    )


def _requests_gpu(spec: Mapping[str, Any]) -> bool:
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = c.get("resources") or {}
        names = [*(resources.get("limits") or {}), *(resources.get("requests") or {})]
        if any(n.startswith(GPU_RESOURCE_PREFIXES) for n in names):
            return True
    return False


class PodIndex:
    """Thread-safe map of this node's pods by uid and by static-pod config hash."""

    def __init__(self, pods: Iterable[PodMeta] = ()) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, PodMeta] = {}
        self.synced = threading.Event()
        self.replace(pods)

    def replace(self, pods: Iterable[PodMeta]) -> None:
        """Replace the whole index (after a list)."""
        with self._lock:
            self._by_uid = {p.uid: p for p in pods}

    def put(self, pod: PodMeta) -> None:
        """Add or update one pod."""
        with self._lock:
            self._by_uid = {**self._by_uid, pod.uid: pod}

    def remove(self, uid: str) -> None:
        """Forget one pod."""
        with self._lock:
            self._by_uid = {k: v for k, v in self._by_uid.items() if k != uid}

    def snapshot(self) -> dict[str, PodMeta]:
        """Pods keyed by uid and, for static pods, also by config hash."""
        pods = self._by_uid  # replaced, never mutated: a consistent view
        result = dict(pods)
        for pod in pods.values():
            if pod.config_hash:
                result.setdefault(pod.config_hash, pod)
        return result

    def __len__(self) -> int:
        return len(self._by_uid)


class PodWatcher:
    """Lists and watches the pods of ``node_name`` into a ``PodIndex``, in a thread.

    Errors (API down, 410 Gone, bad events) are logged and retried with
    exponential backoff from ``backoff_s`` to ``max_backoff_s``; the thread never
    dies on them. ``index.synced`` is set after the first successful list.
    """

    def __init__(
        self,
        core_v1: Any,
        node_name: str,
        index: PodIndex | None = None,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        watch_timeout_s: int = 300,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.core_v1 = core_v1
        self.node_name = node_name
        self.index = index if index is not None else PodIndex()
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.watch_timeout_s = watch_timeout_s
        self.on_change = on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None

    @property
    def field_selector(self) -> str:
        """Only this node's pods."""
        return f"spec.nodeName={self.node_name}"

    def start(self) -> None:
        """Start the watch thread (a daemon)."""
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and wait for the thread."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def list_once(self) -> str:
        """List the node's pods into the index; returns the list's resourceVersion."""
        response = self.core_v1.list_pod_for_all_namespaces(field_selector=self.field_selector, _preload_content=False)
        body = json.loads(response.data)
        pods = []
        for item in body.get("items") or []:
            try:
                pods.append(pod_meta(item))
            except KeyError as err:
                log.warning("skipping pod: %s", err)
        self.index.replace(pods)
        self.index.synced.set()
        self._changed()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _run(self) -> None:
        delay = self.backoff_s
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self.list_once()
                resource_version = self._watch_from(resource_version)
                delay = self.backoff_s
            except Exception as err:  # noqa: BLE001 - any API or network error: relist later
                if getattr(err, "status", None) == 410:
                    log.info("pod watch expired (410 Gone); relisting")
                    resource_version = None
                    continue
                log.warning("pod watch failed (%s); retrying in %.1fs", err, delay)
                resource_version = None
                self._stop.wait(delay)
                delay = min(self.max_backoff_s, delay * 2)

    def _watch_from(self, resource_version: str) -> str:
        from kubernetes import watch

        self._watch = watch.Watch()
        stream = self._watch.stream(
            self.core_v1.list_pod_for_all_namespaces,
            field_selector=self.field_selector,
            resource_version=resource_version,
            timeout_seconds=self.watch_timeout_s,
            allow_watch_bookmarks=True,
            deserialize=False,
        )
        for event in stream:
            if self._stop.is_set():
                break
            resource_version = self._apply(event) or resource_version
        return resource_version

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        """Apply one watch event; returns its resourceVersion."""
        kind, obj = event.get("type"), event.get("object") or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            return version
        try:
            meta = pod_meta(obj)
        except KeyError as err:
            log.warning("ignoring %s event: %s", kind, err)
            return version
        if kind == "DELETED":
            self.index.remove(meta.uid)
        elif kind in ("ADDED", "MODIFIED"):
            self.index.put(meta)
        self._changed()
        return version
