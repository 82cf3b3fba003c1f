"""Events: core/v1 Event bodies, their correlation and posting, and the
explanation of each decision (the Event on the pod and on the budget, and its
count in the metrics).

Events come from component ``vramguard``. An Event that explains one
occurrence of something (a step, a recovery, an eviction of one violation:
``EventSpec.key``) has a name that follows from that key and its object, so
posting it again (a retry, or a restarted operator finding it unposted)
updates the one Event instead of adding another. Other Events are counted:
a repeat (same object, reason and message) raises the count of the existing
one, as client-go's event correlator does. Posting never raises: an Event is
an explanation, not an action; it says whether the Event is there.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from vramguard_api import API_VERSION
from vramguard_operator.controller import crashpoints
from vramguard_operator.controller.kubeapi import MERGE_PATCH, NETWORK_ERRORS, api_error_text, error_text, to_model
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine.types import BudgetRef, Decision, EventSpec, ObjectProblem, PodRef
from vramguard_operator.policy.implicit import is_implicit

log = logging.getLogger("vramguard.actions")

COMPONENT = "vramguard"
MAX_EVENT_MESSAGE = 1024

EVENT_THROTTLE_FAILED = "ThrottleFailed"
EVENT_RESTORE_FAILED = "RestoreFailed"
EVENT_EVICTION_BLOCKED = "EvictionBlocked"
EVENT_EVICTION_RATE_LIMITED = "EvictionRateLimited"
EVENT_ACTION_FAILED = "ActionFailed"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (core/v1 ObjectReference)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def to_api(self) -> dict[str, str]:
        """The ObjectReference as the API spells it (namespace left out for a
        cluster-scoped object, uid when unknown)."""
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


def pod_object(ref: PodRef) -> ObjectRef:
    """The ObjectReference of a pod."""
    return ObjectRef("v1", "Pod", ref.namespace, ref.name, ref.uid)


def budget_object(ref: BudgetRef) -> ObjectRef:
    """The ObjectReference of a GPUMemoryBudget."""
    return ObjectRef(API_VERSION, "GPUMemoryBudget", ref.namespace, ref.name, ref.uid)


def problem_object(p: ObjectProblem) -> ObjectRef:
    """The ObjectReference of the object an ``ObjectProblem`` is about."""
    api_version = "v1" if p.kind == "Pod" else API_VERSION
    return ObjectRef(api_version, p.kind, p.namespace, p.name, p.uid)


EVENT_NAMESPACE_CLUSTER = "default"
"""Where Events about cluster-scoped objects go (as kubectl and client-go put them)."""


def event_namespace(obj: ObjectRef) -> str:
    """The namespace of an Event about ``obj``."""
    return obj.namespace or EVENT_NAMESPACE_CLUSTER


def keyed_name(obj: ObjectRef, key: str) -> str:
    """The name of the Event ``key`` on ``obj``: the object's name and 16 hex
    digits of a SHA-256 of the object and the key (client-go's ``<name>.<hex>``
    form; a DNS subdomain of at most 253 characters)."""
    digest = hashlib.sha256("|".join((obj.kind, obj.namespace, obj.uid or obj.name, key)).encode()).hexdigest()
    return f"{obj.name[:200].rstrip('.-')}.{digest[:16]}"


def _stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    obj: ObjectRef, spec: EventSpec, now: datetime, instance: str, name: str
) -> dict[str, Any]:
    """A core/v1 Event about ``obj`` (message cut to 1024 characters)."""
    stamp = _stamp(now)
    return {
        "metadata": {"name": name, "namespace": event_namespace(obj)},
        "involvedObject": obj.to_api(),
        "reason": spec.reason,
        "message": spec.message[:MAX_EVENT_MESSAGE],
        "type": spec.type,
        "source": {"component": COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
    }


@dataclass(slots=True)
class _Seen:
    name: str
    namespace: str
    count: int
    first: datetime


class EventCorrelator:
    """Remembers recent Events so that a repeat updates the existing Event
    (count + 1, new lastTimestamp) instead of creating another one.

    Keyed by (involved object uid or name, type, reason, message); the memory is
    bounded (least recently used out) and entries expire after ``window_seconds``.
    """

    def __init__(self, window_seconds: float = 600.0, size: int = 4096) -> None:
        self.window = window_seconds
        self.size = size
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()

    @staticmethod
    def key(obj: ObjectRef, spec: EventSpec) -> tuple[str, ...]:
        """The identity of an Event for correlation."""
        return (obj.namespace, obj.uid or obj.name, spec.type, spec.reason, spec.message)

    def previous(self, key: tuple[str, ...], now: datetime) -> _Seen | None:
        """The remembered Event for ``key``, if any and recent."""
        seen = self._seen.get(key)
        if seen is None or (now - seen.first).total_seconds() > self.window:
            self._seen.pop(key, None)
            return None
        self._seen.move_to_end(key)
        return seen

    def remember(self, key: tuple[str, ...], name: str, namespace: str, now: datetime) -> None:
        """Remember a newly created Event."""
        self._seen[key] = _Seen(name, namespace, 1, now)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)

    def forget(self, key: tuple[str, ...]) -> None:
        """Forget the Event of ``key`` (it is gone from the API server)."""
        self._seen.pop(key, None)


class EventRecorder:
    """Posts core/v1 Events (source component ``vramguard``)."""

    def __init__(
        self,
        core: client.CoreV1Api,
        instance: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        timeout_seconds: float = 10.0,
    ) -> None:
        self.core = core
        self.instance = instance or socket.gethostname()
        self.clock = clock
        self.correlator = EventCorrelator()
        self.timeout = timeout_seconds  # a hung Event post must not stall the actions
        self._keyed: OrderedDict[str, None] = OrderedDict()  # keyed Events posted by this process

    def post(self, obj: ObjectRef, spec: EventSpec) -> bool:
        """Create the Event (or update it, for a keyed one), or count a repeat on
        the existing one. Returns whether the Event is there; failures are
        logged, never raised: an Event is an explanation, not an action."""
        if spec.key is not None:
            return self._post_keyed(obj, spec, spec.key)
        now = self.clock()
        key = self.correlator.key(obj, spec)
        seen = self.correlator.previous(key, now)
        try:
            if seen is not None:
                self._count_repeat(seen, now)
            else:
                self._create(obj, spec, now, key)
        except ApiException as err:
            if seen is not None and err.status == 404:  # expired meanwhile: start afresh
                self.correlator.forget(key)
                return self.post(obj, spec)
            self._log_failure(obj, spec, api_error_text(err))
            return False
        except NETWORK_ERRORS as err:
            self._log_failure(obj, spec, error_text(err))
            return False
        return True

    def _log_failure(self, obj: ObjectRef, spec: EventSpec, text: str) -> None:
        # a namespace being deleted refuses new Events: expected, not worth a warning
        level = logging.DEBUG if "being terminated" in text else logging.WARNING
        log.log(level, "Event %s on %s %s/%s: %s", spec.reason, obj.kind, obj.namespace, obj.name, text)

    def _post_keyed(self, obj: ObjectRef, spec: EventSpec, key: str) -> bool:
        """Create the Event named after ``key``; when it exists already (posted
        before a crash, or by a retry), update its message and lastTimestamp
        instead (the count stays: it is the same occurrence)."""
        name = keyed_name(obj, key)
        if name in self._keyed:
            return True
        now = self.clock()
        try:
            try:
                self._create_named(obj, spec, now, name)
            except ApiException as err:
                if err.status != 409:
                    raise
                self.core.patch_namespaced_event(
                    name,
                    event_namespace(obj),
                    {"message": spec.message[:MAX_EVENT_MESSAGE], "lastTimestamp": _stamp(now)},
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                )
        except ApiException as err:
            self._log_failure(obj, spec, api_error_text(err))
            return False
        except NETWORK_ERRORS as err:
            self._log_failure(obj, spec, error_text(err))
            return False
        self._keyed[name] = None
        while len(self._keyed) > self.correlator.size:
            self._keyed.popitem(last=False)
        return True

    def _count_repeat(self, seen: _Seen, now: datetime) -> None:
        seen.count += 1
        self.core.patch_namespaced_event(
            seen.name,
            seen.namespace,
            {"count": seen.count, "lastTimestamp": _stamp(now)},
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )

    def _create(self, obj: ObjectRef, spec: EventSpec, now: datetime, key: tuple[str, ...]) -> None:
        name = f"{obj.name}.{time.time_ns():x}"
        self._create_named(obj, spec, now, name)
        self.correlator.remember(key, name, event_namespace(obj), now)

    def _create_named(self, obj: ObjectRef, spec: EventSpec, now: datetime, name: str) -> None:
        body = event_body(obj, spec, now, self.instance, name)
        self.core.create_namespaced_event(
            event_namespace(obj),
            to_model(client.CoreV1Event, body),
            _preload_content=False,
            _request_timeout=self.timeout,
        )


class DecisionEvents:
    """Explains decisions: the Event on the pod (if any) and on the budget (if
    it is an object), and the count in ``vramguard_actions_total``."""

    def __init__(self, recorder: EventRecorder, metrics: Metrics) -> None:
        self.recorder = recorder
        self.metrics = metrics

    def explain(self, d: Decision, spec: EventSpec) -> bool:
        """Post ``spec`` on the decision's pod and budget; whether both are there."""
        posted = True
        if d.pod is not None:
            posted = self.recorder.post(pod_object(d.pod), spec)
            crashpoints.reached("after-pod-event")
        if d.budget.name and not is_implicit(d.budget.uid):  # an implicit budget is no object
            posted = self.recorder.post(budget_object(d.budget), spec) and posted
            crashpoints.reached("after-budget-event")
        return posted

    def failed(self, d: Decision, text: str) -> None:
        """An ``ActionFailed`` Event: the decision's action was not done, and why."""
        msg = f"budget {d.budget.namespace}/{d.budget.name}: {d.action} not done: {text}"
        self.explain(d, EventSpec("Warning", EVENT_ACTION_FAILED, msg))

    def count(self, d: Decision, result: str) -> None:
        """Count the decision's action with ``result`` in its namespace."""
        ns = d.pod.namespace if d.pod is not None else d.budget.namespace
        self.metrics.action(d.action, result, ns)


class ProblemReports:
    """Reports ``ObjectProblem``s: a Warning Event on the object and a count in
    ``vramguard_object_problems_total``, once per object and problem (an
    object held for hours is reported once, not at every evaluation; a
    restart reports it again, under the same Event name)."""

    def __init__(self, recorder: EventRecorder, metrics: Metrics, size: int = 4096) -> None:
        self.recorder = recorder
        self.metrics = metrics
        self.size = size
        self._done: OrderedDict[tuple[str, str, str, str], None] = OrderedDict()

    def report(self, p: ObjectProblem) -> None:
        """Post and count ``p`` unless it was reported already (an implicit budget
        is no object: only logged)."""
        if p.kind == "GPUMemoryBudget" and is_implicit(p.uid):
            return
        seen = (p.kind, p.uid or f"{p.namespace}/{p.name}", p.reason, p.message)
        if seen in self._done:
            self._done.move_to_end(seen)
            return
        key = f"problem|{p.reason}|{hashlib.sha256(p.message.encode()).hexdigest()[:16]}"
        if not self.recorder.post(problem_object(p), EventSpec("Warning", p.reason, p.message, key)):
            return  # retried at the next evaluation
        self.metrics.object_problem(p.kind, p.reason)
        self._done[seen] = None
        while len(self._done) > self.size:
            self._done.popitem(last=False)
