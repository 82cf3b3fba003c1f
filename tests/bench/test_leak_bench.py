"""Leak detection over the labelled corpus, run as it would run live: on growing
prefixes of every trace. Prints precision, recall, time to detect after onset and
the cost of one call. Run: ``make bench`` or
``python -m pytest -m benchmark -s tests/bench/test_leak_bench.py``.

Two views: ``detect_leak`` on the whole prefix (``vramguard analyze``), and the
agent's (its last 2 hours in 1-minute minima, as ``vramguard_agent.history``
keeps them, through ``compute_trend`` and ``leak_from_trend``, as the operator
decides).

Prefixes end every 5 minutes of trace time from 30 minutes on, and every minute
in the hour after a leak's onset (so that the time to detect is known to the minute).

- A non-leak trace is a false positive when any prefix is called a leak; a leak
  trace is a false positive too when a prefix that ends before its onset is.
- A leak trace is found (true positive) when a prefix that ends within
  45 minutes after its onset is called a leak; its time to detect is the first
  such prefix's end less the onset.
- Precision: found / (found + false-positive traces). Recall: found / leak traces.
- Held: of the prefixes that end 45 minutes or more after the onset within the
  same process life (before the next restart), the share called a leak.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from tests.unit.leak.corpus import MINUTE, Trace, names, trace
from vramguard_api.leak import detect_leak, leak_from_trend
from vramguard_api.trend import compute_trend

TARGET_MINUTES = 45.0
AGENT_WINDOW_SECONDS, AGENT_BUCKET_SECONDS = 7200.0, 60.0
Verdict = Callable[[np.ndarray, np.ndarray], bool]


def whole_prefix(t: np.ndarray, v: np.ndarray) -> bool:
    return detect_leak(t, v).leak


def agent_view(t: np.ndarray, v: np.ndarray) -> bool:
    """The agent's history of the prefix (last 2 hours, minimum per minute), judged
    from its trend features as the operator does."""
    keep = t > t[-1] - AGENT_WINDOW_SECONDS
    t, v = t[keep], v[keep]
    bucket = np.floor(t / AGENT_BUCKET_SECONDS).astype(np.int64)
    starts = np.flatnonzero(np.diff(bucket, prepend=bucket[0] - 1))
    last = np.append(starts[1:], t.size) - 1
    trend = compute_trend(t[last].tolist(), np.minimum.reduceat(v, starts).tolist())
    return leak_from_trend(trend)


@dataclass
class Outcome:
    """What the detector said on one trace's prefixes."""

    name: str
    kind: str
    leak: bool
    calls: int
    false_alarms: list[float]  # prefix ends (minutes) wrongly called a leak
    ttd_minutes: float | None = None  # leaks: first detection after onset
    held: tuple[int, int] = (0, 0)  # leaks: (called, evaluated) prefixes 45+ min after onset


def prefix_ends(tr: Trace) -> list[float]:
    ends = set(np.arange(30 * MINUTE, tr.t[-1] + 1, 5 * MINUTE).tolist())
    if tr.onset_t_seconds is not None:
        ends |= set(
            np.arange(tr.onset_t_seconds, min(tr.onset_t_seconds + 3600, tr.t[-1]), MINUTE).tolist()
        )
    return sorted(e for e in ends if e >= 30 * MINUTE)


def evaluate(tr: Trace, verdict: Verdict) -> Outcome:
    out = Outcome(tr.name, tr.kind, tr.leak, 0, [])
    onset = tr.onset_t_seconds
    life_end = min(
        [r for r in tr.restarts_t_seconds if onset is not None and r > onset], default=np.inf
    )
    called, evaluated = 0, 0
    for end in prefix_ends(tr):
        leak = verdict(*tr.prefix(end))
        out.calls += 1
        if onset is None or end < onset:
            if leak:
                out.false_alarms.append(end / MINUTE)
            continue
        after = (end - onset) / MINUTE
        if leak and out.ttd_minutes is None and after <= TARGET_MINUTES:
            out.ttd_minutes = after
        if after >= TARGET_MINUTES and end < life_end:
            evaluated += 1
            called += leak
    out.held = (called, evaluated)
    return out


def cost_per_call_ms(repeats: int = 200) -> float:
    """Mean wall time of one detect_leak call on a 2-hour series sampled every 15 s."""
    tr = trace("sawtooth-slow-leak-2.csv")
    t, v = tr.prefix(tr.t[0] + 2 * 3600)
    t, v = t[t >= t[-1] - 2 * 3600], v[t >= t[-1] - 2 * 3600]
    start = time.perf_counter()
    for _ in range(repeats):
        detect_leak(t, v)
    return (time.perf_counter() - start) / repeats * 1000


def report(view: str, outcomes: list[Outcome], seconds: float) -> str:
    leaks = [o for o in outcomes if o.leak]
    found = [o for o in leaks if o.ttd_minutes is not None]
    fp_traces = [o for o in outcomes if o.false_alarms]
    ttd = sorted(o.ttd_minutes for o in found if o.ttd_minutes is not None)
    held, evaluated = sum(o.held[0] for o in leaks), sum(o.held[1] for o in leaks)
    precision = len(found) / (len(found) + len(fp_traces)) if found or fp_traces else 1.0
    lines = [
        f"== {view}",
        f"leak corpus: {len(outcomes)} traces ({len(leaks)} leaks), {sum(o.calls for o in outcomes)} prefixes "
        f"evaluated in {seconds:.1f} s",
        f"precision {precision:.1%}  recall {len(found) / len(leaks):.1%} (within {TARGET_MINUTES:.0f} min of onset)",
        f"false-positive traces {len(fp_traces)}; prefixes wrongly called a leak "
        f"{sum(len(o.false_alarms) for o in outcomes)}",
        f"time to detect after onset: median {statistics.median(ttd):.0f} min, worst {max(ttd):.0f} min"
        if ttd
        else "time to detect: no leak found",
        f"held: {held}/{evaluated} ({held / max(evaluated, 1):.1%}) of prefixes 45+ min after onset called a leak",
        "",
        f"{'kind':22s} {'traces':>6s} {'found':>5s} {'median':>6s} {'worst':>5s} {'false alarms':>12s}",
    ]
    for kind in dict.fromkeys(o.kind for o in outcomes):
        group = [o for o in outcomes if o.kind == kind]
        times = [o.ttd_minutes for o in group if o.ttd_minutes is not None]
        lines.append(
            f"{kind:22s} {len(group):6d} "
            + (
                f"{len(times):5d} {statistics.median(times):6.0f} {max(times):5.0f}"
                if group[0].leak
                else f"{'-':>5s} {'-':>6s} {'-':>5s}"
            )
            + f" {sum(len(o.false_alarms) for o in group):12d}"
        )
    for o in fp_traces:
        lines.append(
            f"false alarm: {o.name} at {', '.join(f'{m:.0f}' for m in o.false_alarms)} min"
        )
    for o in leaks:
        if o.ttd_minutes is None:
            lines.append(f"missed within {TARGET_MINUTES:.0f} min: {o.name}")
    return "\n".join(lines)


@pytest.mark.benchmark
def test_leak_detection_over_the_corpus():
    print(
        f"\ncost: {cost_per_call_ms():.2f} ms per detect_leak call on a 2-hour series sampled every 15 s"
    )
    for view, verdict in (
        ("detect_leak on each prefix", whole_prefix),
        ("agent view: compute_trend", agent_view),
    ):
        start = time.perf_counter()
        outcomes = [evaluate(trace(name), verdict) for name in names()]
        print("\n" + report(view, outcomes, time.perf_counter() - start))
        assert len(outcomes) == len(names())


if __name__ == "__main__":
    test_leak_detection_over_the_corpus()
