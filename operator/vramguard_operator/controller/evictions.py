"""Evict: the Eviction API (``policy/v1`` Eviction with the pod's uid as
precondition), so PodDisruptionBudgets are respected.

Each attempt first asks the rate limiter (``ratelimit.EvictionLimiter``): not
within ``--eviction-retry`` of a refusal for that pod, and only with a token
from every bucket that applies. HTTP 429 (a PodDisruptionBudget) becomes an
``EvictionBlocked`` Event and a later retry, never a plain delete; a pod that
is gone or was replaced (404, 409) is left alone. Never in an exempt namespace. A device-pressure eviction falls
back to the next pod above its share on the device (``evict_first``).

The ``Evicting`` Events (pod and budget) are posted just before the Eviction
is sent, under the step's Event key: an evicted pod is gone at once (nothing
would be left to say that its Event is missing after a crash), and a retry
(after a 429, or a restart) updates the one Event instead of adding another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

from vramguard_api.steps import Action
from vramguard_operator.controller import crashpoints
from vramguard_operator.controller.events import (
    EVENT_ACTION_FAILED,
    EVENT_EVICTION_BLOCKED,
    EVENT_EVICTION_RATE_LIMITED,
    DecisionEvents,
)
from vramguard_operator.controller.kubeapi import API_ERRORS, error_status, error_text
from vramguard_operator.engine.types import EventSpec, Evict, PodRef
from vramguard_operator.policy.ratelimit import EvictionLimiter

log = logging.getLogger("vramguard.actions")

EvictCall = Callable[[PodRef], None]
"""The API call: create the pod's Eviction; raises one of ``kubeapi.API_ERRORS``."""

EvictOutcome = Literal["success", "gone", "skipped", "backoff", "rate_limited", "blocked", "failed"]
"""What became of one eviction: done, the pod gone or replaced (404, 409),
refused by this layer (exempt), waiting after a refusal, the rate limit, a
PodDisruptionBudget (429), or another error."""


_WHY: dict[EvictOutcome, str] = {
    "skipped": "exempt namespace",
    "backoff": "waiting to retry after a refusal",
    "rate_limited": "eviction rate limit",
    "blocked": "refused by a PodDisruptionBudget",
    "failed": "the API server refused",
    "success": "evicted",
    "gone": "gone",
}


def _about(d: Evict) -> str:
    """Whose eviction: ``budget ns/name``, or the device for a pod no budget
    selects (a device-pressure eviction)."""
    if d.budget.name:
        return f"budget {d.budget.namespace}/{d.budget.name}"
    return f"device pressure on {d.violation.device}"


def eviction_body(ref: PodRef) -> dict[str, Any]:
    """A policy/v1 Eviction of the pod, with its uid as precondition."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": ref.name, "namespace": ref.namespace},
        "deleteOptions": {"preconditions": {"uid": ref.uid}},
    }


class Evictor:
    """Evicts pods for Evict decisions, within the rate limits, and explains
    the outcome."""

    def __init__(self, evict_pod: EvictCall, limiter: EvictionLimiter, events: DecisionEvents) -> None:
        self.evict_pod = evict_pod
        self.limiter = limiter
        self.events = events

    def evict(self, d: Evict, exempt: bool, scopes: Sequence[str]) -> EvictOutcome:
        """Evict ``d.pod`` unless its namespace is ``exempt``, it is backing off
        after a refusal, or a rate-limit bucket of ``scopes`` is empty; returns
        what became of it."""
        assert d.pod is not None
        ns, metrics = d.pod.namespace, self.events.metrics
        if exempt:  # the applier removed it already; defence in depth
            metrics.action(Action.EVICT, "skipped", ns)
            return "skipped"
        why = self.limiter.check(d.pod.uid, scopes, ns)
        if why == "backoff":
            metrics.action(Action.EVICT, "backoff", ns)
            return "backoff"
        if why == "rate_limited":
            msg = (
                f"{_about(d)}: eviction of pod {d.pod.name} "
                f"delayed by the eviction rate limit ({', '.join(s or 'default' for s in scopes)})"
            )
            self.events.explain(d, EventSpec("Warning", EVENT_EVICTION_RATE_LIMITED, msg))
            metrics.action(Action.EVICT, "rate_limited", ns)
            return "rate_limited"
        # The token is spent before the call: an eviction that timed out may
        # have happened. Only a definite refusal gives it back.
        self.limiter.taken(d.pod.uid, scopes, ns)
        self.events.explain(d, d.event)
        crashpoints.reached("before-eviction")
        try:
            self.evict_pod(d.pod)
        except API_ERRORS as err:
            if error_status(err) in (404, 409, 429):
                self.limiter.refund(scopes)
            return self._refused(d, err)
        crashpoints.reached("after-eviction")
        metrics.action(Action.EVICT, "success", ns)
        return "success"

    def evict_first(
        self, d: Evict, exempt: Callable[[str], bool], scopes: Callable[[str], Sequence[str]]
    ) -> EvictOutcome:
        """Evict ``d.pod``, else (a device-pressure eviction) each of
        ``d.alternatives`` in rank order until one is evicted or gone. When none
        is and something was refused (back-offs alone are waited out quietly),
        ``d.exhausted`` goes on ``d``'s pod and budget with what became of each:
        the device will run out. ``exempt``/``scopes``: by namespace."""
        tried: list[tuple[Evict, EvictOutcome]] = []
        for e in (d, *d.alternatives):
            assert e.pod is not None
            ns = e.pod.namespace
            outcome = self.evict(e, exempt(ns), () if exempt(ns) else scopes(ns))
            if outcome in ("success", "gone"):
                if e.violation.kind == "DevicePressure":
                    self.events.metrics.pressure_event("evicted" if outcome == "success" else "gone", ns)
                return outcome
            tried.append((e, outcome))
        if d.exhausted is not None and any(o != "backoff" for _, o in tried):
            why = "; ".join(f"{e.pod.name if e.pod else '?'}: {_WHY[o]}" for e, o in tried)
            spec = d.exhausted
            self.events.explain(d, EventSpec(spec.type, spec.reason, f"{spec.message} Tried: {why}."))
            self.events.metrics.pressure_event("exhausted", d.pod.namespace if d.pod else "")
        return tried[-1][1]

    def _refused(self, d: Evict, err: Exception) -> EvictOutcome:
        assert d.pod is not None
        text = error_text(err)
        status = error_status(err)
        if status in (404, 409):  # gone, or replaced by a pod with another uid
            log.info("eviction of %s/%s: %s", d.pod.namespace, d.pod.name, text)
            return "gone"
        blocked = status == 429  # a PodDisruptionBudget: expected, retried
        log.log(logging.INFO if blocked else logging.WARNING, "eviction of %s/%s: %s",
                d.pod.namespace, d.pod.name, text)
        self.limiter.blocked(d.pod.uid)
        reason = EVENT_EVICTION_BLOCKED if blocked else EVENT_ACTION_FAILED
        msg = (
            f"{_about(d)}: eviction of pod {d.pod.name} "
            f"{'refused' if status is not None else 'failed'} ({text}); "
            f"retrying in {self.limiter.retry_seconds:g}s"
        )
        self.events.explain(d, EventSpec("Warning", reason, msg))
        self.events.metrics.action(Action.EVICT, "blocked" if blocked else "failed", d.pod.namespace)
        return "blocked" if blocked else "failed"
