"""Benchmark: the operator at scale (issue 18), on its own local cluster.

For N kwok GPU nodes (250, 1,000 and 2,000; 5,000 with ``VG_SCALE_5000=1``;
``VG_SCALE_SIZES=250,1000`` picks sizes): 8 GPU pods per node across 100
namespaces, 200 budgets (per-pod VRAM limits, Annotate at once), a policy
giving the unbudgeted quarter of the pods the node's share, 2% of the pods
over their limit, and a load generator writing each node's NodeGPUUsage every
30 s with every pod's VRAM moving ±16 MiB (``scale_fleet``). The operator
runs as a subprocess under a ServiceAccount token, so the audit log counts
its requests. Each size, in order:

1. start-up: from starting the operator to its first decision (the first
   pre-existing violation annotated) and to all of them annotated;
2. steady state (reports only, ``STEADY_S``): operator CPU (cores), RSS,
   API requests/s, operator writes per report, CPU per report, and the mean
   evaluation pass (``vramguard_evaluation_seconds``; the decision latency
   where an operator has no such metric);
3. trials: a report that puts one budgeted pod over its limit, timed from the
   write to the pod's annotation arriving on a watch (p50/p99).

Requests are the audit log's lines of the operator's ServiceAccount
(``scale_fleet.operator_requests``): requests completed in a window, by verb,
and the watches opened. They are counted in the steady window (its writes
per report: the issue's target), over the trials (writes per trial report:
each one decides something) and over the whole run from the operator's
start (which shows the log sees the account: its lists and watches).

Figures are printed and recorded (``bench``) with the issue's targets; the
last size also records the cost of one report relative to 250 nodes (target:
within 2x up to 2,000 nodes). A benchmark measures; it asserts only that the
trials were annotated.
"""

from __future__ import annotations

import functools
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.bench.recorder import BenchRecorder
from tests.bench.scale_fleet import (
    ANNOTATION,
    LABEL,
    LIMITS,
    OVER_VRAM,
    Fleet,
    LoadGenerator,
    cpu_seconds,
    machine_load,
    operator_kubeconfig,
    operator_requests,
    rss_mib,
)
from tests.e2e.chart_rbac import AuditLog
from tests.e2e.conftest import cluster  # noqa: F401  (the session fixture)
from tests.e2e.operator_harness import OperatorProcess, wait_for
from vramguard_operator.controller.informer import Informer
from vramguard_operator.plan.changes import Change

STEADY_S = float(os.environ.get("VG_SCALE_STEADY_S", "90"))
TRIALS = int(os.environ.get("VG_SCALE_TRIALS", "40"))
TRIAL_TIMEOUT_S = 120.0  # a trial not annotated by then counts with this latency
# Another checkout's operator to measure instead (its root: the directory holding api/, operator/, agent/)
OPERATOR_ROOT = os.environ.get("VG_SCALE_OPERATOR_ROOT")
SIZES = [int(s) for s in os.environ.get("VG_SCALE_SIZES", "250,1000,2000").split(",") if s]
if os.environ.get("VG_SCALE_5000") and 5000 not in SIZES:
    SIZES.append(5000)
COST_PER_REPORT: dict[int, float] = {}  # nodes -> operator CPU ms per report, across the sizes


class AnnotationWatcher:
    """When each benchmark pod was last seen gaining the violations annotation,
    and which carry their implicit budget's ``vramguard.io/limits`` (the
    operator's own list+watch informer, on the benchmark's pods)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.annotated: dict[str, float] = {}
        self.limited: set[str] = set()
        self.informer: Informer[tuple[bool, bool]] = Informer(
            "bench-pods", functools.partial(core.list_pod_for_all_namespaces, label_selector=f"{LABEL}=true"),
            lambda b: (b.get("metadata") or {}).get("name", ""), self._marks, self._seen,
            page_size=2000, watch_seconds=120)

    @staticmethod
    def _marks(body: Any) -> tuple[bool, bool]:
        ann = (body.get("metadata") or {}).get("annotations") or {}
        return ANNOTATION in ann, LIMITS in ann

    def start(self) -> None:
        self.informer.start()
        self.informer.synced.wait(120)

    def stop(self) -> None:
        self.informer.stop()

    def _seen(self, ch: Any) -> None:
        if not isinstance(ch, Change):
            return
        name = str(ch.key)
        violated, limited = ch.new or (False, False)
        if violated and not (ch.old or (False, False))[0]:
            self.annotated[name] = time.perf_counter()
        elif not violated:
            self.annotated.pop(name, None)
        (self.limited.add if limited else self.limited.discard)(name)


@pytest.fixture(scope="module")
def fleet(cluster: Any) -> Iterator[Fleet]:  # noqa: F811
    f = Fleet(cluster.api_client())
    f.api.configuration.connection_pool_maxsize = 16
    f.prepare()
    try:
        yield f
    finally:
        f.cleanup()


@pytest.mark.parametrize("nodes", SIZES, ids=lambda n: f"{n}-nodes")
def test_scale(cluster: Any, fleet: Fleet, nodes: int, bench: BenchRecorder, tmp_path: Any) -> None:  # noqa: F811
    t_build = time.monotonic()
    before = {s.name for s in fleet.over_pods()}
    fleet.grow_to(nodes)
    print(f"\n{nodes} nodes / {nodes * 8} pods built (+{time.monotonic() - t_build:.0f} s)")
    kubeconfig = operator_kubeconfig(fleet.api, cluster.kubeconfig, tmp_path / "operator.kubeconfig")
    audit = AuditLog.of_local_cluster()
    load, watcher = LoadGenerator(fleet), AnnotationWatcher(fleet.core)
    load.start()
    watcher.start()
    op = ScaleOperator(kubeconfig, ["vg-scale-*"])
    # the pods over their limit that no operator has seen yet (those of a smaller
    # size keep their annotation: a restarted operator rightly does not repeat it)
    over = [s.name for s in fleet.over_pods() if s.name not in before and s.name not in watcher.annotated]
    offsets = [audit.offset()]  # the operator's start, then the trials'
    try:
        started = time.perf_counter()
        op.start(timeout=300)
        wait_for(op.ready, 1800, "the first pass", interval=0.1)
        first_pass = time.perf_counter() - started
        if over:
            wait_for(lambda: any(n in watcher.annotated for n in over), 1800, "a first decision", interval=0.1)
            wait_for(lambda: all(n in watcher.annotated for n in over), 1800, "every violation annotated", interval=0.5)
        else:  # a fleet taken over from an interrupted run: its violations are annotated already
            print("  (every violation was annotated before the start: the first pass stands for the first decision)")
        first = min((watcher.annotated[n] for n in over), default=started + first_pass) - started
        every = max((watcher.annotated[n] for n in over), default=started + first_pass) - started
        free = fleet.unbudgeted()
        wait_for(lambda: free <= watcher.limited, 1800, "every implicit budget's limits annotation", interval=1)
        limits = time.perf_counter() - started
        steady = _steady(op, fleet, audit)
        print(f"  steady state: {steady}")
        offsets.append(audit.offset())
        latencies = _trials(fleet, watcher)
        steady |= _request_figures(audit, offsets, len(latencies))
    finally:
        load.close()
        watcher.stop()
        op.stop()
        print(f"operator log: {op.log}")
    _report(bench, nodes, (first_pass, first, every, limits), steady, latencies)
    assert len(latencies) == TRIALS


class ScaleOperator(OperatorProcess):
    """The operator of this checkout, or of ``VG_SCALE_OPERATOR_ROOT``'s."""

    def __init__(self, kubeconfig: str, namespaces: list[str]) -> None:
        super().__init__(kubeconfig, namespaces)
        if OPERATOR_ROOT:
            self.root = Path(OPERATOR_ROOT)


def _steady(op: OperatorProcess, fleet: Fleet, audit: AuditLog) -> dict[str, float]:
    """Figures of a window with reports only."""
    assert op.proc is not None
    pid = op.proc.pid
    time.sleep(10)  # let the start-up's own writes drain
    offset, cpu0, reports0, t0 = audit.offset(), cpu_seconds(pid), fleet.reports_written, time.monotonic()
    passes0 = _passes(op)
    rss, loads = [], []
    while time.monotonic() - t0 < STEADY_S:
        time.sleep(2)
        rss.append(rss_mib(pid))
        loads.append(machine_load())
    wall = time.monotonic() - t0
    cpu, reports = cpu_seconds(pid) - cpu0, fleet.reports_written - reports0
    passes1 = _passes(op)
    reqs = operator_requests(audit, offset)
    count = passes1[1] - passes0[1]
    ages = sorted(_report_ages(op))
    print(f"  steady window ({wall:.0f} s, {reports} reports): {reqs.total} requests completed "
          f"{dict(sorted(reqs.by_verb.items()))}, codes {reqs.codes}, {reqs.watches} watches opened")
    return {
        "cpu_cores": cpu / wall,
        "rss_mib": max(rss),
        "requests_per_s": reqs.total / wall,
        "watches_opened": reqs.watches,
        "writes_per_report": reqs.writes / max(1, reports),
        "cpu_ms_per_report": cpu * 1000 / max(1, reports),
        "reports_per_s": reports / wall,
        "pass_ms": (passes1[0] - passes0[0]) / count * 1000 if count else float("nan"),
        "load": statistics.mean(loads),
        "report_age_p50": ages[len(ages) // 2] if ages else float("nan"),
        "report_age_max": ages[-1] if ages else float("nan"),
    }


def _request_figures(audit: AuditLog, offsets: list[int], trials: int) -> dict[str, float]:
    """The operator's requests over the trials (from ``offsets[1]``) and over
    the whole run (from ``offsets[0]``, its start), printed by verb."""
    run, trial = operator_requests(audit, offsets[0]), operator_requests(audit, offsets[1])
    print(f"  whole run: {run.total} requests completed {dict(sorted(run.by_verb.items()))}, "
          f"codes {run.codes}, {run.watches} watches opened")
    print(f"  trials ({trials} reports): {trial.total} requests completed {dict(sorted(trial.by_verb.items()))}")
    return {"trial_writes_per_report": trial.writes / max(1, trials), "run_requests": run.total}


def _report_ages(op: OperatorProcess) -> list[float]:
    """Each node's report age as the operator saw it (how well the load kept its 30 s)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [s.value for fam in text_string_to_metric_families(op.metrics()) for s in fam.samples
            if s.name == "vramguard_node_report_age_seconds"]


def _passes(op: OperatorProcess) -> tuple[float, float]:
    """(sum, count) of the evaluation-pass histogram (the decision latency's
    where the operator has no pass metric)."""
    for name in ("vramguard_evaluation_seconds", "vramguard_decision_latency_seconds"):
        count = op.metric(f"{name}_count")
        if count is not None:
            return op.metric(f"{name}_sum") or 0.0, count
    return 0.0, 0.0


def _trials(fleet: Fleet, watcher: AnnotationWatcher) -> list[float]:
    rng = random.Random(7)
    candidates = fleet.budgeted_under()
    rng.shuffle(candidates)
    out = []
    for slot in candidates[:TRIALS]:
        with fleet.lock:  # held: the node's next regular report must not take it back under its limit
            slot.vram, slot.held = OVER_VRAM, True
        t0 = time.perf_counter()
        fleet.publish(slot.node)
        try:
            wait_for(lambda s=slot.name, t=t0: watcher.annotated.get(s, 0) > t, TRIAL_TIMEOUT_S,
                     f"{slot.name} annotated", interval=0.005)
            out.append(watcher.annotated[slot.name] - t0)
        except AssertionError:
            print(f"  trial {slot.name}: not annotated within {TRIAL_TIMEOUT_S:g} s")
            out.append(TRIAL_TIMEOUT_S)
        with fleet.lock:
            slot.vram, slot.held = 10 << 30, False  # back under: the node's next report recovers it
        time.sleep(rng.uniform(0.5, 1.5))
    return out


def _report(bench: BenchRecorder, nodes: int, start: tuple[float, float, float, float], steady: dict[str, float],
            latencies: list[float]) -> None:
    first_pass, first, every, limits = start
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    COST_PER_REPORT[nodes] = steady["cpu_ms_per_report"]
    print(
        f"{nodes} nodes / {nodes * 8} GPU pods (machine load {steady['load']:.1f} on "
        f"{os.cpu_count()} cores):\n"
        f"  start -> first pass {first_pass:.1f} s; first decision {first:.1f} s (target <= 30 s); "
        f"every new violation {every:.1f} s; "
        f"every implicit budget's limits annotation {limits:.1f} s\n"
        f"  report -> annotation p50 {q[49] * 1000:.0f} ms, p90 {q[89] * 1000:.0f} ms, p99 {q[98] * 1000:.0f} ms "
        f"(target <= 2000 ms); slowest {', '.join(f'{x * 1000:.0f}' for x in sorted(latencies)[-4:])} ms\n"
        f"  pass {steady['pass_ms']:.1f} ms; CPU {steady['cpu_cores']:.2f} cores (target <= 1); "
        f"RSS {steady['rss_mib']:.0f} MiB (target <= 1024)\n"
        f"  {steady['requests_per_s']:.2f} API requests/s ({steady['watches_opened']:.0f} watches opened); "
        f"{steady['writes_per_report']:.3f} writes per report (target <= 0.2; "
        f"{steady['trial_writes_per_report']:.2f} per trial report, each a new violation); "
        f"{steady['cpu_ms_per_report']:.2f} CPU ms per report "
        f"({steady['reports_per_s']:.1f} reports/s of {nodes / 30:.1f} wanted; report age p50 "
        f"{steady['report_age_p50']:.0f} s, max {steady['report_age_max']:.0f} s)")
    bench.record("scale.start_to_first_pass", first_pass, "s")
    bench.record("scale.start_to_first_decision", first, "s", at_most=30)
    bench.record("scale.start_to_every_violation", every, "s")
    bench.record("scale.start_to_limits_annotations", limits, "s")
    bench.record("scale.report_to_annotation.p50", q[49] * 1000, "ms")
    bench.record("scale.report_to_annotation.p90", q[89] * 1000, "ms")
    bench.record("scale.report_to_annotation.p99", q[98] * 1000, "ms", at_most=2000)
    if steady["pass_ms"] == steady["pass_ms"]:  # not NaN
        bench.record("scale.pass_mean", steady["pass_ms"], "ms")
    bench.record("scale.cpu", steady["cpu_cores"], "cores", at_most=1)
    bench.record("scale.rss", steady["rss_mib"], "MiB", at_most=1024)
    bench.record("scale.api_requests_per_s", steady["requests_per_s"], "1/s")
    bench.record("scale.writes_per_report", steady["writes_per_report"], "1", at_most=0.2)
    bench.record("scale.trial_writes_per_report", steady["trial_writes_per_report"], "1")
    bench.record("scale.watches_opened", steady["watches_opened"], "1")
    bench.record("scale.cpu_per_report", steady["cpu_ms_per_report"], "ms")
    bench.record("scale.machine_load", steady["load"], "1")
    bench.record("scale.reports_per_s", steady["reports_per_s"], "1/s", at_least=nodes / 30 * 0.9)
    if steady["report_age_max"] == steady["report_age_max"]:
        bench.record("scale.report_age_max", steady["report_age_max"], "s")
    if 250 in COST_PER_REPORT and nodes != 250:
        ratio = steady["cpu_ms_per_report"] / COST_PER_REPORT[250]
        print(f"  cost of one report: {ratio:.2f}x that at 250 nodes (target <= 2x up to 2,000 nodes)")
        bench.record("scale.report_cost_vs_250", ratio, "x", at_most=2 if nodes <= 2000 else None)
