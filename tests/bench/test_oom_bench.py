"""Classifier precision and recall on the labelled messages (tests/unit/oom/fixtures/messages.yaml:
real messages from public issues, each with its source). Each message is classified as the
termination message of a container that exited 1 with the kubelet's reason ``Error`` (no
OOMKilled, no cgroup counter: the message alone decides). Prints the confusion table and records
precision and recall per verdict kind. Run: ``make bench`` or
``python -m pytest -m benchmark -s tests/bench/test_oom_bench.py``. Benchmarks measure, they do not gate.
"""

from __future__ import annotations

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
