"""Leak detection judged on a labelled corpus as it runs live: views, outcomes and
the issue 16 targets. ``test_leak_bench.py`` prints and records the figures.

A *view* watches one trace and says, at each prefix end (every minute of trace
time, in order), whether the prefix is called a leak, and how long until the
limit it projects:

- ``analyze``: ``detect_leak`` on the whole prefix, as ``vramguard analyze`` runs;
- ``agent``: what runs live: every sample goes through the agent's own history
  and trend schedule (``vramguard_api.history.HistoryStore`` with its defaults),
  features asked for at every sample as the agent's sampler does; at a prefix
  end the features the agent last reported go through ``trend_verdict``, and
  the projection is the operator's (``seconds_to_limit`` from the last sample,
  at the growth the verdict rests on);
- ``fresh``: the same history with features fresh at every prefix end
  (``--trend-interval 0s``), which shows what the schedule costs.

Outcomes per trace: false alarms (a prefix called a leak on a non-leak trace,
or before a leak's onset), the time to detect (first prefix called a leak at or
after the onset, less the onset; None when none is), whether the leak was
declared, and the eviction due (``evictBefore`` of ``EVICT_BEFORE_SECONDS``),
before the trace met its limit, and the share of prefixes 45 minutes or more
after the onset (within the same process life) still called a leak.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tests.leak_corpora.trace import Trace
from vramguard_api.history import HistoryStore
from vramguard_api.leak import detect_leak
from vramguard_api.trend import TrendFeatures, trend_verdict, verdict_growth

MINUTE, HOUR, MIB, GIB = 60.0, 3600.0, float(2**20), float(2**30)
WITHIN_MINUTES = 45.0
EVICT_BEFORE_SECONDS = 900.0
THRESHOLD = 200 * MIB  # the default minGrowthPerHour
# (name, lowest rate, target median minutes): the bounds, each over every
# leak at or above its rate.
RATE_TARGETS = (("4Gi/h", 4 * GIB, 10.0), ("1Gi/h", GIB, 20.0), ("200Mi/h", THRESHOLD, 45.0))
BANDS = ((">= 4Gi/h", 4 * GIB, math.inf), ("1-4Gi/h", GIB, 4 * GIB), ("200Mi-1Gi/h", THRESHOLD, GIB),
         ("< 200Mi/h", 0.0, THRESHOLD))

Verdict = tuple[bool, float | None]  # (called a leak, projected seconds to the limit)
View = Callable[[Trace], Callable[[float], Verdict]]


def analyze_view(tr: Trace) -> Callable[[float], Verdict]:
    def judge(end: float) -> Verdict:
        t, v = tr.prefix(end)
        result = detect_leak(t, v, limit_bytes=tr.limit_bytes)
        return result.leak, result.time_to_limit_seconds

    return judge


class AgentView:
    """The agent watching one trace (one pod, uid = the trace's name)."""

    def __init__(self, tr: Trace, trend_interval_s: float | None = None) -> None:
        self.tr = tr
        self.store = HistoryStore() if trend_interval_s is None else HistoryStore(trend_interval_s=trend_interval_s)
        self.fresh = trend_interval_s == 0.0
        self.next = 0
        self.trend: TrendFeatures | None = None
        self.used = 0.0

    def __call__(self, end: float) -> Verdict:
        t, v, uid = self.tr.t, self.tr.v, self.tr.name
        while self.next < t.size and t[self.next] <= end:
            now, value = float(t[self.next]), v[self.next]
            known = not math.isnan(value)
            self.store.add(now, {uid: int(value) if known else None})  # the agent reports whole bytes
            if known:
                self.used = float(value)
            if not self.fresh:
                self.trend = self.store.trend(uid, now)
            self.next += 1
        if self.fresh and self.next:
            self.trend = self.store.trend(uid, float(t[self.next - 1]))
        path = None if self.trend is None else trend_verdict(self.trend)
        if self.trend is None or path is None:
            return False, None
        growth, _ = verdict_growth(self.trend, path)  # the growth the engine projects with
        return True, _seconds_to_limit(self.used, self.tr.limit_bytes, growth)


def _seconds_to_limit(used: float, limit: int | None, growth: float | None) -> float | None:
    """The operator's projection (``engine.leak_rule.seconds_to_limit``), restated: the
    benchmark imports vramguard_api only."""
    if limit is None or growth is None or growth <= 0:
        return None
    return max(0.0, (limit - used) / growth * HOUR)


VIEWS: dict[str, tuple[str, View]] = {
    "agent": ("agent: the agent's history and trend schedule, trend_verdict (what runs live)", AgentView),
    "analyze": ("analyze: detect_leak on each whole prefix", analyze_view),
    "fresh": ("agent history, features fresh at each prefix end (--trend-interval 0s)",
              lambda tr: AgentView(tr, trend_interval_s=0.0)),
}


@dataclass
class Outcome:
    """What a view said on one trace's prefixes (times in minutes)."""

    trace: Trace
    calls: int = 0
    false_alarms: list[float] = field(default_factory=list)
    ttd_minutes: float | None = None
    declared_before_limit: bool | None = None  # None: no limit met within the trace
    evicted_before_limit: bool | None = None
    held: tuple[int, int] = (0, 0)


def prefix_ends(tr: Trace) -> np.ndarray:
    """Every minute of the trace (counted from a leak's onset, so that the time to
    detect is in whole minutes), and its end."""
    start = MINUTE if tr.onset_t_seconds is None else tr.onset_t_seconds % MINUTE or MINUTE
    return np.unique(np.append(np.arange(start, tr.t[-1], MINUTE), tr.t[-1]))


def evaluate(tr: Trace, view: View) -> Outcome:
    judge, out = view(tr), Outcome(tr)
    onset, exhaustion = tr.onset_t_seconds, tr.exhaustion_t_seconds
    life_end = min([r for r in tr.restarts_t_seconds if onset is not None and r > onset], default=math.inf)
    declared = evicted = math.inf
    called = evaluated = 0
    for end in prefix_ends(tr):
        leak, left = judge(float(end))
        out.calls += 1
        if onset is None or end < onset:
            if leak:
                out.false_alarms.append(end / MINUTE)
            continue
        if leak:
            declared = min(declared, end)
            if left is not None and left <= EVICT_BEFORE_SECONDS:
                evicted = min(evicted, end)
        if end - onset >= WITHIN_MINUTES * MINUTE and end < life_end:
            evaluated += 1
            called += leak
    if onset is not None and declared < math.inf:
        out.ttd_minutes = round((declared - onset) / MINUTE, 6)  # prefix ends are float sums
    if exhaustion is not None:
        out.declared_before_limit = bool(declared < exhaustion)  # not numpy's bool: `is False` below
        out.evicted_before_limit = bool(evicted < exhaustion)
    out.held = (called, evaluated)
    return out


def median_ttd(outcomes: Iterable[Outcome]) -> float:
    """Median minutes to detect; a leak never detected counts as infinitely late."""
    times = [o.ttd_minutes if o.ttd_minutes is not None else math.inf for o in outcomes]
    return statistics.median(times) if times else math.nan


@dataclass
class Summary:
    """A view's figures over one corpus."""

    outcomes: list[Outcome]
    seconds: float

    @property
    def leaks(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.trace.leak]

    def at_or_above(self, rate: float, below: float = math.inf) -> list[Outcome]:
        return [o for o in self.leaks if rate <= o.trace.rate_bytes_per_hour < below]

    @property
    def recall(self) -> float:
        """Leaks of 200Mi/h or more called within 45 minutes of their onset."""
        judged = self.at_or_above(THRESHOLD)
        found = [o for o in judged if o.ttd_minutes is not None and o.ttd_minutes <= WITHIN_MINUTES]
        return len(found) / len(judged) if judged else math.nan

    @property
    def false_positive_traces(self) -> int:
        return sum(bool(o.false_alarms) for o in self.outcomes)

    @property
    def false_alarm_prefixes(self) -> int:
        return sum(len(o.false_alarms) for o in self.outcomes)

    def before_limit(self, attr: str) -> tuple[int, int]:
        """(traces declared or evicted before the limit, leak traces that met their limit)."""
        met = [getattr(o, attr) for o in self.leaks if getattr(o, attr) is not None]
        return sum(met), len(met)

    @property
    def held(self) -> tuple[int, int]:
        return sum(o.held[0] for o in self.leaks), sum(o.held[1] for o in self.leaks)

    @property
    def prefixes(self) -> int:
        return sum(o.calls for o in self.outcomes)


def fraction(part: tuple[int, int]) -> float:
    return part[0] / part[1] if part[1] else math.nan


def minutes(value: float | None) -> str:
    if value is None or math.isinf(value):
        return "never"
    return f"{value:.0f}"


def report(title: str, sm: Summary) -> list[str]:
    """The view's figures, targets first, then per kind and the misses by name."""
    before, evicted, held = sm.before_limit("declared_before_limit"), sm.before_limit("evicted_before_limit"), sm.held
    lines = [
        f"== {title}",
        f"{len(sm.outcomes)} traces ({len(sm.leaks)} leaks), {sm.prefixes} prefixes in {sm.seconds:.1f} s",
    ]
    for name, rate, target in RATE_TARGETS:
        group = sm.at_or_above(rate)
        lines.append(f"median time to detect, leaks >= {name} ({len(group)}): {minutes(median_ttd(group))} min "
                     f"(target <= {target:.0f})")
    judged = sm.at_or_above(THRESHOLD)
    lines += [
        f"leaks >= 200Mi/h detected within 45 min: {sm.recall:.1%} of {len(judged)} (target 100%)",
        f"false-positive traces: {sm.false_positive_traces} (target 0); prefixes wrongly called a leak: "
        f"{sm.false_alarm_prefixes}",
        f"leaks declared before they met their limit: {before[0]}/{before[1]} ({fraction(before):.1%}; target >= 95%);"
        f" eviction due (evictBefore {EVICT_BEFORE_SECONDS / 60:.0f}m) before it: {evicted[0]}/{evicted[1]}"
        f" ({fraction(evicted):.1%})",
        f"held: {held[0]}/{held[1]} ({fraction(held):.1%}) of prefixes 45+ min after onset called a leak",
        "by rate: " + "; ".join(_band(sm, *band) for band in BANDS),
        "",
        f"{'kind':20s} {'traces':>6s} {'found<=45':>9s} {'median':>6s} {'worst':>6s} {'false alarms':>12s}",
    ]
    for kind in dict.fromkeys(o.trace.kind for o in sm.outcomes):
        lines.append(_kind_row(kind, [o for o in sm.outcomes if o.trace.kind == kind]))
    for o in sm.outcomes:
        if o.false_alarms:
            lines.append(f"false alarm: {o.trace.name} at {_ranges(o.false_alarms)} min ({o.trace.description})")
    for o in sm.at_or_above(THRESHOLD):
        if o.ttd_minutes is None or o.ttd_minutes > WITHIN_MINUTES:
            lines.append(f"late: {o.trace.name} after {minutes(o.ttd_minutes)} min ({o.trace.description}, "
                         f"every {o.trace.sample_interval_seconds:g} s)")
    for o in sm.leaks:
        if o.declared_before_limit is False:
            lines.append(f"met its limit first: {o.trace.name} ({minutes(o.ttd_minutes)} min to detect, limit met "
                         f"{(o.trace.exhaustion_t_seconds - o.trace.onset_t_seconds) / 60:.0f} min after onset)")  # type: ignore[operator]
    return lines


def _band(sm: Summary, name: str, lo: float, hi: float) -> str:
    group = sm.at_or_above(lo, hi)
    found = sum(o.ttd_minutes is not None and o.ttd_minutes <= WITHIN_MINUTES for o in group)
    return f"{name} {found}/{len(group)} within 45 min, median {minutes(median_ttd(group))} min"


def _kind_row(kind: str, group: list[Outcome]) -> str:
    alarms = sum(len(o.false_alarms) for o in group)
    if not group[0].trace.leak:
        return f"{kind:20s} {len(group):6d} {'-':>9s} {'-':>6s} {'-':>6s} {alarms:12d}"
    times = [o.ttd_minutes if o.ttd_minutes is not None else math.inf for o in group]
    found = sum(t <= WITHIN_MINUTES for t in times)
    return (f"{kind:20s} {len(group):6d} {found:9d} {minutes(statistics.median(times)):>6s} "
            f"{minutes(max(times)):>6s} {alarms:12d}")


def _ranges(values: list[float]) -> str:
    """1, 2, 3, 7 -> '1-3, 7'."""
    runs: list[list[float]] = []
    for m in values:
        if runs and m - runs[-1][-1] <= 1.01:
            runs[-1].append(m)
        else:
            runs.append([m])
    return ", ".join(f"{r[0]:.0f}" if len(r) == 1 else f"{r[0]:.0f}-{r[-1]:.0f}" for r in runs)
