"""A group's evaluation is bounded in time (issue 17, item 2): a budget whose
evaluation runs past the limit is stopped, held (Ready=False,
EvaluationTimeout, its state kept) and the group evaluated again without it;
it stays held until its spec changes; a stage that is no budget's skips the
group for this evaluation. Each timeout is counted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from vramguard_operator.controller import crashpoints
from vramguard_operator.controller.isolation import HOLD_SECONDS, GuardedEngine, _Timeout
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import EngineInput, EngineOutput

from ..engine.builders import at, budget, pod, report, vram

LIMIT = 0.3


def group() -> EngineInput:
    bs = (budget(name="a", uid="uid-a", per_pod={"vram": "10Gi"}),
          budget(name="stuck", uid="uid-stuck", per_pod={"vram": "10Gi"}),
          budget(name="z", uid="uid-z", per_pod={"vram": "10Gi"}))
    return EngineInput(budgets=bs, pods=(pod("w0"),), reports={"node-a": report("node-a", at(0), {"w0": vram(12)})},
                       now=at(0))


def hanging_at(stage: str) -> Callable[[EngineInput, Callable[[str], None]], EngineOutput]:
    """The real engine, except that entering ``stage`` spins (a bug that loops)."""

    def engine(inp: EngineInput, progress: Callable[[str], None]) -> EngineOutput:
        def tell(s: str) -> None:
            progress(s)
            while s == stage and any(b.metadata.name == "stuck" for b in inp.budgets if b.metadata.name):
                if ("ml", "stuck") in inp.held:
                    return
                sum(range(1000))

        return evaluate(inp, tell)

    return engine


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t + time.monotonic()


def guarded(engine: Any) -> tuple[GuardedEngine, Metrics, Clock]:
    metrics = Metrics(CollectorRegistry())
    clock = Clock()
    return GuardedEngine(LIMIT, metrics, engine, clock), metrics, clock


def ready(out: EngineOutput, name: str) -> tuple[str, str]:
    st = {s.budget.name: s.status for s in out.statuses}[name]
    c = {c.type: c for c in st.conditions or ()}["Ready"]
    return c.status, c.reason


def test_a_stuck_budget_is_held_and_the_rest_evaluated():
    g, metrics, _ = guarded(hanging_at("budget ml/stuck"))
    started = time.monotonic()
    out = g.evaluate(group(), "ml")
    assert out is not None and time.monotonic() - started < LIMIT + 2
    assert sorted(d.budget.name for d in out.decisions) == ["a", "z"]  # both annotate w0
    assert ready(out, "stuck") == ("False", "EvaluationTimeout") and ready(out, "a") == ("True", "Valid")
    assert [(p.name, p.reason) for p in out.object_problems] == [("stuck", "EvaluationTimeout")]
    assert metrics.registry.get_sample_value("vramguard_evaluation_errors_total", {"stage": "timeout"}) == 1
    # the next evaluation holds it at once, without waiting for the limit again
    started = time.monotonic()
    out = g.evaluate(group(), "ml")
    assert out is not None and time.monotonic() - started < LIMIT
    assert ready(out, "stuck") == ("False", "EvaluationTimeout")


def test_the_hold_ends_when_the_spec_changes_or_its_time_is_up():
    g, _, clock = guarded(hanging_at("budget ml/never"))
    g.timed_out[("ml", "stuck")] = _Timeout(1, clock() + HOLD_SECONDS, "took too long")
    assert ready(g.evaluate(group(), "ml"), "stuck") == ("False", "EvaluationTimeout")
    inp = group()
    changed = inp.budgets[1].model_copy(update={"metadata": inp.budgets[1].metadata.model_copy(
        update={"generation": 2})})
    out = g.evaluate(EngineInput(budgets=(inp.budgets[0], changed, inp.budgets[2]), pods=inp.pods,
                                 reports=inp.reports, now=inp.now), "ml")
    assert ready(out, "stuck") == ("True", "Valid") and not g.timed_out
    g.timed_out[("ml", "stuck")] = _Timeout(1, clock() + HOLD_SECONDS, "took too long")
    clock.t += HOLD_SECONDS + 1
    assert ready(g.evaluate(group(), "ml"), "stuck") == ("True", "Valid")


def test_a_stage_that_is_no_budgets_skips_the_group():
    g, metrics, _ = guarded(hanging_at("restore"))
    assert g.evaluate(group(), "ml") is None
    assert metrics.registry.get_sample_value("vramguard_evaluation_errors_total", {"stage": "timeout"}) == 1


def test_an_engine_error_outside_any_budget_reaches_the_caller():
    def broken(inp: EngineInput, progress: Callable[[str], None]) -> EngineOutput:
        raise RuntimeError("bug")

    g, _, _ = guarded(broken)
    try:
        g.evaluate(group(), "ml")
    except RuntimeError as err:
        assert str(err) == "bug"
    else:
        raise AssertionError("the error was swallowed")


# --- crash points -------------------------------------------------------------------------


def test_crash_points_do_nothing_unless_asked(monkeypatch):
    monkeypatch.delenv(crashpoints.ENV, raising=False)
    for point in crashpoints.POINTS:
        crashpoints.reached(point)


def test_a_crash_point_kills_the_process_at_the_nth_time():
    code = (
        "import sys; from vramguard_operator.controller import crashpoints as c\n"
        "c.reached('after-resize'); print('first', flush=True)\n"
        "c.reached('after-pod-event'); print('second', flush=True)\n"
        "c.reached('after-resize'); print('third', flush=True)\n"
    )
    env = {**os.environ, crashpoints.ENV: "after-resize:2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9 and proc.stdout.split() == ["first", "second"]
