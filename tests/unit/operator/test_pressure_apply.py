"""Device-pressure evictions in the actions layer, against an HTTP server
standing in for the API server: a blocked eviction falls back to the next pod
above its share, in rank order; when none can be evicted, a DeviceWillRunOut
Event says why; waiting out a back-off posts nothing; exempt namespaces are
refused; the outcomes are counted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine.types import (
    BudgetRef,
    DevicePressureReport,
    DryRunStep,
    EngineOutput,
    EventSpec,
    Evict,
    PodRef,
    ViolationKey,
)

from ..agent.stubapi import StubAPI, status_body
from .test_applier import NOW, ctx, make, paths

A, B, C = (PodRef("ml", n, f"uid-{n}") for n in ("a", "b", "c"))


def pressure_evict(pod: PodRef, *alternatives: Evict, exhausted: bool = True) -> Evict:
    return Evict(
        budget=BudgetRef("ml", "shares", "uid-shares"),
        violation=ViolationKey("ml", "shares", "DevicePressure", pod.name, "GPU-0"),
        pod=pod,
        time=NOW,
        observed_bytes=50,
        limit_bytes=20,
        event=EventSpec("Warning", "DevicePressure", f"evicting pod {pod.name}"),
        reason="DevicePressure",
        alternatives=alternatives,
        exhausted=EventSpec("Warning", "DeviceWillRunOut", "the device will run out.") if exhausted else None,
    )


def chain() -> Evict:
    return pressure_evict(A, pressure_evict(B, exhausted=False), pressure_evict(C, exhausted=False))


def out(*decisions: Any) -> EngineOutput:
    return EngineOutput(decisions=tuple(decisions), pod_patches=(), statuses=())


def pressure(metrics: Metrics, outcome: str) -> float:
    return metrics.registry.get_sample_value(
        "vramguard_device_pressure_events_total", {"outcome": outcome, "namespace": "ml"}
    ) or 0.0


def events(stub: StubAPI) -> list[dict[str, Any]]:
    return [r.body for r in stub.requests if r.method == "POST" and r.path.endswith("/events")]


@pytest.fixture()
def stub() -> Iterator[StubAPI]:
    s = StubAPI()
    yield s
    s.close()


def evicted(stub: StubAPI) -> list[str]:
    return [p.split("/")[-2] for p in paths(stub, "POST", r"/eviction$")]


def test_the_first_pod_is_evicted_and_no_other(stub):
    applier, metrics, _ = make(stub.api_client(), burst=5)
    applier.apply(out(chain()), ctx())
    assert evicted(stub) == ["a"]
    assert pressure(metrics, "evicted") == 1
    assert [e["reason"] for e in events(stub)] == ["DevicePressure", "DevicePressure"]  # the pod and its budget


def test_a_blocked_eviction_falls_back_in_rank_order(stub):
    stub.respond("POST", r"/pods/a/eviction$", (429, status_body(429, "TooManyRequests")))
    applier, metrics, _ = make(stub.api_client(), burst=5)
    applier.apply(out(chain()), ctx())
    assert evicted(stub) == ["a", "b"]
    assert pressure(metrics, "evicted") == 1 and pressure(metrics, "exhausted") == 0


def test_none_can_be_evicted_the_device_will_run_out(stub):
    refused = (429, status_body(429, "TooManyRequests"))
    for name in "abc":
        stub.respond("POST", rf"/pods/{name}/eviction$", refused, refused)
    applier, metrics, clock = make(stub.api_client(), burst=5)
    applier.apply(out(chain()), ctx())
    assert evicted(stub) == ["a", "b", "c"]
    [run_out] = [e for e in events(stub) if e["reason"] == "DeviceWillRunOut" and e["involvedObject"]["kind"] == "Pod"]
    assert "Tried: a: refused by a PodDisruptionBudget; b: refused" in run_out["message"]
    assert pressure(metrics, "exhausted") == 1
    # within the retry back-off nothing is tried, and nothing more is said
    before = len(stub.requests)
    applier.apply(out(chain()), ctx())
    assert len(stub.requests) == before and pressure(metrics, "exhausted") == 1
    clock.t += 31  # then all three again
    applier.apply(out(chain()), ctx())
    assert evicted(stub) == ["a", "b", "c"] * 2


def test_a_pod_gone_meanwhile_needs_no_fallback(stub):
    stub.respond("POST", r"/pods/a/eviction$", (404, status_body(404, "NotFound")))
    applier, metrics, _ = make(stub.api_client(), burst=5)
    applier.apply(out(chain()), ctx())
    assert evicted(stub) == ["a"] and pressure(metrics, "gone") == 1


def test_the_rate_limit_falls_back_and_then_runs_out(stub):
    applier, metrics, _ = make(stub.api_client(), burst=1)
    applier.apply(out(pressure_evict(C)), ctx())  # spends the only token
    applier.apply(out(chain()), ctx())
    assert evicted(stub) == ["c"]
    [run_out] = [e for e in events(stub) if e["reason"] == "DeviceWillRunOut" and e["involvedObject"]["kind"] == "Pod"]
    assert "a: eviction rate limit" in run_out["message"]


def test_an_exempt_fallback_is_refused(stub):
    stub.respond("POST", r"/pods/a/eviction$", (429, status_body(429, "TooManyRequests")))
    other = PodRef("sys", "x", "uid-x")
    applier, metrics, _ = make(stub.api_client(), burst=5)
    applier.apply(out(pressure_evict(A, pressure_evict(other, exhausted=False))), ctx(frozenset({"sys"})))
    assert evicted(stub) == ["a"]
    assert metrics.registry.get_sample_value(
        "vramguard_actions_total", {"action": "Evict", "result": "skipped", "namespace": "sys"}
    ) == 1


def test_a_dry_run_is_counted_and_explained(stub):
    applier, metrics, _ = make(stub.api_client())
    d = DryRunStep(
        budget=BudgetRef("ml", "shares", "uid-shares"),
        violation=ViolationKey("ml", "shares", "DevicePressure", "a", "GPU-0"),
        pod=A,
        time=NOW,
        observed_bytes=50,
        limit_bytes=20,
        event=EventSpec("Warning", "DryRun", "dry run: would evict."),
        would="Evict",
    )
    applier.apply(out(d), ctx())
    assert evicted(stub) == [] and pressure(metrics, "dry_run") == 1


def test_device_gauges() -> None:
    from prometheus_client import CollectorRegistry

    m = Metrics(CollectorRegistry())
    m.set_devices([DevicePressureReport("n", "GPU-0", "Act", 3, 80, 4), DevicePressureReport("n", "GPU-1", "Unknown", None, 80, None)])

    def sample(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, {"node": "n", **labels})

    assert sample("vramguard_device_free_bytes", device="GPU-0") == 3
    assert sample("vramguard_device_min_free_bytes", device="GPU-0") == 4
    assert sample("vramguard_device_free_bytes", device="GPU-1") is None
    assert sample("vramguard_device_pressure_state", device="GPU-0", state="Act") == 1
    m.set_devices([DevicePressureReport("n", "GPU-0", "Clear", 10, 80, 4)])
    assert sample("vramguard_device_pressure_state", device="GPU-0", state="Act") is None
    assert sample("vramguard_device_pressure_state", device="GPU-0", state="Clear") == 1
    assert sample("vramguard_device_pressure_state", device="GPU-1", state="Unknown") is None
    assert sample("vramguard_device_free_bytes", device="GPU-0") == 10
    # a pass sets the devices it changed only; the others keep their series
    m.update_devices({("n", "GPU-2"): DevicePressureReport("n", "GPU-2", "Clear", 70, 80, 4)})
    assert sample("vramguard_device_free_bytes", device="GPU-0") == 10
    assert sample("vramguard_device_free_bytes", device="GPU-2") == 70
    m.update_devices({("n", "GPU-0"): None, ("n", "GPU-2"): DevicePressureReport("n", "GPU-2", "Act", 1, 80, 4)})
    assert sample("vramguard_device_free_bytes", device="GPU-0") is None
    assert sample("vramguard_device_pressure_state", device="GPU-0", state="Clear") is None
    assert sample("vramguard_device_pressure_state", device="GPU-2", state="Clear") is None
    assert sample("vramguard_device_pressure_state", device="GPU-2", state="Act") == 1
