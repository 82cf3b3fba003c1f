"""Writes the node's ``NodeGPUUsage`` (cluster-scoped, named after the node).

The object is created once with ``spec.nodeName`` (and an owner reference to
the Node when the agent can read it, so the report goes when the node goes);
every report is a JSON merge patch of the ``status`` subresource (lists are
replaced whole; no resourceVersion, so no 409 conflicts from our own writes).
A 404 on the patch (someone deleted the object) re-creates it; a 409 on create
means it exists. Any other failure (5xx, 429, 422, a refused connection, a
timeout) is logged and retried on a later sample after an exponential backoff;
nothing here raises to the sampling loop.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from vramguard_api import GROUP, REPORTS, VERSION
from vramguard_api.usage import NodeGPUUsageStatus

log = logging.getLogger(__name__)

KIND = "NodeGPUUsage"
FIELD_MANAGER = "vramguard-agent"
DEFAULT_BACKOFF_S = 1.0
DEFAULT_MAX_BACKOFF_S = 60.0
REQUEST_TIMEOUT_S = 10.0


def backoff_delay(failures: int, base_s: float = DEFAULT_BACKOFF_S, max_s: float = DEFAULT_MAX_BACKOFF_S) -> float:
    """Delay after ``failures`` consecutive failures (>= 1): base * 2^(n-1), capped, seconds."""
    return min(max_s, base_s * 2 ** max(0, failures - 1))


def manifest(node_name: str, node_uid: str | None = None) -> dict[str, Any]:
    """The NodeGPUUsage object created for ``node_name`` (status is patched separately)."""
    metadata: dict[str, Any] = {
        "name": node_name,
        "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER},
    }
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {"nodeName": node_name},
    }


class Reporter:
    """Publishes statuses for one node through a ``CustomObjectsApi``.

    ``core_v1`` (optional) reads the Node for the owner reference. ``publish``
    returns True when the status was written, False when it failed or is
    waiting out a backoff; it never raises an API or network error.
    """

    def __init__(
        self,
        custom_api: Any,
        node_name: str,
        core_v1: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff_s: float = DEFAULT_BACKOFF_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        jitter: float = 0.1,
    ) -> None:
        self.api = custom_api
        self.node_name = node_name
        self.core_v1 = core_v1
        self.clock = clock
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.jitter = jitter
        self.failures = 0
        self.retry_at = 0.0
        self.last_error: str | None = None
        self.writes = 0
        self.last_object: Any = None
        self._created = False

    def publish(self, status: NodeGPUUsageStatus, omit: tuple[str, ...] = ()) -> bool:
        """Write ``status``; see the class docstring. The status fields named in
        ``omit`` (API names) are left out of the merge patch, so the API server
        keeps what it has for them."""
        now = self.clock()
        if now < self.retry_at:
            return False
        try:
            self._write(status, omit)
        except Exception as err:  # noqa: BLE001 - API, HTTP and socket errors alike: retry later
            self._failed(err, now)
            return False
        self.failures, self.retry_at, self.last_error = 0, 0.0, None
        self.writes += 1
        return True

    def event(self, kind: str, reason: str, message: str) -> bool:
        """Post a core/v1 Event (``kind`` Normal or Warning) about this node's report, in the
        ``default`` namespace (where Events of cluster-scoped objects go, as for Nodes).
        True when written; False without ``core_v1`` or on any API error (logged, never raised)."""
        if self.core_v1 is None:
            return False
        now = datetime.now(UTC).isoformat()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{self.node_name}.", "namespace": "default"},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": self.node_name},
            "type": kind, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER, "host": self.node_name},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.core_v1.create_namespaced_event("default", body, _request_timeout=REQUEST_TIMEOUT_S,
                                                 _preload_content=False)  # the answer is not needed
        except Exception as err:  # noqa: BLE001 - an Event is an explanation, never a reason to stop
            log.warning("Event %s on NodeGPUUsage %s not written: %s", reason, self.node_name, _describe(err))
            return False
        return True

    def _failed(self, err: Exception, now: float) -> None:
        self.failures += 1
        delay = backoff_delay(self.failures, self.backoff_s, self.max_backoff_s)
        delay *= 1 + random.uniform(0, self.jitter)
        self.retry_at = now + delay
        self.last_error = _describe(err)
        log.warning(
            "writing NodeGPUUsage %s failed (%s); retrying in %.1fs",
            self.node_name,
            self.last_error,
            delay,
        )

    def _write(self, status: NodeGPUUsageStatus, omit: tuple[str, ...] = ()) -> None:
        if not self._created:
            self._create()
        body = {"status": {k: v for k, v in status.to_api().items() if k not in omit}}
        try:
            self._patch(body)
        except Exception as err:
            if getattr(err, "status", None) != 404:
                raise
            log.info("NodeGPUUsage %s is gone; re-creating it", self.node_name)
            self._created = False
            self._create()
            self._patch(body)

    def _patch(self, body: dict[str, Any]) -> None:
        # The response is the object written: it carries the operator's acknowledgement (vramguard_api.ends).
        self.last_object = self.api.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            REPORTS,
            self.node_name,
            body,
            field_manager=FIELD_MANAGER,
            _request_timeout=REQUEST_TIMEOUT_S,
        )

    def _create(self) -> None:
        try:
            self.api.create_cluster_custom_object(
                GROUP,
                VERSION,
                REPORTS,
                manifest(self.node_name, self._node_uid()),
                field_manager=FIELD_MANAGER,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except Exception as err:
            if getattr(err, "status", None) != 409:  # AlreadyExists is what we wanted
                raise
        self._created = True

    def _node_uid(self) -> str | None:
        if self.core_v1 is None:
            return None
        try:
            node = self.core_v1.read_node(self.node_name, _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - the owner reference is optional
            log.info("cannot read Node %s for the owner reference: %s", self.node_name, _describe(err))
            return None
        return getattr(getattr(node, "metadata", None), "uid", None)


def _describe(err: BaseException) -> str:
    status = getattr(err, "status", None)
    if status is not None:
        return f"HTTP {status} {getattr(err, 'reason', '')}".strip()
    return f"{type(err).__name__}: {err}"
