"""Namespace shards on Leases: held and renewed, taken over once a holder stops
renewing for the Lease duration, never decided on by two replicas at once,
handed back to a replica that has none; the eviction rate limit split."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.controller.shards import WANTED_BY, ShardConfig, ShardManager, shard_of
from vramguard_operator.policy.ratelimit import EvictionLimiter


class Leases:
    """An API server's Leases: resourceVersions, 404 and 409 as the real one answers."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.calls: Counter[str] = Counter()

    def _bump(self, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return copy.deepcopy(body)

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> dict[str, Any]:
        self.calls["get"] += 1
        if name not in self.items:
            raise ApiException(status=404, reason="NotFound")
        return copy.deepcopy(self.items[name])

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.calls["create"] += 1
        name = body["metadata"]["name"]
        if name in self.items:
            raise ApiException(status=409, reason="AlreadyExists")
        self.items[name] = self._bump(copy.deepcopy(body))
        return copy.deepcopy(self.items[name])

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.calls["update"] += 1
        if self.items[name]["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            raise ApiException(status=409, reason="Conflict")
        self.items[name] = self._bump(copy.deepcopy(body))
        return copy.deepcopy(self.items[name])

    def holder(self, shard: int) -> str | None:
        return (self.items[f"vramguard-shard-{shard}"].get("spec") or {}).get("holderIdentity")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def manager(api: Leases, clock: Clock, name: str, shards: int = 2) -> ShardManager:
    return ShardManager(ShardConfig(shards, name, "vramguard-system", duration=30.0), api, clock=clock)  # type: ignore[arg-type]


def owner_of(ns: str, *managers: ShardManager) -> list[str]:
    return [m.cfg.identity for m in managers if m.owns(ns)]


NAMESPACES = [f"ns-{i}" for i in range(20)]


def test_two_replicas_take_one_shard_each_and_no_namespace_has_two_owners() -> None:
    api, clock = Leases(), Clock()
    a, b = manager(api, clock, "a"), manager(api, clock, "b")
    a.tick()
    b.tick()
    assert a.held() and b.held() and a.held().isdisjoint(b.held())
    assert all(len(owner_of(ns, a, b)) == 1 for ns in NAMESPACES)
    assert set(api.calls) <= {"get", "create", "update"}  # what the chart's Role grants


def test_a_replica_that_stops_renewing_is_taken_over_after_the_lease_duration() -> None:
    api, clock = Leases(), Clock()
    a, b = manager(api, clock, "a"), manager(api, clock, "b")
    a.tick()
    b.tick()
    lost = next(iter(a.held()))
    ns = next(n for n in NAMESPACES if shard_of(n, 2) == lost)
    for _ in range(5):  # a is killed: only b goes on
        clock.t += 3
        b.tick()
    assert owner_of(ns, b) == [] and not a.owns(ns)  # a stopped deciding at its renew deadline (15 s)
    for _ in range(6):
        clock.t += 3
        b.tick()
    assert b.owns(ns) and api.holder(lost) == "b" and b.held() == {0, 1}


def test_a_holder_decides_only_within_its_renew_deadline() -> None:
    api, clock = Leases(), Clock()
    a = manager(api, clock, "a", shards=1)
    a.tick()
    assert a.owns("ml") and a.leads()
    clock.t += 14.9
    assert a.owns("ml")
    clock.t += 0.2  # no renewal for more than half the Lease duration
    assert not a.owns("ml") and not a.leads()


def test_a_shard_is_handed_back_to_a_replica_without_one() -> None:
    api, clock = Leases(), Clock()
    b = manager(api, clock, "b")
    b.tick()
    for _ in range(12):  # alone for longer than the Lease duration: b takes both
        clock.t += 3
        b.tick()
    assert b.held() == {0, 1}
    a = manager(api, clock, "a")  # a (re)starts
    a.tick()
    assert not a.held() and any((api.items[n]["metadata"].get("annotations") or {}).get(WANTED_BY) == "a"
                                for n in api.items)
    b.tick()
    asked = next(i for i in (0, 1) if (api.items[f"vramguard-shard-{i}"]["metadata"].get("annotations") or {})
                 .get(WANTED_BY) == "a")
    ns = next(n for n in NAMESPACES if shard_of(n, 2) == asked)
    assert not b.owns(ns)  # b stops deciding there at once
    clock.t += 16  # then frees it, once its own renew deadline would have passed
    b.tick()
    assert api.holder(asked) is None
    a.tick()
    assert a.owns(ns) and not b.owns(ns) and b.held() == {1 - asked}


def test_a_stopped_replica_frees_its_shards() -> None:
    api, clock = Leases(), Clock()
    a = manager(api, clock, "a", shards=1)
    a.tick()
    a._free_all()
    assert api.holder(0) is None and not a.held()


def test_namespaces_spread_over_the_shards_the_same_way_everywhere() -> None:
    assert shard_of("ml", 4) == shard_of("ml", 4)
    spread = Counter(shard_of(f"team-{i}", 4) for i in range(400))
    assert set(spread) == {0, 1, 2, 3} and min(spread.values()) > 60


def test_the_configuration_refuses_a_lease_shorter_than_two_request_timeouts() -> None:
    ShardConfig(2, "a", "x", duration=30).check(request_timeout=10)
    with pytest.raises(ValueError, match="--lease-duration"):
        ShardConfig(2, "a", "x", duration=15).check(request_timeout=10)


def test_each_replica_gets_its_share_of_the_eviction_rate() -> None:
    t = [0.0]
    lim = EvictionLimiter(EvictionRateLimit(perMinute=6, burst=4), retry_seconds=30, clock=lambda: t[0])
    lim.configure({"p": EvictionRateLimit(perMinute=10, burst=1)})
    lim.set_share(0.5)  # one shard of two
    assert (lim.buckets[""].per_minute, lim.buckets[""].burst) == (3.0, 2.0)
    assert (lim.buckets["p"].per_minute, lim.buckets["p"].burst) == (5.0, 1.0)  # never below one token
    lim.set_share(1.0)
    assert (lim.buckets[""].per_minute, lim.buckets[""].burst) == (6.0, 4.0)
