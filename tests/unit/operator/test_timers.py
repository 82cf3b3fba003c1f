"""When a budget or a report next needs a look: the first whole second at
which the engine's answer can change, and the queue that holds them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.types import EngineConfig
from vramguard_operator.plan.timers import (
    TimerQueue,
    ceil_second,
    next_step_due,
    seconds_until,
    staleness_change,
)

from ..engine.builders import budget, pod, report, run, vram

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stale_for_engine(sample: datetime, now: datetime, fresh: float) -> bool:
    """What the engine itself says of a report sampled at ``sample``."""
    out = run([budget(per_pod={"vram": "10Gi"})], [pod("w0")], [_report(sample)], now,
              config=EngineConfig(freshness_seconds=fresh))
    cond = next(c for c in out.statuses[0].status.conditions or () if c.type == "DataStale")
    return cond.status == "True"


def _report(sample: datetime) -> NodeGPUUsage:
    return report("node-a", sample, {"w0": vram(1)})


def test_staleness_change_is_where_the_engine_changes_its_mind() -> None:
    for sample in (s(0), s(0.4), s(100.7)):
        for now in (s(-120), s(-61.5), s(30), s(59.2), s(60), s(61), s(160.1)):
            at = staleness_change(sample, 60.0, now)
            before = stale_for_engine(sample, now, 60.0)
            if at is None:
                assert stale_for_engine(sample, now + timedelta(hours=1), 60.0) == before
                continue
            assert at > now and at == ceil_second(at)
            assert stale_for_engine(sample, at, 60.0) != before, (sample, now, at)
            assert stale_for_engine(sample, at - timedelta(seconds=1), 60.0) == before, (sample, now, at)


def test_next_step_due_is_the_next_step_or_the_end_of_a_tolerance() -> None:
    b = budget(per_pod={"vram": "10Gi"}, tolerance={"duration": "30s"})
    st = GPUMemoryBudgetStatus.model_validate({"violations": [
        {"kind": "PodVRAM", "pod": "a", "observedBytes": 2, "limitBytes": 1, "since": s(0).isoformat()},
        {"kind": "PodVRAM", "pod": "b", "observedBytes": 2, "limitBytes": 1, "since": s(0).isoformat(),
         "openedAt": s(0).isoformat(), "step": "Annotate", "nextStep": "Throttle",
         "nextStepTime": s(20).isoformat()},
    ]})
    assert next_step_due(b, st, s(5)) == s(20)
    assert next_step_due(b, st, s(20)) == s(30)  # then the pending one opens
    assert next_step_due(b, st, s(30)) is None  # both passed: only a change can help now
    assert next_step_due(b, None, s(0)) is None


def test_the_queue_keeps_one_time_per_unit() -> None:
    q = TimerQueue()
    q.arm("a", s(10))
    q.arm("b", s(5))
    q.arm("a", s(3))  # replaces the first
    assert q.next_time() == s(3) and len(q) == 2
    assert q.pop_due(s(4)) == ["a"]
    assert q.pop_due(s(4)) == []
    q.arm("b", None)  # disarmed
    assert q.next_time() is None and q.pop_due(s(100)) == []
    assert seconds_until(None, s(0), 5.0) == 5.0
    assert seconds_until(s(2), s(0), 5.0) == 2.0 and seconds_until(s(-2), s(0), 5.0) == 0.0
