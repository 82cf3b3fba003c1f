"""The eviction rate limiter: token buckets per policy and back-off after a 429."""

from __future__ import annotations

import pytest

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
