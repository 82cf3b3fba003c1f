"""One group's evaluation, bounded in time: a stuck budget is held and reported,
and the rest of the group is evaluated without it.

``engine.evaluate`` is pure, synchronous Python. Nothing in the objects should
make it slow (quantities and durations are bounded before any number is built,
``vramguard_api.units``), but a bug hit by one budget's objects must not stall
enforcement everywhere. So each evaluation runs in a worker thread, and the
engine tells its progress (``evaluate(..., progress)``: the stage it enters,
one per budget). A stage that runs longer than the time limit is stopped:

1. the worker thread is interrupted (CPython's ``PyThreadState_SetAsyncExc``
   raises ``EvaluationStopped`` in it at its next bytecode; pure Python
   stops at once);
2. a budget's stage names the budget: it is held (``HeldBudget``, reason
   ``EvaluationTimeout``: Ready=False, its state kept, an Event and a count in
   ``vramguard_object_problems_total``) and the group is evaluated again
   without it, at once; it stays held until its spec changes (another
   generation) or ``HOLD_SECONDS`` pass;
3. a stage that is no budget's (reading the reports and the pods' state,
   restoring CPU, building patches: linear in the group's objects) skips the
   group for this evaluation (logged, counted ``stage="timeout"``).

Why not bisect the group's budgets: each probe of a half that hangs costs a
full time limit, log2(n) of them for one stuck budget among n, while the
progress mark names it after one. What this cannot stop: a single call into C
that holds the GIL (the interpreter raises the exception only when the call
returns). Then the thread is abandoned (a daemon), the group skipped and
reported, and the budget held when the call returns; that is why no parser
in vramguard converts text before bounding it.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from vramguard_api import conditions as C
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine import messages
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import EngineInput, EngineOutput, HeldBudget

log = logging.getLogger("vramguard.reconcile")

HOLD_SECONDS = 600.0
"""How long a budget that ran out of time stays held without a change to its spec."""
STOP_GRACE_SECONDS = 1.0
"""How long a stopped worker may take to unwind before it is abandoned."""
BUDGET_STAGE = "budget "

Evaluate = Callable[[EngineInput, Callable[[str], None]], EngineOutput]


class EvaluationStopped(BaseException):
    """Raised inside a worker thread whose stage ran past the time limit (a
    BaseException, so that no ``except Exception`` in the engine swallows it)."""


@dataclass(frozen=True, slots=True)
class _Timeout:
    generation: int | None
    until: float
    message: str


@dataclass(slots=True)
class _Mark:
    """The stage the worker is in, and since when (written by the worker)."""

    stage: str
    started: float


@dataclass(frozen=True, slots=True)
class _Run:
    output: EngineOutput | None
    stage: str
    abandoned: bool = False


class GuardedEngine:
    """``evaluate`` with a time limit per stage (``limit_seconds``), holding the
    budgets that run out of it (see the module doc). ``clock``: monotonic
    seconds (tests pass their own)."""

    def __init__(
        self,
        limit_seconds: float,
        metrics: Metrics,
        engine: Evaluate = evaluate,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit_seconds
        self.metrics = metrics
        self.engine = engine
        self.clock = clock
        self.timed_out: dict[tuple[str, str], _Timeout] = {}

    def evaluate(self, inp: EngineInput, where: str) -> EngineOutput | None:
        """The group's output, its stuck budgets held; None when the group is
        skipped this time (a stage that is no budget's ran out of time, or the
        worker could not be stopped). ``where`` names the group in logs."""
        for _ in range(len(inp.budgets) + 1):
            run = self._run(self._with_held(inp))
            if run.output is not None:
                return run.output
            self.metrics.evaluation_error("timeout")
            if not run.stage.startswith(BUDGET_STAGE):
                log.error("evaluation of namespaces %s ran past %gs in stage %r; skipped this time",
                          where, self.limit, run.stage)
                return None
            self._hold(inp, run.stage.removeprefix(BUDGET_STAGE))
            if run.abandoned:
                log.error("evaluation of namespaces %s could not be stopped (in %r); skipped this time",
                          where, run.stage)
                return None
        return None

    def _hold(self, inp: EngineInput, name: str) -> None:
        ns, _, budget = name.partition("/")
        gen = next((b.metadata.generation for b in inp.budgets
                    if (b.metadata.namespace, b.metadata.name) == (ns, budget)), None)
        log.error("evaluating budget %s took longer than %gs: held (state kept) until it changes", name, self.limit)
        message = messages.evaluation_timeout(self.limit)
        self.timed_out[(ns, budget)] = _Timeout(gen, self.clock() + HOLD_SECONDS, message)

    def _with_held(self, inp: EngineInput) -> EngineInput:
        """``inp`` with the budgets that ran out of time held (until their spec
        changes or their hold ends)."""
        now = self.clock()
        held = dict(inp.held)
        for b in inp.budgets:
            key = (b.metadata.namespace or "", b.metadata.name or "")
            t = self.timed_out.get(key)
            if t is None:
                continue
            if t.until <= now or t.generation != b.metadata.generation:
                del self.timed_out[key]
                continue
            held.setdefault(key, HeldBudget(b.metadata.uid or "", C.REASON_EVALUATION_TIMEOUT, t.message))
        return inp if len(held) == len(inp.held) else replace(inp, held=held)

    def _run(self, inp: EngineInput) -> _Run:
        """One evaluation in a worker thread, stopped when a stage runs past the limit."""
        mark = _Mark("start", self.clock())
        result: dict[str, object] = {}

        def progress(stage: str) -> None:
            mark.stage, mark.started = stage, self.clock()

        def work() -> None:
            try:
                result["output"] = self.engine(inp, progress)
            except EvaluationStopped:
                result["stopped"] = True
            except BaseException as err:  # re-raised in the caller's thread
                result["error"] = err

        worker = threading.Thread(target=work, name="vramguard-evaluate", daemon=True)
        worker.start()
        while worker.is_alive():
            stage, started = mark.stage, mark.started
            left = started + self.limit - self.clock()
            if left > 0:
                worker.join(left)
                continue
            _interrupt(worker)
            worker.join(STOP_GRACE_SECONDS)
            return _Run(None, stage, abandoned=worker.is_alive())
        if "error" in result:
            raise result["error"]  # type: ignore[misc]
        output = result.get("output")
        return _Run(output if isinstance(output, EngineOutput) else None, mark.stage)


def _interrupt(worker: threading.Thread) -> None:
    """Raise ``EvaluationStopped`` in ``worker`` at its next bytecode."""
    if worker.ident is None:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(EvaluationStopped))
