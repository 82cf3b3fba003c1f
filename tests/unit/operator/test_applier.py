"""The actions layer against an HTTP server standing in for the API server (the
real kubernetes client, real requests): network errors are counted and logged,
never raised; eviction tokens are spent before the call and refunded only on a
definite refusal; exempt namespaces still get their cleanup."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.controller.applier import Applier, ApplyContext, ApplyResult
from vramguard_operator.controller.events import EventRecorder, ObjectRef
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine.types import (
    ANNOTATION_MEMORY_LIMITS,
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_VIOLATIONS,
    BudgetRef,
    BudgetStatusUpdate,
    Cap,
    ContainerCPU,
    EngineOutput,
    EventSpec,
    Evict,
    PodPatch,
    PodRef,
    Recover,
    Throttle,
    ViolationKey,
)
from vramguard_operator.policy.ratelimit import EvictionLimiter

from ..agent.stubapi import StubAPI, status_body

NOW = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
POD = PodRef("ml", "w0", "uid-w0")
BUDGET = BudgetRef("ml", "train", "uid-train")
KEY = ViolationKey("ml", "train", "PodVRAM", "w0")
EVICTION = r"/namespaces/ml/pods/w0/eviction$"
POD_PATH = r"/namespaces/ml/pods/w0$"
RESIZE = r"/namespaces/ml/pods/w0/resize$"
EVENTS = r"/namespaces/ml/events"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def common(pod: PodRef = POD) -> dict[str, Any]:
    return dict(budget=BUDGET, violation=KEY, pod=pod, time=NOW, observed_bytes=12, limit_bytes=10,
                event=EventSpec("Warning", "Step", "budget ml/train: step"))


def evict(pod: PodRef = POD) -> Evict:
    return Evict(reason="over", **common(pod))


def throttle() -> Throttle:
    return Throttle(resize=(ContainerCPU("main", "100m", "100m"),), original={}, **common())


def recover() -> Recover:
    return Recover(restore=(ContainerCPU("main", "4", "4"),), **common())


def output(*decisions: Any, patch: dict[str, str | None] | None = None) -> EngineOutput:
    patches = (PodPatch(POD, patch),) if patch is not None else ()
    return EngineOutput(decisions=tuple(decisions), pod_patches=patches, statuses=())


def ctx(exempt: frozenset[str] = frozenset()) -> ApplyContext:
    return ApplyContext(exempt_namespaces=exempt, eviction_scopes=lambda ns: ("",), current_status={})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unreachable_client() -> client.ApiClient:
    """A client of an address where nothing listens: every call fails with a
    urllib3 error (connection refused), as when the API server is unreachable."""
    cfg = client.Configuration(host=f"http://127.0.0.1:{closed_port()}")
    cfg.retries = 0
    return client.ApiClient(cfg)


def make(api: client.ApiClient, burst: int = 1, timeout: float = 2.0) -> tuple[Applier, Metrics, Clock]:
    clock = Clock()
    metrics = Metrics(CollectorRegistry())
    limiter = EvictionLimiter(EvictionRateLimit(perMinute=0, burst=burst), retry_seconds=30, clock=clock)
    applier = Applier(KubeActions(api, timeout_seconds=timeout), EventRecorder(client.CoreV1Api(api)),
                      limiter, metrics)
    return applier, metrics, clock


def count(metrics: Metrics, action: str, result: str, ns: str = "ml") -> float:
    value = metrics.registry.get_sample_value(
        "vramguard_actions_total", {"action": action, "result": result, "namespace": ns})
    return value or 0.0


@pytest.fixture()
def stub() -> Iterator[StubAPI]:
    s = StubAPI()
    yield s
    s.close()


def paths(stub: StubAPI, method: str, pattern: str) -> list[str]:
    return [r.path for r in stub.requests if r.method == method and re.search(pattern, r.path)]


# --- network errors ---------------------------------------------------------------


def test_network_errors_are_counted_and_never_raised():
    api = unreachable_client()
    applier, metrics, _ = make(api)
    out = output(throttle(), evict(), patch={ANNOTATION_ORIGINAL_CPU: "{}"})
    applier.apply(out, ctx())  # annotations first: refused by the network, nothing else done
    assert count(metrics, "Throttle", "failed") == 1 and count(metrics, "Evict", "failed") == 1
    applier.apply(output(throttle()), ctx())  # the resize itself
    assert count(metrics, "Throttle", "failed") == 2
    applier.apply(output(evict()), ctx())
    assert count(metrics, "Evict", "failed") == 2
    status = BudgetStatusUpdate(BUDGET, GPUMemoryBudgetStatus(matchedPods=1))
    applier.write_statuses([status], ctx(), ApplyResult())
    applier.recorder.post(ObjectRef("v1", "Pod", "ml", "w0", "uid-w0"), EventSpec("Normal", "R", "m"))


def test_a_resize_that_times_out_is_a_failure_noted_for_the_status(stub):
    stub.respond("PATCH", RESIZE, (200, {}, 1.5))
    applier, metrics, _ = make(stub.api_client(), timeout=0.3)
    result = applier.apply(output(throttle()), ctx())
    assert count(metrics, "Throttle", "failed") == 1
    assert "resize" in result.resize_errors[POD.uid]


# --- eviction tokens ----------------------------------------------------------------


def test_an_eviction_that_times_out_keeps_its_token_spent(stub):
    stub.respond("POST", EVICTION, (201, {}, 1.5))
    applier, metrics, clock = make(stub.api_client(), burst=1, timeout=0.3)
    applier.apply(output(evict()), ctx())
    assert count(metrics, "Evict", "failed") == 1
    # The API server may have evicted it: the token stays spent, so another pod waits.
    other = PodRef("ml", "w1", "uid-w1")
    applier.apply(EngineOutput(decisions=(evict(other),), pod_patches=(), statuses=()), ctx())
    assert count(metrics, "Evict", "rate_limited") == 1
    assert paths(stub, "POST", r"/pods/w1/eviction$") == []


@pytest.mark.parametrize(("code", "reason", "result"), [
    (429, "TooManyRequests", "blocked"), (404, "NotFound", None), (409, "Conflict", None)])
def test_a_definite_refusal_gives_the_token_back(stub, code, reason, result):
    stub.respond("POST", EVICTION, (code, status_body(code, reason)))
    applier, metrics, _ = make(stub.api_client(), burst=1)
    applier.apply(output(evict()), ctx())
    if result is not None:
        assert count(metrics, "Evict", result) == 1
    other = PodRef("ml", "w1", "uid-w1")
    applier.apply(EngineOutput(decisions=(evict(other),), pod_patches=(), statuses=()), ctx())
    assert count(metrics, "Evict", "success") == 1
    assert paths(stub, "POST", r"/pods/w1/eviction$")


def test_a_server_error_keeps_the_token_spent(stub):
    stub.respond("POST", EVICTION, (500, status_body(500, "InternalError")))
    applier, metrics, _ = make(stub.api_client(), burst=1)
    applier.apply(output(evict()), ctx())
    assert count(metrics, "Evict", "failed") == 1
    applier.apply(EngineOutput(decisions=(evict(PodRef("ml", "w1", "uid-w1")),), pod_patches=(),
                               statuses=()), ctx())
    assert count(metrics, "Evict", "rate_limited") == 1


# --- exempt namespaces ----------------------------------------------------------------


def test_exempt_namespace_allows_cleanup_of_an_earlier_throttle(stub):
    applier, metrics, _ = make(stub.api_client())
    out = output(recover(), patch={ANNOTATION_ORIGINAL_CPU: None, ANNOTATION_VIOLATIONS: None})
    applier.apply(out, ctx(frozenset({"ml"})))
    assert paths(stub, "PATCH", RESIZE) and paths(stub, "PATCH", POD_PATH)
    assert count(metrics, "Recover", "success") == 1


def test_exempt_namespace_refuses_actions_and_added_state(stub):
    applier, metrics, _ = make(stub.api_client())
    applier.apply(output(throttle(), evict(), patch={ANNOTATION_ORIGINAL_CPU: "{}"}),
                  ctx(frozenset({"ml"})))
    applier.apply(output(evict()), ctx(frozenset({"ml"})))
    assert not paths(stub, "PATCH", RESIZE) and not paths(stub, "PATCH", POD_PATH)
    assert not paths(stub, "POST", EVICTION)
    assert count(metrics, "Throttle", "skipped") == 1 and count(metrics, "Evict", "skipped") == 2


# --- a throttle re-applied -------------------------------------------------------------


def test_a_reapplied_throttle_resizes_without_an_event_or_a_count(stub):
    from dataclasses import replace

    applier, metrics, _ = make(stub.api_client())
    applier.apply(output(replace(throttle(), reapply=True)), ctx())
    assert paths(stub, "PATCH", RESIZE)
    assert not paths(stub, "POST", EVENTS) and count(metrics, "Throttle", "success") == 0
    stub.respond("PATCH", RESIZE, (422, status_body(422, "Invalid")))
    result = applier.apply(output(replace(throttle(), reapply=True)), ctx())
    assert "resize refused" in result.resize_errors[POD.uid]
    assert not paths(stub, "POST", EVENTS) and count(metrics, "Throttle", "failed") == 0
    applier.apply(output(throttle()), ctx())  # a throttle that fires now is explained
    assert paths(stub, "POST", EVENTS) and count(metrics, "Throttle", "success") == 1


def test_an_event_post_that_hangs_times_out(stub):
    import time

    stub.respond("POST", EVENTS, (201, {}, 2.0))
    api = stub.api_client()
    recorder = EventRecorder(client.CoreV1Api(api), timeout_seconds=0.3)
    started = time.monotonic()
    recorder.post(ObjectRef("v1", "Pod", "ml", "w0", "uid-w0"), EventSpec("Normal", "R", "m"))
    assert time.monotonic() - started < 1.5


# --- a cap --------------------------------------------------------------------------------


def cap(impossible: str | None = None) -> Cap:
    hard = {} if impossible else {"GPU-0": 45 << 30}
    return Cap(hard_limits=hard, impossible_reason=impossible, **common())


def test_a_cap_is_its_patch_written_first_then_its_event(stub):
    applier, metrics, _ = make(stub.api_client())
    applier.apply(output(cap(), patch={ANNOTATION_MEMORY_LIMITS: '{"GPU-0":{"hardLimit":48318382080}}'}), ctx())
    patch, event = [r for r in stub.requests if r.method in ("PATCH", "POST")][:2]
    assert re.search(POD_PATH, patch.path) and ANNOTATION_MEMORY_LIMITS in patch.body["metadata"]["annotations"]
    assert re.search(EVENTS, event.path)
    assert count(metrics, "Cap", "success") == 1
    applier.apply(output(cap("GPU-0 does not support per-cgroup memory limits")), ctx())
    assert count(metrics, "Cap", "impossible") == 1


def test_a_cap_whose_patch_fails_is_not_explained_as_done(stub):
    stub.respond("PATCH", POD_PATH, (500, status_body(500, "InternalError")))
    applier, metrics, _ = make(stub.api_client())
    applier.apply(output(cap(), patch={ANNOTATION_MEMORY_LIMITS: '{"GPU-0":{"hardLimit":48318382080}}'}), ctx())
    assert count(metrics, "Cap", "failed") == 1 and count(metrics, "Cap", "success") == 0


def test_exempt_namespace_refuses_a_cap_and_its_limits(stub):
    applier, metrics, _ = make(stub.api_client())
    applier.apply(output(cap(), patch={ANNOTATION_MEMORY_LIMITS: '{"GPU-0":{"hardLimit":48318382080}}'}),
                  ctx(frozenset({"ml"})))
    assert not paths(stub, "PATCH", POD_PATH) and count(metrics, "Cap", "skipped") == 1
    applier.apply(output(patch={ANNOTATION_MEMORY_LIMITS: None}), ctx(frozenset({"ml"})))
    assert paths(stub, "PATCH", POD_PATH)  # removing limits is cleanup: allowed


def test_a_status_write_keeps_the_oom_publishers_counters(stub):
    stub.respond("PATCH", r"/gpumemorybudgets/train/status$", (200, {"metadata": {"resourceVersion": "2"}}))
    applier, _, _ = make(stub.api_client())
    current = {"matchedPods": 1, "openViolations": 1, "oomKills": {"innocent": 2}}
    context = ApplyContext(frozenset(), lambda ns: ("",), {("ml", "train"): current})
    applier.write_statuses([BudgetStatusUpdate(BUDGET, GPUMemoryBudgetStatus(matchedPods=2))], context, ApplyResult())
    (patch,) = [q.body for q in stub.requests if q.method == "PATCH"]
    assert patch == {"status": {"matchedPods": 2, "openViolations": None}}  # oomKills is neither removed nor written
