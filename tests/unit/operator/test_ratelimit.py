"""The eviction rate limiter: token buckets per policy and back-off after a 429."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.policy.ratelimit import EvictionLimiter, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_bucket_allows_the_burst_then_refills_at_the_rate():
    b = TokenBucket(per_minute=2, burst=2, now=0.0)
    for _ in range(2):
        assert b.available(0.0)
        b.take(0.0)
    assert not b.available(0.0)
    assert not b.available(29.0)  # 2/min: one token every 30 s
    assert b.available(30.0)
    b.take(30.0)
    assert not b.available(59.0)
    assert b.available(1000.0)
    assert b.tokens == 2.0  # never above the burst


def test_bucket_with_zero_rate_never_refills():
    b = TokenBucket(per_minute=0, burst=1, now=0.0)
    b.take(0.0)
    assert not b.available(1e9)


def test_bucket_reconfigure_keeps_tokens_capped_at_the_new_burst():
    b = TokenBucket(per_minute=60, burst=10, now=0.0)
    b.reconfigure(per_minute=60, burst=3, now=0.0)
    assert b.tokens == 3.0
    b.reconfigure(per_minute=600, burst=10, now=0.0)
    assert b.tokens == 3.0 and b.per_minute == 600.0


@pytest.mark.parametrize(("per_minute", "burst"), [(-1, 1), (1, 0)])
def test_bucket_rejects_bad_settings(per_minute, burst):
    with pytest.raises(ValueError, match="evictionRateLimit"):
        TokenBucket(per_minute, burst, 0.0)


def test_limiter_takes_from_every_scope_and_uses_the_default_for_unknown_ones():
    clock = Clock()
    lim = EvictionLimiter(EvictionRateLimit(perMinute=0, burst=1), retry_seconds=10, clock=clock)
    lim.configure({"team-a": EvictionRateLimit(perMinute=0, burst=2)})
    assert lim.check("p1", ("team-a",)) is None
    lim.taken("p1", ("team-a",))
    assert lim.check("p2", ("team-a",)) is None
    lim.taken("p2", ("team-a",))
    assert lim.check("p3", ("team-a",)) == "rate_limited"
    # the default scope is separate
    assert lim.check("p3", ("",)) is None
    lim.taken("p3", ("",))
    assert lim.check("p4", ("",)) == "rate_limited"
    # a policy that was deleted falls back to the default bucket
    lim.configure({})
    assert lim.check("p5", ("team-a",)) == "rate_limited"


def test_limiter_backs_off_a_blocked_pod_only():
    clock = Clock()
    lim = EvictionLimiter(EvictionRateLimit(perMinute=60, burst=5), retry_seconds=10, clock=clock)
    lim.blocked("p1")
    assert lim.check("p1", ("",)) == "backoff"
    assert lim.check("p2", ("",)) is None
    clock.t += 10.5
    assert lim.check("p1", ("",)) is None
    lim.blocked("p1")
    lim.forget(["p2"])  # p1 is gone
    assert lim.check("p1", ("",)) is None


def test_limiter_reconfigures_a_policy_bucket_when_its_limit_changes():
    clock = Clock()
    lim = EvictionLimiter(EvictionRateLimit(), retry_seconds=10, clock=clock)
    lim.configure({"p": EvictionRateLimit(perMinute=0, burst=3)})
    lim.taken("a", ("p",))
    lim.configure({"p": EvictionRateLimit(perMinute=0, burst=1)})
    assert lim.check("b", ("p",)) is None  # 2 left, capped at the new burst 1
    lim.taken("b", ("p",))
    assert lim.check("c", ("p",)) == "rate_limited"


# --- fairness between namespaces (issue 32, item 2) --------------------------


def race(hostile_every: float, due: float, ask_every: float, hostile_start: float, horizon: float = 600.0) -> float:
    """The default bucket (2/min, burst 2), a hostile namespace asking to evict
    one new pod of its own every ``hostile_every`` s from ``hostile_start``,
    and one pod of ``ml`` due at ``due`` asking every ``ask_every`` s: when
    the ``ml`` pod was evicted (seconds after ``due``)."""
    clock = Clock()
    start = clock.t
    lim = EvictionLimiter(EvictionRateLimit(perMinute=2, burst=2), retry_seconds=60, clock=clock)
    events = sorted([(hostile_start + i * hostile_every, "hostile") for i in range(int(horizon / hostile_every) + 1)]
                    + [(due + i * ask_every, "ml") for i in range(int(horizon / ask_every) + 1)])
    n = 0
    for t, ns in events:
        clock.t = start + t
        uid = "uid-victim" if ns == "ml" else f"uid-h{n}"
        if lim.check(uid, [""], ns) is None:
            lim.taken(uid, [""], ns)
            if ns == "ml":
                return t - due
            n += 1
    raise AssertionError("the ml pod was never evicted")


@given(st.floats(0.2, 10), st.floats(0, 300), st.floats(0.5, 5), st.floats(0, 60))
@settings(max_examples=300, deadline=None)
def test_a_namespaces_own_evictions_delay_anothers_by_at_most_one_token_interval(
    hostile_every: float, due: float, ask_every: float, hostile_start: float
) -> None:
    # one token interval (30 s at 2/min), plus at most one of the pod's own asking periods
    assert race(hostile_every, due, ask_every, hostile_start) <= 30.0 + ask_every + 1e-6


def test_the_token_goes_to_the_namespace_served_least_recently():
    clock = Clock()
    lim = EvictionLimiter(EvictionRateLimit(perMinute=2, burst=1), retry_seconds=60, clock=clock)
    lim.taken("uid-h", [""], "hostile")
    clock.t += 30.0
    assert lim.check("uid-victim", [""], "ml") is None  # ml was never served: its turn
    clock.t += 0.0
    assert lim.check("uid-h2", [""], "hostile") == "rate_limited"  # a token, but ml waits
    lim.taken("uid-victim", [""], "ml")
    clock.t += 30.0
    assert lim.check("uid-h2", [""], "hostile") is None  # ml served more recently: hostile's turn


def test_two_busy_namespaces_alternate():
    clock = Clock()
    lim = EvictionLimiter(EvictionRateLimit(perMinute=60, burst=1), retry_seconds=60, clock=clock)
    got = []
    for i in range(10):
        clock.t += 1.0
        for ns in ("a", "a", "b"):  # a asks twice as often as b
            uid = f"{ns}-{i}-{len(got)}"
            if lim.check(uid, [""], ns) is None:
                lim.taken(uid, [""], ns)
                got.append(ns)
    assert got == ["a", "b"] * 5


def test_a_waiter_that_stops_asking_holds_no_token_for_long():
    clock = Clock()
    lim = EvictionLimiter(EvictionRateLimit(perMinute=2, burst=1), retry_seconds=60, clock=clock)
    lim.taken("uid-a0", [""], "a")
    assert lim.check("uid-b0", [""], "b") == "rate_limited"  # b waits, then its pod goes away quietly
    clock.t += 30.0
    assert lim.check("uid-a1", [""], "a") == "rate_limited"  # b's turn while it may still ask
    clock.t += EvictionLimiter.WAITER_TTL_S + 1
    assert lim.check("uid-a1", [""], "a") is None
    lim.forget([])  # gone pods are no waiters either
    assert not lim.waiting[""]


def test_two_namespaces_never_wait_for_each_other_in_two_scopes():
    # a and b share two policies' buckets; whoever was served longer ago goes first in both
    clock = Clock()
    lim = EvictionLimiter(EvictionRateLimit(perMinute=60, burst=1), retry_seconds=60, clock=clock)
    lim.configure({"p": EvictionRateLimit(perMinute=60, burst=1), "q": EvictionRateLimit(perMinute=60, burst=1)})
    lim.taken("a0", ["p"], "a")
    clock.t += 1
    lim.taken("b0", ["q"], "b")
    clock.t += 1
    got = []
    for i in range(6):
        clock.t += 1
        for ns in ("a", "b"):
            uid = f"{ns}{i}"
            if lim.check(uid, ["p", "q"], ns) is None:
                lim.taken(uid, ["p", "q"], ns)
                got.append(ns)
    assert got == ["a", "b", "a", "b", "a", "b"]
