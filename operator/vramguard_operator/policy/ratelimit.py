"""Eviction rate limits: token buckets, one per GPUMemoryPolicy (its
``evictionRateLimit``) and one for namespaces that no policy selects (the
operator's ``--eviction-rate-per-minute`` and ``--eviction-burst``), and the
back-off of a pod whose eviction a PodDisruptionBudget refused. Pure: times
come from the clock passed in, so that the operator's evictions
(``controller.evictions``) and the fleet simulation (``simulate``) are limited
by the same code.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from vramguard_api.policy import EvictionRateLimit


class TokenBucket:
    """A token bucket: at most ``burst`` tokens, refilled at ``per_minute / 60``
    tokens per second (``per_minute`` 0: never refilled). Times are seconds on
    a monotonic clock, passed in by the caller."""

    def __init__(self, per_minute: float, burst: float, now: float) -> None:
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

    def reconfigure(self, per_minute: float, burst: float, now: float) -> None:
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

    With namespace shards (``shards``), each replica holding ``k`` of ``N``
    shards gets ``share`` = k/N of every limit: ``perMinute`` × share, and a
    burst of ``burst`` × share but at least one token (an eviction needs a
    whole token). So the shards together never evict faster than the
    policy's rate; their bursts add up to at most ``max(burst, N)``.

    Fair between namespaces (``check`` with ``namespace``): within a scope,
    a token goes first to the namespace served least recently among those
    with a pod waiting for one (a waiter is one that asked within
    ``WAITER_TTL_S``). So while another namespace waits, a namespace that
    was served more recently is refused (``"rate_limited"``) even with a
    token in the bucket: one namespace's own evictions delay another's due
    eviction by at most one token interval (docs/operator.md, "Fair between
    namespaces"). When it was served is one order over every scope, so no two
    namespaces can each wait for the other (in two scopes).
    """

    DEFAULT_SCOPE = ""
    WAITER_TTL_S = 30.0
    """Seconds a pod that asked for a token stays a waiter without asking
    again (a due eviction asks at every evaluation of its pod, every few
    seconds; one no longer due stops holding tokens for its namespace)."""

    def __init__(
        self,
        default: EvictionRateLimit,
        retry_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.retry_seconds = retry_seconds
        self.share = 1.0
        self.default = default
        self.limits: dict[str, EvictionRateLimit] = {}
        self.buckets: dict[str, TokenBucket] = {
            self.DEFAULT_SCOPE: TokenBucket(default.per_minute, default.burst, clock())
        }
        self.retry_at: dict[str, float] = {}
        # namespace -> when it last took a token (one order over all scopes, so
        # that two namespaces never wait for each other in two scopes); per
        # scope, waiting pod uid -> (namespace, when it last asked)
        self.served: dict[str, float] = {}
        self.waiting: dict[str, dict[str, tuple[str, float]]] = {}

    def _scaled(self, lim: EvictionRateLimit) -> tuple[float, float]:
        return lim.per_minute * self.share, max(1.0, lim.burst * self.share)

    def configure(self, limits: Mapping[str, EvictionRateLimit]) -> None:
        """Keep one bucket per policy in ``limits`` (policy name -> its limit)."""
        now = self.clock()
        self.limits = dict(limits)
        for name in [n for n in self.buckets if n != self.DEFAULT_SCOPE and n not in limits]:
            del self.buckets[name]
            self.waiting.pop(name, None)
        for name, lim in [(self.DEFAULT_SCOPE, self.default), *limits.items()]:
            rate, burst = self._scaled(lim)
            bucket = self.buckets.get(name)
            if bucket is None:
                self.buckets[name] = TokenBucket(rate, burst, now)
            elif (bucket.per_minute, bucket.burst) != (rate, burst):
                bucket.reconfigure(rate, burst, now)

    def set_share(self, share: float) -> None:
        """This replica's share of every limit (held shards / shards), in (0, 1]."""
        if share != self.share and share > 0:
            self.share = share
            self.configure(self.limits)

    def _scope(self, scope: str) -> str:
        return scope if scope in self.buckets else self.DEFAULT_SCOPE

    def check(self, uid: str, scopes: Sequence[str], namespace: str = "") -> str | None:
        """None when pod ``uid`` (of ``namespace``) may be evicted now (the
        caller then calls ``taken``), else why not: ``"backoff"`` or
        ``"rate_limited"`` (no token, or another namespace's turn)."""
        now = self.clock()
        if self.retry_at.get(uid, 0.0) > now:
            return "backoff"
        keys = [self._scope(s) for s in scopes]
        for k in keys:
            self.waiting.setdefault(k, {})[uid] = (namespace, now)
        if not all(self.buckets[k].available(now) for k in keys):
            return "rate_limited"
        if any(self._other_turn(k, namespace, now) for k in keys):
            return "rate_limited"
        return None

    def _other_turn(self, scope: str, namespace: str, now: float) -> bool:
        """Whether another namespace with a live waiter in ``scope`` was served
        less recently than ``namespace`` (never served: first)."""
        waiting = self.waiting.get(scope, {})
        for uid in [u for u, (_, seen) in waiting.items() if now - seen > self.WAITER_TTL_S]:
            del waiting[uid]
        mine = self.served.get(namespace, -math.inf)
        return any(ns != namespace and self.served.get(ns, -math.inf) < mine for ns, _ in waiting.values())

    def taken(self, uid: str, scopes: Sequence[str], namespace: str = "") -> None:
        """Take a token from every scope for an eviction about to be sent (by
        a pod of ``namespace``)."""
        now = self.clock()
        for s in scopes:
            k = self._scope(s)
            self.buckets[k].take(now)
            self.waiting.get(k, {}).pop(uid, None)
        self.served[namespace] = now
        self.retry_at.pop(uid, None)

    def refund(self, scopes: Sequence[str]) -> None:
        """Give the tokens of an eviction the API server refused back."""
        now = self.clock()
        for s in scopes:
            self.buckets[self._scope(s)].refund(now)

    def blocked(self, uid: str) -> None:
        """Record a refusal (429): retry the pod after ``retry_seconds``."""
        self.retry_at[uid] = self.clock() + self.retry_seconds

    def forget(self, live_uids: Iterable[str]) -> None:
        """Drop back-off state of pods that are gone."""
        live = set(live_uids)
        for uid in [u for u in self.retry_at if u not in live]:
            del self.retry_at[uid]
        for waiting in self.waiting.values():
            for uid in [u for u in waiting if u not in live]:
                del waiting[uid]

