"""Classifier precision and recall on the labelled messages (tests/unit/oom/fixtures/messages.yaml:
real messages from public issues, each with its source). Each message is classified as the
termination message of a container that exited 1 with the kubelet's reason ``Error`` (no
OOMKilled, no cgroup counter: the message alone decides). Prints the confusion table and records
precision and recall per verdict kind. Run: ``make bench`` or
``python -m pytest -m benchmark -s tests/bench/test_oom_bench.py``. Benchmarks measure, they do not gate.
"""

from __future__ import annotations

import time
from collections import Counter

from tests.bench.recorder import BenchRecorder
from tests.unit.oom.cases import message_cases
from vramguard_api.oom import KINDS, Evidence, classify


def test_classifier_precision_and_recall(bench: BenchRecorder) -> None:
    pairs = [(c.label, classify(Evidence(exit_code=1, reason="Error", message=c.text)).kind, c.id)
             for c in message_cases()]
    confusion = Counter((label, got) for label, got, _ in pairs)
    print(f"\nOOM classifier on {len(pairs)} labelled messages (rows: label, columns: verdict)")
    print(f"{'':18}" + "".join(f"{k:>17}" for k in KINDS))
    for label in KINDS:
        print(f"{label:18}" + "".join(f"{confusion[(label, got)]:>17}" for got in KINDS))
    for label, got, case in pairs:
        if label != got:
            print(f"  miss: {case}: labelled {label}, classified {got}")
    for kind in ("GPUOutOfMemory", "HostOutOfMemory", "NotMemory"):
        tp = confusion[(kind, kind)]
        predicted = sum(n for (_, got), n in confusion.items() if got == kind)
        actual = sum(n for (label, _), n in confusion.items() if label == kind)
        precision = tp / predicted if predicted else 1.0
        recall = tp / actual if actual else 1.0
        print(f"{kind}: precision {precision:.3f} ({tp}/{predicted}), recall {recall:.3f} ({tp}/{actual})")
        bench.record(f"oom.classifier.precision[{kind}]", precision, "fraction", at_least=0.95)
        bench.record(f"oom.classifier.recall[{kind}]", recall, "fraction", at_least=0.9)
    bench.record("oom.classifier.messages", len(pairs), "messages")


def test_end_record_cost_at_1024_processes(tmp_path, bench: BenchRecorder) -> None:
    """The agent's end tracking (agent/vramguard_agent/ends.py) on 8 devices x 128 processes
    in 128 pods (the agent benchmark's node): CPU per tick at steady state (no end), and per
    tick in which 64 pods (512 processes, 64 containers) end or come back, records built."""
    import dataclasses
    from datetime import UTC, datetime, timedelta

    from tests.bench.test_agent_bench import DEVICES, build
    from vramguard_agent.ends import EndTracker

    now = [1_700_000_000.0]
    sampler, _ = build(tmp_path, lambda: now[0], DEVICES)
    seen: list[tuple] = []
    observe = sampler.ends.observe
    sampler.ends.observe = lambda *a: seen.append(a) or observe(*a)  # type: ignore[method-assign]
    sampler.sample()
    gpu, where, report, _ = seen[-1]
    assert sum(len(d.processes or ()) for d in gpu.devices) == 1024
    half = dataclasses.replace(report, pods=report.pods[::2])
    gone = {c.container_id for p in report.pods[1::2] for c in p.containers}
    half_where = {pid: a for pid, a in where.items() if getattr(a, "container_id", None) not in gone}
    half_gpu = dataclasses.replace(gpu, devices=[dataclasses.replace(d, processes=[
        p for p in d.processes or () if p.pid in half_where]) for d in gpu.devices])

    def per_tick(views: list[tuple], ticks: int = 40) -> tuple[float, int]:
        tracker, made = EndTracker(), 0
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        tracker.observe(*views[0], t0)
        start = time.process_time()
        for i in range(ticks):
            made += len(tracker.observe(*views[(i + 1) % len(views)], t0 + timedelta(seconds=10 * (i + 1))))
        return (time.process_time() - start) * 1000 / ticks, made

    steady_ms, none = per_tick([(gpu, where, report)])
    churn_ms, made = per_tick([(gpu, where, report), (half_gpu, half_where, half)])
    print(f"\nend tracking, 1,024 GPU processes in 128 pods: steady {steady_ms:.2f} ms per tick ({none} records);"
          f" with 64 pods ending or returning every tick {churn_ms:.2f} ms per tick ({made} records in 40 ticks)")
    assert none == 0 and made > 0
    bench.record("oom.agent_end_tracking_cpu[1024-processes,steady]", steady_ms, "ms", below=1.0)
    bench.record("oom.agent_end_tracking_cpu[1024-processes,64-pods-ending]", churn_ms, "ms")
