"""The operator publishes every out-of-memory kill the agents record (``docs/oom.md``).

For each node report (``NodeGPUUsage``) whose ``status.ends`` holds records
newer than the report's ``vramguard.io/ends-acknowledged`` annotation, in id
order: read the pod (its container's terminated state and RAM limit; a GET per
end, ends are rare), judge it (``engine.oom.finding``, with the node's share of
each device), post the Event on the pod and on the budgets involved (the
victim's and those of the neighbours above their shares), count
``vramguard_oom_kills_total{namespace, kind, verdict}`` and the victim's
budgets' ``status.oomKills`` (at least once, like the Events: a record
published again after a failed acknowledgement is counted again), then write
the last id into the annotation, so the agent drops the records. A failure before the
acknowledgement publishes again on the next report: at least once, and a
repeated Event is the same keyed Event updated (``EventRecorder``).

Runs on its own thread from the informers' changes (``observe``), so API
calls never hold up the reconcile loop.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Counter

from vramguard_api import BUDGETS, GROUP, REPORTS, VERSION
from vramguard_api.budget import OOM_KILLS_FIELD, OOMKills
from vramguard_api.ends import ACK_ANNOTATION, EndRecord, acknowledged_id
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.controller.events import EventRecorder, budget_object, pod_object
from vramguard_operator.controller.kubeapi import API_ERRORS, MERGE_PATCH, NETWORK_ERRORS, api_error_text
from vramguard_operator.engine.keys import BudgetRef, PodRef
from vramguard_operator.engine.oom import Finding, budget_event, finding, pod_event
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.plan.entries import Versioned
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.pressure import device_shares

log = logging.getLogger("vramguard.oom")
SETTLE_S = 30.0  # how long a record waits for the kubelet to report its container terminated


def settled(record: EndRecord, pod: Mapping[str, Any] | None, now: datetime) -> bool:
    """Whether the record can be judged: its pod is gone, or its container is
    reported terminated (or no longer listed), or ``SETTLE_S`` have passed since
    the agent noticed the end. The agent samples faster than the kubelet
    relists its containers, so the container can still show as running."""
    if pod is None or record.container_id is None or (now - record.time).total_seconds() >= SETTLE_S:
        return True
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        if str(cs.get("containerID") or "").endswith(record.container_id):
            return "running" not in (cs.get("state") or {}) or record.kind == "CgroupOOMKill"
    return True


def oom_counter(registry: CollectorRegistry) -> Counter:
    """``vramguard_oom_kills_total``: OOM kills published, by namespace, kind and verdict."""
    return Counter("vramguard_oom_kills", "Out-of-memory kills of pods on GPU nodes, by kind and verdict "
                   "(GPUOutOfMemory, HostOutOfMemory, CapKill; Innocent, Own, Unknown, NotApplicable).",
                   ["namespace", "kind", "verdict"], registry=registry)


class OOMPublisher:
    """See the module docstring. ``nodes`` returns the GPU nodes' store (Node
    dicts by name) for the shares; ``budgets`` the budgets' store, for the
    Events on the budgets involved (the victim's, and those of the neighbours
    above their shares); ``timeout`` bounds each API call, seconds."""

    def __init__(self, api: client.ApiClient, recorder: EventRecorder, counter: Counter,
                 nodes: Callable[[], Mapping[str, Mapping[str, Any]]], timeout: float = 10.0,
                 budgets: Callable[[], Mapping[Any, Any]] = dict,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.recorder, self.counter, self.nodes, self.timeout = recorder, counter, nodes, timeout
        self.budgets = budgets  # the budgets' store (Versioned[BudgetEntry] by (namespace, name))
        self.clock = clock
        self.queue: queue.Queue[NodeGPUUsage | None] = queue.Queue()
        self.acknowledged: dict[str, int] = {}  # report name -> last id acknowledged (what the annotation says)
        self.oom_kills: dict[tuple[str, str], OOMKills] = {}  # (namespace, budget) -> the counts last written

    def observe(self, change: Any) -> None:
        """An informer change: queue a node report that carries end records."""
        new = getattr(change, "new", None)
        if getattr(change, "kind", None) == "reports" and isinstance(new, Versioned):
            report = new.value
            if isinstance(report, NodeGPUUsage) and report.status is not None and report.status.ends:
                self.queue.put(report)

    def run(self, stop: threading.Event) -> None:
        """Publish queued reports until ``stop`` (a None in the queue wakes it)."""
        while not stop.is_set():
            report = self.queue.get()
            if report is not None:
                try:
                    self.publish(report)
                except Exception:  # noqa: BLE001 - one bad report must not stop publishing
                    log.exception("publishing the OOM records of %s failed", report.metadata.name)

    def publish(self, report: NodeGPUUsage) -> list[Finding]:
        """Publish the report's unacknowledged records, in order, up to the first
        whose container the kubelet has not yet reported terminated (it is
        published on a later pass, ``SETTLE_S`` at the latest); returns the findings."""
        name = report.metadata.name or ""
        annotation = acknowledged_id({"metadata": {"annotations": report.metadata.annotations}})
        acked = max(self.acknowledged.get(name, 0), annotation)
        new = sorted((r for r in (report.status.ends if report.status else []) if r.id > acked), key=lambda r: r.id)
        shares = self._shares(report) if new else {}
        found: list[Finding] = []
        for record in new:
            pod = self._pod(record)
            if not settled(record, pod, self.clock()):
                self.retry(report)
                break
            found.append(self._publish_one(record, pod, shares))
        if found and self._acknowledge(name, found[-1].record.id):
            self.acknowledged[name] = found[-1].record.id
        return found

    def retry(self, report: NodeGPUUsage) -> None:
        """Look at ``report`` again in a second (the kubelet's status is on its way)."""
        timer = threading.Timer(1.0, self.queue.put, [report])
        timer.daemon = True
        timer.start()

    def _publish_one(self, record: EndRecord, pod: dict[str, Any] | None, shares: Mapping[str, int]) -> Finding:
        f = finding(record, pod, shares)
        spec = pod_event(f)
        if spec is not None:
            meta = (pod or {}).get("metadata") or {}
            ref = PodRef(f.namespace or "", f.name or "", str(meta.get("uid") or record.pod_uid))
            if ref.namespace and ref.name:
                self.recorder.post(pod_object(ref), spec)
            self.counter.labels(*f.labels).inc()
            self._count_budgets(f, pod)
            self._post_budgets(f, pod)
            log.info("%s: %s", spec.reason, spec.message)
        return f

    def _count_budgets(self, f: Finding, pod: Mapping[str, Any] | None) -> None:
        """One more kill in ``status.oomKills`` of every budget selecting the
        victim (a merge patch of that field only). The counts start from the
        budget's status as the store holds it and go on from what this
        publisher last wrote, which the store may not show yet."""
        for ref in self._budgets_of(pod):
            key = (ref.namespace, ref.name)
            before = self.oom_kills.get(key) or self._stored_oom_kills(key)
            after = before.counted(f.verdict.kind, f.verdict.blame, f.record.time)
            try:
                self.custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, ref.namespace, BUDGETS, ref.name, {"status": {OOM_KILLS_FIELD: after.to_api()}},
                    _content_type=MERGE_PATCH, _request_timeout=self.timeout)
            except API_ERRORS as err:
                log.warning("cannot count the OOM kill in budget %s/%s: %s", *key, err)
                continue
            self.oom_kills[key] = after

    def _stored_oom_kills(self, key: tuple[str, str]) -> OOMKills:
        entry = getattr(self.budgets().get(key), "value", None)
        status = getattr(getattr(entry, "budget", None), "status", None)
        return (status.oom_kills if status is not None else None) or OOMKills()

    def _post_budgets(self, f: Finding, pod: Mapping[str, Any] | None) -> None:
        """The same Event on every budget selecting the victim or a neighbour above its share."""
        involved = [pod] + [self._read_pod(*n.name.split("/", 1)) for n in f.verdict.neighbours_above_share
                            if "/" in n.name]
        refs: dict[BudgetRef, None] = {}
        for p in involved:
            for ref in self._budgets_of(p):
                refs[ref] = None
        for ref in refs:
            spec = budget_event(f, f"{ref.namespace}/{ref.name}")
            if spec is not None:
                self.recorder.post(budget_object(ref), spec)

    def _budgets_of(self, pod: Mapping[str, Any] | None) -> list[BudgetRef]:
        meta = (pod or {}).get("metadata") or {}
        labels, ns = meta.get("labels") or {}, meta.get("namespace")
        out = []
        for versioned in self.budgets().values():
            entry = getattr(versioned, "value", None)
            budget = getattr(entry, "budget", None)
            if budget is None or entry.namespace != ns:  # type: ignore[union-attr]
                continue
            try:
                if compile_selector(budget.spec.selector)(labels):
                    out.append(BudgetRef(entry.namespace, entry.name, versioned.uid))  # type: ignore[union-attr]
            except ValueError:
                continue
        return out

    def _shares(self, report: NodeGPUUsage) -> dict[str, int]:
        node = (report.spec.node_name if report.spec else None) or report.metadata.name or ""
        body = self.nodes().get(node)
        return device_shares({node: NodeFacts.from_api(body, report)}) if body is not None else {}

    def _pod(self, record: EndRecord) -> dict[str, Any] | None:
        if not record.namespace or not record.name:
            return None
        body = self._read_pod(record.namespace, record.name)
        uid = (body or {}).get("metadata", {}).get("uid")
        return body if uid in (None, record.pod_uid) else None  # a new pod of the same name is not the one

    def _read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            pod = self.core.read_namespaced_pod(name, namespace, _request_timeout=self.timeout)
        except ApiException as err:
            if err.status != 404:
                log.warning("cannot read pod %s/%s: %s", namespace, name, api_error_text(err))
            return None
        except NETWORK_ERRORS as err:
            log.warning("cannot read pod %s/%s: %s", namespace, name, err)
            return None
        body: dict[str, Any] = self.core.api_client.sanitize_for_serialization(pod)
        return body

    def _acknowledge(self, name: str, last_id: int) -> bool:
        body = {"metadata": {"annotations": {ACK_ANNOTATION: str(last_id)}}}
        try:
            self.custom.patch_cluster_custom_object(GROUP, VERSION, REPORTS, name, body,
                                                    _request_timeout=self.timeout)
        except API_ERRORS as err:
            log.warning("cannot acknowledge the end records of %s: %s", name, err)
            return False
        return True
