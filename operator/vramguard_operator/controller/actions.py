"""Carrying out the policy engine's decisions through the Kubernetes API.

The engine (``engine.evaluate``) decides; this module acts, in the order that
``engine_types`` documents, so that the escalation state on the objects is
always written before the action it describes:

- annotations: a JSON merge patch on the pod, with ``metadata.uid`` as a
  precondition (a pod recreated under the same name is never touched);
- throttle and restore: a strategic merge patch on the ``pods/resize``
  subresource (in-place CPU resize); a refusal becomes a ``ThrottleFailed`` or
  ``RestoreFailed`` Event and a note in the budget's status;
- evict: the Eviction API (``policy/v1`` Eviction), so PodDisruptionBudgets are
  respected; HTTP 429 becomes an ``EvictionBlocked`` Event and a later retry,
  never a plain delete; evictions are rate-limited by token buckets (one per
  GPUMemoryPolicy, from its ``evictionRateLimit``) and never made in an exempt
  namespace;
- Events: core/v1 Events from component ``vramguard`` on the pod and on the
  budget; a repeat of the same Event (same object, reason and message) raises
  the count of the existing one, as client-go's event correlator does;
- budget status: a JSON merge patch on the ``status`` subresource, only when the
  desired status differs from the current one.

Request bodies, the rate limiter and the event correlator are pure and
unit-tested; ``KubeActions``, ``EventRecorder`` and ``Applier`` do the I/O with
the synchronous kubernetes client (the reconciler runs them in a worker thread).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine.types import (
    Annotate,
    BudgetRef,
    BudgetStatusUpdate,
    ContainerCPU,
    Decision,
    DryRunStep,
    EngineOutput,
    EventSpec,
    Evict,
    PodRef,
    Recover,
    Throttle,
    Warn,
)
from vramguard_operator.policy.implicit import is_implicit

log = logging.getLogger("vramguard.actions")

COMPONENT = "vramguard"
GROUP = "vramguard.io"
VERSION = "v1alpha1"
BUDGETS = "gpumemorybudgets"

EVENT_THROTTLE_FAILED = "ThrottleFailed"
EVENT_RESTORE_FAILED = "RestoreFailed"
EVENT_EVICTION_BLOCKED = "EvictionBlocked"
EVENT_EVICTION_RATE_LIMITED = "EvictionRateLimited"
EVENT_ACTION_FAILED = "ActionFailed"

MERGE_PATCH = "application/merge-patch+json"
NETWORK_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)
"""Errors of a request that got no answer from the API server (connection
refused or reset, timeouts: urllib3's errors and ``OSError``, which covers
``socket.timeout``). The actions treat them as a 5xx: logged, counted
``failed``, retried by a later evaluation; never raised."""
API_ERRORS: tuple[type[Exception], ...] = (ApiException, *NETWORK_ERRORS)
"""A refusal by the API server (``ApiException``) or no answer at all."""
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MAX_EVENT_MESSAGE = 1024


# --- pure request bodies ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (core/v1 ObjectReference)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def to_api(self) -> dict[str, str]:
        """The ObjectReference as the API spells it (uid left out when unknown)."""
        ref = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }
        if self.uid:
            ref["uid"] = self.uid
        return ref


def pod_object(ref: PodRef) -> ObjectRef:
    """The ObjectReference of a pod."""
    return ObjectRef("v1", "Pod", ref.namespace, ref.name, ref.uid)


def budget_object(ref: BudgetRef) -> ObjectRef:
    """The ObjectReference of a GPUMemoryBudget."""
    return ObjectRef(f"{GROUP}/{VERSION}", "GPUMemoryBudget", ref.namespace, ref.name, ref.uid)


def annotations_patch(ref: PodRef, annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """JSON merge patch setting (``None``: removing) pod annotations.

    ``metadata.uid`` makes it conditional: the API server refuses to change a
    uid, so a pod deleted and recreated under the same name is left alone."""
    return {"metadata": {"uid": ref.uid, "annotations": dict(annotations)}}


def resize_patch(ref: PodRef, containers: Iterable[ContainerCPU]) -> dict[str, Any]:
    """Strategic merge patch for ``pods/resize``: each container's CPU limit and,
    where given, request (containers merge by name; memory is left alone)."""
    specs = []
    for c in containers:
        resources: dict[str, Any] = {"limits": {"cpu": c.limit}}
        if c.request is not None:
            resources["requests"] = {"cpu": c.request}
        specs.append({"name": c.name, "resources": resources})
    return {"metadata": {"uid": ref.uid}, "spec": {"containers": specs}}


def eviction_body(ref: PodRef) -> dict[str, Any]:
    """A policy/v1 Eviction of the pod, with its uid as precondition."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": ref.name, "namespace": ref.namespace},
        "deleteOptions": {"preconditions": {"uid": ref.uid}},
    }


def event_body(
    obj: ObjectRef, spec: EventSpec, now: datetime, instance: str, name: str
) -> dict[str, Any]:
    """A core/v1 Event about ``obj`` (message cut to 1024 characters)."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {"name": name, "namespace": obj.namespace},
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


def merge_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``current`` into ``desired``:
    changed keys with their new values (objects recursively), removed keys as
    ``None``; lists and scalars are replaced whole."""
    cur = current or {}
    patch: dict[str, Any] = {k: None for k in cur if k not in desired}
    for key, want in desired.items():
        have = cur.get(key)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            sub = merge_patch(have, want)
            if sub:
                patch[key] = sub
        elif have != want or key not in cur:
            patch[key] = want
    return patch


def api_error_text(err: ApiException) -> str:
    """``"HTTP 422 Invalid: <message>"`` from an API error (its Status body when
    it has one)."""
    reason, message = err.reason or "", ""
    try:
        status = json.loads(err.body or "")
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict):
        reason = status.get("reason") or reason
        message = status.get("message") or ""
        causes = (status.get("details") or {}).get("causes") or ()
        extra = "; ".join(c.get("message", "") for c in causes if c.get("message"))
        if extra and extra not in message:
            message = f"{message} ({extra})" if message else extra
    text = f"HTTP {err.status} {reason}".strip()
    return f"{text}: {message}" if message else text


def error_text(err: Exception) -> str:
    """``api_error_text`` for an API error; ``"<type>: <message>"`` (cut to 300
    characters) for a network error."""
    if isinstance(err, ApiException):
        return api_error_text(err)
    return f"{type(err).__name__}: {err}"[:300]


def error_status(err: Exception) -> int | None:
    """The HTTP status of an API error; None for a request with no answer."""
    return err.status if isinstance(err, ApiException) else None


# --- rate limiting ----------------------------------------------------------------


class TokenBucket:
    """A token bucket: at most ``burst`` tokens, refilled at ``per_minute / 60``
    tokens per second (``per_minute`` 0: never refilled). Times are seconds on
    a monotonic clock, passed in by the caller."""

    def __init__(self, per_minute: float, burst: int, now: float) -> None:
        if per_minute < 0 or burst < 1:
            raise ValueError(f"evictionRateLimit: perMinute {per_minute} / burst {burst} invalid")
        self.per_minute = float(per_minute)
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(float(self.burst), self.tokens + elapsed * self.per_minute / 60.0)
        self.stamp = max(self.stamp, now)

    def available(self, now: float) -> bool:
        """Whether a token can be taken at ``now``."""
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> None:
        """Take one token (call ``available`` first; never goes below zero)."""
        self._refill(now)
        self.tokens = max(0.0, self.tokens - 1.0)

    def refund(self, now: float) -> None:
        """Give back a token taken for a call that was definitely refused
        (never above ``burst``)."""
        self._refill(now)
        self.tokens = min(float(self.burst), self.tokens + 1.0)

    def reconfigure(self, per_minute: float, burst: int, now: float) -> None:
        """New rate and burst; the tokens held are kept, capped at the new burst."""
        self._refill(now)
        self.per_minute, self.burst = float(per_minute), burst
        self.tokens = min(self.tokens, float(burst))


class EvictionLimiter:
    """Decides whether an eviction may be attempted now.

    Scopes name token buckets: one per GPUMemoryPolicy (its name) and the
    default scope ``""`` (the operator's own limit) for namespaces that no policy
    selects; an eviction takes one token from every scope given. After a
    PodDisruptionBudget refused a pod's eviction (429) the pod waits
    ``retry_seconds`` before the next attempt.

    Tokens are taken before the Eviction is sent (``taken``) and given back
    only when the API server definitely refused it (``refund``: 404, 409,
    429): a call that timed out may have evicted the pod, so its token stays
    spent. Nothing is persisted: a restarted operator starts with full buckets
    (``burst`` tokens each), so a crash-looping operator could evict up to
    ``burst`` pods per start and scope; the restart back-off of the kubelet
    and the Deployment bound that.
    """

    DEFAULT_SCOPE = ""

    def __init__(
        self,
        default: EvictionRateLimit,
        retry_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.retry_seconds = retry_seconds
        self.buckets: dict[str, TokenBucket] = {
            self.DEFAULT_SCOPE: TokenBucket(default.per_minute, default.burst, clock())
        }
        self.retry_at: dict[str, float] = {}

    def configure(self, limits: Mapping[str, EvictionRateLimit]) -> None:
        """Keep one bucket per policy in ``limits`` (policy name -> its limit)."""
        now = self.clock()
        for name in [n for n in self.buckets if n != self.DEFAULT_SCOPE and n not in limits]:
            del self.buckets[name]
        for name, lim in limits.items():
            bucket = self.buckets.get(name)
            if bucket is None:
                self.buckets[name] = TokenBucket(lim.per_minute, lim.burst, now)
            elif (bucket.per_minute, bucket.burst) != (float(lim.per_minute), lim.burst):
                bucket.reconfigure(lim.per_minute, lim.burst, now)

    def check(self, uid: str, scopes: Sequence[str]) -> str | None:
        """None when pod ``uid`` may be evicted now (the caller then calls
        ``taken``), else why not: ``"backoff"`` or ``"rate_limited"``."""
        now = self.clock()
        if self.retry_at.get(uid, 0.0) > now:
            return "backoff"
        buckets = [self.buckets.get(s) or self.buckets[self.DEFAULT_SCOPE] for s in scopes]
        if not all(b.available(now) for b in buckets):
            return "rate_limited"
        return None

    def taken(self, uid: str, scopes: Sequence[str]) -> None:
        """Take a token from every scope for an eviction about to be sent."""
        now = self.clock()
        for s in scopes:
            (self.buckets.get(s) or self.buckets[self.DEFAULT_SCOPE]).take(now)
        self.retry_at.pop(uid, None)

    def refund(self, scopes: Sequence[str]) -> None:
        """Give the tokens of an eviction the API server refused back."""
        now = self.clock()
        for s in scopes:
            (self.buckets.get(s) or self.buckets[self.DEFAULT_SCOPE]).refund(now)

    def blocked(self, uid: str) -> None:
        """Record a refusal (429): retry the pod after ``retry_seconds``."""
        self.retry_at[uid] = self.clock() + self.retry_seconds

    def forget(self, live_uids: Iterable[str]) -> None:
        """Drop back-off state of pods that are gone."""
        live = set(live_uids)
        for uid in [u for u in self.retry_at if u not in live]:
            del self.retry_at[uid]


# --- events ---------------------------------------------------------------------------


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

    def post(self, obj: ObjectRef, spec: EventSpec) -> None:
        """Create the Event, or count a repeat on the existing one. Failures are
        logged, never raised: an Event is an explanation, not an action."""
        now = self.clock()
        key = self.correlator.key(obj, spec)
        seen = self.correlator.previous(key, now)
        try:
            if seen is not None:
                seen.count += 1
                stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                self.core.patch_namespaced_event(
                    seen.name,
                    seen.namespace,
                    {"count": seen.count, "lastTimestamp": stamp},
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                )
                return
            name = f"{obj.name}.{time.time_ns():x}"
            body = event_body(obj, spec, now, self.instance, name)
            self.core.create_namespaced_event(
                obj.namespace,
                _model(client.CoreV1Event, body),
                _preload_content=False,
                _request_timeout=self.timeout,
            )
            self.correlator.remember(key, name, obj.namespace, now)
        except ApiException as err:
            if seen is not None and err.status == 404:  # expired meanwhile: start afresh
                self.correlator._seen.pop(key, None)
                self.post(obj, spec)
                return
            text = api_error_text(err)
            # a namespace being deleted refuses new Events: expected, not worth a warning
            level = logging.DEBUG if "being terminated" in text else logging.WARNING
            log.log(level, "Event %s on %s %s/%s: %s", spec.reason, obj.kind, obj.namespace,
                    obj.name, text)
        except NETWORK_ERRORS as err:
            log.warning("Event %s on %s %s/%s: %s", spec.reason, obj.kind, obj.namespace,
                        obj.name, error_text(err))


# --- API calls ------------------------------------------------------------------------


M = TypeVar("M")


def _model(cls: type[M], body: Mapping[str, Any]) -> M:
    """The kubernetes client's model of a request body (its typed API methods
    validate their arguments)."""
    model = cls.from_dict(dict(body))  # type: ignore[attr-defined]
    if model is None:
        raise ValueError(f"{cls.__name__}: empty body")
    return model


class KubeActions:
    """The API calls of the actions, each returning the object the API server
    returned (a JSON dict) and raising ``ApiException`` on failure."""

    def __init__(self, api: client.ApiClient, timeout_seconds: float = 10.0) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        # Short request timeouts: a hung call must not stall every later decision.
        self.timeout = timeout_seconds

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        data = json.loads(resp.data or b"{}")
        return data if isinstance(data, dict) else {}

    def patch_pod_annotations(
        self, ref: PodRef, annotations: Mapping[str, str | None]
    ) -> dict[str, Any]:
        """Merge-patch the pod's annotations (uid precondition); returns the pod."""
        resp = self.core.patch_namespaced_pod(
            ref.name,
            ref.namespace,
            annotations_patch(ref, annotations),
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )
        return self._json(resp)

    def resize_pod(self, ref: PodRef, containers: Sequence[ContainerCPU]) -> dict[str, Any]:
        """Change CPU limits/requests in place through ``pods/resize``; returns the pod."""
        resp = self.core.patch_namespaced_pod_resize(
            ref.name,
            ref.namespace,
            resize_patch(ref, containers),
            _content_type=STRATEGIC_MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )
        return self._json(resp)

    def evict_pod(self, ref: PodRef) -> None:
        """Create a policy/v1 Eviction (HTTP 429 when a PodDisruptionBudget refuses)."""
        self.core.create_namespaced_pod_eviction(
            ref.name,
            ref.namespace,
            _model(client.V1Eviction, eviction_body(ref)),
            _preload_content=False,
            _request_timeout=self.timeout,
        )

    def patch_budget_status(self, ref: BudgetRef, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a GPUMemoryBudget's status subresource; returns the budget."""
        resp = self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            ref.namespace,
            BUDGETS,
            ref.name,
            {"status": dict(patch)},
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )
        return self._json(resp)


# --- applying an engine output -----------------------------------------------------------


def _reapply(d: Decision) -> bool:
    """Whether ``d`` re-applies a throttle that fired earlier (its resize did not
    take): resized again, without a new Event or action count."""
    return bool(getattr(d, "reapply", False))


@dataclass(slots=True)
class PodWork:
    """Everything one engine output asks for one pod, in apply order: restores
    (then the patch, only if they succeed), or the patch first; then throttles,
    evictions, and the Events of the other decisions."""

    pod: PodRef
    patch: Mapping[str, str | None] | None = None
    restores: list[Recover] = field(default_factory=list)
    throttles: list[Throttle] = field(default_factory=list)
    evicts: list[Evict] = field(default_factory=list)
    others: list[Decision] = field(default_factory=list)


def plan_pod_work(out: EngineOutput) -> tuple[list[PodWork], list[Decision]]:
    """Group an engine output by pod (sorted by namespace/name), and return the
    budget-level decisions (no pod: Events on the budget only) apart."""
    work: dict[str, PodWork] = {}
    budget_only: list[Decision] = []

    def of(ref: PodRef) -> PodWork:
        return work.setdefault(ref.uid, PodWork(ref))

    for p in out.pod_patches:
        of(p.pod).patch = p.annotations
    for d in out.decisions:
        if d.pod is None:
            budget_only.append(d)
        elif isinstance(d, Recover) and d.restore:
            of(d.pod).restores.append(d)
        elif isinstance(d, Throttle):
            of(d.pod).throttles.append(d)
        elif isinstance(d, Evict):
            of(d.pod).evicts.append(d)
        else:
            of(d.pod).others.append(d)
    ordered = sorted(work.values(), key=lambda w: (w.pod.namespace, w.pod.name, w.pod.uid))
    return ordered, budget_only


def merged_resize(decisions: Iterable[Throttle | Recover]) -> tuple[ContainerCPU, ...]:
    """The containers of several throttles or restores of one pod, one per name
    (the last wins), sorted by name."""
    by_name: dict[str, ContainerCPU] = {}
    for d in decisions:
        for c in d.resize if isinstance(d, Throttle) else d.restore:
            by_name[c.name] = c
    return tuple(by_name[n] for n in sorted(by_name))


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """What the applier needs besides the output: the exempt namespaces (a safety
    check of its own: never act there), the eviction rate-limit scopes of each
    namespace, and each budget's current status (API form, None when unset)."""

    exempt_namespaces: frozenset[str]
    eviction_scopes: Callable[[str], tuple[str, ...]]
    current_status: Mapping[tuple[str, str], Mapping[str, Any] | None]


@dataclass(slots=True)
class ApplyResult:
    """Objects the API server returned (pods by uid, budgets by (ns, name)), so the
    next evaluation sees them before their watch events arrive; resize failures
    by pod uid, for the budget status."""

    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    budgets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    resize_errors: dict[str, str] = field(default_factory=dict)
    resize_ok: set[str] = field(default_factory=set)


class Applier:
    """Applies engine outputs with ``KubeActions``, posts their Events and counts
    them in the metrics."""

    def __init__(
        self,
        actions: KubeActions,
        recorder: EventRecorder,
        limiter: EvictionLimiter,
        metrics: Metrics,
    ) -> None:
        self.actions = actions
        self.recorder = recorder
        self.limiter = limiter
        self.metrics = metrics

    # -- entry point

    def apply(self, out: EngineOutput, ctx: ApplyContext) -> ApplyResult:
        """Apply one output: pods first (each in the documented order), then the
        budget-level Events, then the budget statuses that changed."""
        result = ApplyResult()
        work, budget_only = plan_pod_work(out)
        for w in work:
            if w.pod.namespace in ctx.exempt_namespaces:
                w = self._exempt_work(w)
            self._apply_pod(w, ctx, result)
        for d in budget_only:
            self._explain(d, d.event)
            self._count_decision(d, "success")
        return result

    def write_statuses(
        self, statuses: Iterable[BudgetStatusUpdate], ctx: ApplyContext, result: ApplyResult
    ) -> None:
        """Write each budget's desired status when it differs from the current one."""
        for upd in statuses:
            key = (upd.budget.namespace, upd.budget.name)
            current = ctx.current_status.get(key)
            desired = upd.status.to_api()
            if current is not None and dict(current) == desired:
                continue
            try:
                budget = self.actions.patch_budget_status(upd.budget, merge_patch(current, desired))
            except API_ERRORS as err:
                if error_status(err) != 404:  # a deleted budget needs no status
                    log.warning("status of budget %s/%s: %s", *key, error_text(err))
                continue
            result.budgets[key] = budget

    # -- one pod

    def _exempt_work(self, w: PodWork) -> PodWork:
        """What may be done to a pod in an exempt namespace: cleanup only.

        The engine never asks to throttle or evict there, nor to write new
        vramguard state; those are refused (the safety check of this layer).
        Undoing what was done before the namespace was exempted is allowed: CPU
        restores and a patch that only removes annotations."""
        adds = any(v is not None for v in (w.patch or {}).values())
        refused: list[Decision] = [*w.throttles, *w.evicts]
        others = list(w.others)
        if adds:  # no restore without the patch that records it; Events of the rest only
            refused += [*w.restores, *(d for d in others if isinstance(d, Annotate))]
            others = [d for d in others if not isinstance(d, Annotate)]
        if not refused and not adds:
            return w
        what = sorted({d.action for d in refused} | ({"annotation"} if adds else set()))
        log.error("refusing %s on pod %s/%s: exempt namespace", ", ".join(what),
                  w.pod.namespace, w.pod.name)
        for d in refused:
            self._count_decision(d, "skipped")
        if adds:
            return PodWork(w.pod, others=others)
        return PodWork(w.pod, patch=w.patch, restores=list(w.restores), others=others)

    def _apply_pod(self, w: PodWork, ctx: ApplyContext, result: ApplyResult) -> None:
        if w.restores:
            if not self._resize(w.pod, merged_resize(w.restores), w.restores, result):
                return  # the patch keeps the originals, so the restore is retried
        if w.patch and not self._patch(w, result):
            return  # no action without its state written first
        for rec in w.restores:
            self._explain(rec, rec.event)
            self._count_decision(rec, "success")
        if w.throttles:
            self._throttle(w, result)
        for ev in w.evicts[:1]:
            self._evict(ev, ctx)
        for other in w.others:
            self._explain(other, other.event)
            self._count_decision(other, "dry_run" if isinstance(other, DryRunStep) else "success")

    def _patch(self, w: PodWork, result: ApplyResult) -> bool:
        assert w.patch is not None
        try:
            result.pods[w.pod.uid] = self.actions.patch_pod_annotations(w.pod, w.patch)
            return True
        except API_ERRORS as err:
            text = error_text(err)
            log.warning("annotations of pod %s/%s: %s", w.pod.namespace, w.pod.name, text)
            if error_status(err) not in (404, 409, 422):  # gone or replaced: nothing to explain
                for d in (*w.throttles, *w.evicts, *w.others):
                    if not isinstance(d, DryRunStep | Warn):
                        self._failed(d, f"annotating pod {w.pod.name} failed: {text}")
            self._count(w, "failed")
            return False

    def _resize(
        self,
        pod: PodRef,
        containers: Sequence[ContainerCPU],
        decisions: Sequence[Throttle | Recover],
        result: ApplyResult,
    ) -> bool:
        try:
            result.pods[pod.uid] = self.actions.resize_pod(pod, containers)
            result.resize_ok.add(pod.uid)
            return True
        except API_ERRORS as err:
            text = error_text(err)
            restore = isinstance(decisions[0], Recover)
            what = "restoring the CPU of" if restore else "throttling"
            log.warning("%s pod %s/%s: %s", what, pod.namespace, pod.name, text)
            if error_status(err) in (404, 409):
                return False
            refused = "refused" if isinstance(err, ApiException) else "failed"
            result.resize_errors[pod.uid] = f"resize {refused}: {text}"
            reason = EVENT_RESTORE_FAILED if restore else EVENT_THROTTLE_FAILED
            cpu = ", ".join(f"{c.name}={c.limit}" for c in containers)
            for d in decisions:
                if _reapply(d):  # noted in the status; its Event was posted when it fired
                    continue
                msg = (
                    f"budget {d.budget.namespace}/{d.budget.name}: {what} pod {pod.name} "
                    f"(CPU limit {cpu}) through pods/resize failed: {text}"
                )
                self._explain(d, EventSpec("Warning", reason, msg))
                self.metrics.action(d.action, "failed", pod.namespace)
            return False

    def _throttle(self, w: PodWork, result: ApplyResult) -> None:
        """Resize for the throttles; Events and counts only for steps that fired
        now (a re-application of a throttle whose resize did not take is silent)."""
        possible = [t for t in w.throttles if t.impossible_reason is None and t.resize]
        for t in w.throttles:
            if _reapply(t):
                continue
            if t.impossible_reason is not None:
                self._explain(t, t.event)
                self.metrics.action("Throttle", "impossible", w.pod.namespace)
            elif not t.resize:  # already at or below the throttled limit
                self._explain(t, t.event)
                self.metrics.action("Throttle", "success", w.pod.namespace)
        if possible and self._resize(w.pod, merged_resize(possible), possible, result):
            for t in possible:
                if not _reapply(t):
                    self._explain(t, t.event)
                    self.metrics.action("Throttle", "success", w.pod.namespace)

    def _evict(self, d: Evict, ctx: ApplyContext) -> None:
        assert d.pod is not None
        ns = d.pod.namespace
        if ns in ctx.exempt_namespaces:  # _exempt_work removed it already; defence in depth
            self.metrics.action("Evict", "skipped", ns)
            return
        scopes = ctx.eviction_scopes(ns)
        why = self.limiter.check(d.pod.uid, scopes)
        if why == "backoff":
            self.metrics.action("Evict", "backoff", ns)
            return
        if why == "rate_limited":
            msg = (
                f"budget {d.budget.namespace}/{d.budget.name}: eviction of pod {d.pod.name} "
                f"delayed by the eviction rate limit ({', '.join(s or 'default' for s in scopes)})"
            )
            self._explain(d, EventSpec("Warning", EVENT_EVICTION_RATE_LIMITED, msg))
            self.metrics.action("Evict", "rate_limited", ns)
            return
        # The token is spent before the call: an eviction that timed out may
        # have happened. Only a definite refusal gives it back.
        self.limiter.taken(d.pod.uid, scopes)
        try:
            self.actions.evict_pod(d.pod)
        except API_ERRORS as err:
            if error_status(err) in (404, 409, 429):
                self.limiter.refund(scopes)
            self._evict_refused(d, err)
            return
        self._explain(d, d.event)
        self.metrics.action("Evict", "success", ns)

    def _evict_refused(self, d: Evict, err: Exception) -> None:
        assert d.pod is not None
        text = error_text(err)
        status = error_status(err)
        if status in (404, 409):  # gone, or replaced by a pod with another uid
            log.info("eviction of %s/%s: %s", d.pod.namespace, d.pod.name, text)
            return
        blocked = status == 429  # a PodDisruptionBudget: expected, retried
        log.log(logging.INFO if blocked else logging.WARNING, "eviction of %s/%s: %s",
                d.pod.namespace, d.pod.name, text)
        self.limiter.blocked(d.pod.uid)
        reason = EVENT_EVICTION_BLOCKED if blocked else EVENT_ACTION_FAILED
        msg = (
            f"budget {d.budget.namespace}/{d.budget.name}: eviction of pod {d.pod.name} "
            f"{'refused' if status is not None else 'failed'} ({text}); "
            f"retrying in {self.limiter.retry_seconds:g}s"
        )
        self._explain(d, EventSpec("Warning", reason, msg))
        self.metrics.action("Evict", "blocked" if blocked else "failed", d.pod.namespace)

    # -- explanations and counts

    def _explain(self, d: Decision, spec: EventSpec) -> None:
        """The Event on the pod (if any) and on the budget (if it has a name)."""
        if d.pod is not None:
            self.recorder.post(pod_object(d.pod), spec)
        if d.budget.name and not is_implicit(d.budget.uid):  # an implicit budget is no object
            self.recorder.post(budget_object(d.budget), spec)

    def _failed(self, d: Decision, text: str) -> None:
        msg = f"budget {d.budget.namespace}/{d.budget.name}: {d.action} not done: {text}"
        self._explain(d, EventSpec("Warning", EVENT_ACTION_FAILED, msg))

    def _count_decision(self, d: Decision, result: str) -> None:
        ns = d.pod.namespace if d.pod is not None else d.budget.namespace
        self.metrics.action(d.action, result, ns)

    def _count(self, w: PodWork, result: str) -> None:
        for d in (*w.restores, *w.throttles, *w.evicts, *w.others):
            self._count_decision(d, result)
