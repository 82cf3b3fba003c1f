"""Evict: the Eviction API (``policy/v1`` Eviction with the pod's uid as
precondition), so PodDisruptionBudgets are respected.

Each attempt first asks the rate limiter (``ratelimit.EvictionLimiter``): not
within ``--eviction-retry`` of a refusal for that pod, and only with a token
from every bucket that applies. HTTP 429 (a PodDisruptionBudget) becomes an
``EvictionBlocked`` Event and a later retry, never a plain delete; a pod that
is gone or was replaced (404, 409) is left alone. Never in an exempt namespace.

The ``Evicting`` Events (pod and budget) are posted just before the Eviction
is sent, under the step's Event key: an evicted pod is gone at once (nothing
would be left to say that its Event is missing after a crash), and a retry
(after a 429, or a restart) updates the one Event instead of adding another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from vramguard_operator.controller import crashpoints
from vramguard_operator.controller.events import (
    EVENT_ACTION_FAILED,
    EVENT_EVICTION_BLOCKED,
    EVENT_EVICTION_RATE_LIMITED,
    DecisionEvents,
)
from vramguard_operator.controller.kubeapi import API_ERRORS, error_status, error_text
from vramguard_operator.controller.ratelimit import EvictionLimiter
from vramguard_operator.engine.types import EventSpec, Evict, PodRef

log = logging.getLogger("vramguard.actions")

EvictCall = Callable[[PodRef], None]
"""The API call: create the pod's Eviction; raises one of ``kubeapi.API_ERRORS``."""


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

    def evict(self, d: Evict, exempt: bool, scopes: Sequence[str]) -> None:
        """Evict ``d.pod`` unless its namespace is ``exempt``, it is backing off
        after a refusal, or a rate-limit bucket of ``scopes`` is empty."""
        assert d.pod is not None
        ns, metrics = d.pod.namespace, self.events.metrics
        if exempt:  # the applier removed it already; defence in depth
            metrics.action("Evict", "skipped", ns)
            return
        why = self.limiter.check(d.pod.uid, scopes)
        if why == "backoff":
            metrics.action("Evict", "backoff", ns)
            return
        if why == "rate_limited":
            msg = (
                f"budget {d.budget.namespace}/{d.budget.name}: eviction of pod {d.pod.name} "
                f"delayed by the eviction rate limit ({', '.join(s or 'default' for s in scopes)})"
            )
            self.events.explain(d, EventSpec("Warning", EVENT_EVICTION_RATE_LIMITED, msg))
            metrics.action("Evict", "rate_limited", ns)
            return
        # The token is spent before the call: an eviction that timed out may
        # have happened. Only a definite refusal gives it back.
        self.limiter.taken(d.pod.uid, scopes)
        self.events.explain(d, d.event)
        crashpoints.reached("before-eviction")
        try:
            self.evict_pod(d.pod)
        except API_ERRORS as err:
            if error_status(err) in (404, 409, 429):
                self.limiter.refund(scopes)
            self._refused(d, err)
            return
        crashpoints.reached("after-eviction")
        metrics.action("Evict", "success", ns)

    def _refused(self, d: Evict, err: Exception) -> None:
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
        self.events.explain(d, EventSpec("Warning", reason, msg))
        self.events.metrics.action("Evict", "blocked" if blocked else "failed", d.pod.namespace)
