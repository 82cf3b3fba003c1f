"""The benchmarks' recorder (tests/bench/recorder.py) and the engine benchmark's
one-core pinning, which must give the cores back."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.bench.recorder import BenchRecorder, Results, Target
from tests.bench.test_engine_bench import one_core


@pytest.mark.parametrize(
    ("op", "bound", "value", "met"),
    [
        ("<", 5.0, 4.9, True),
        ("<", 5.0, 5.0, False),
        ("<=", 120.0, 120.0, True),
        ("<=", 120.0, 121.0, False),
        (">", 0.0, 0.0, False),
        (">=", 20_000.0, 19_999.0, False),
        (">=", 1.0, 1.0, True),
    ],
)
def test_targets(op, bound, value, met):
    assert Target(op, bound).met(value) is met


def test_figures_are_recorded_with_targets_met_and_missed(tmp_path):
    results = Results()
    quiet = BenchRecorder(results, "tests/bench/x.py::test_a[quiet]", "quiet")
    quiet.record("engine.pairs_per_second", 25_000.0, "pairs/s", at_least=20_000)
    quiet.record("engine.evaluation_best", 2.5, "s")
    busy = BenchRecorder(results, "tests/bench/x.py::test_a[busy]", "busy")
    busy.record("engine.pairs_per_second", 15_000.0, "pairs/s", at_least=20_000)  # a miss is recorded, not raised
    results.outcomes["tests/bench/x.py::test_a[busy]"] = "passed"
    path = tmp_path / "bench-results.json"
    results.write(path)
    doc = json.loads(path.read_text())
    assert set(doc) == {"format", "time", "machine", "commit", "tests", "figures"}
    assert doc["machine"]["cores"] == os.cpu_count() and doc["machine"]["usable_cores"] >= 1
    assert doc["time"].endswith("Z") and doc["tests"] == {"tests/bench/x.py::test_a[busy]": "passed"}
    by_name = {f["name"]: f for f in doc["figures"]}
    assert list(by_name) == [
        "engine.pairs_per_second[quiet]",
        "engine.evaluation_best[quiet]",
        "engine.pairs_per_second[busy]",
    ]
    assert by_name["engine.pairs_per_second[quiet]"]["met"] is True
    assert by_name["engine.pairs_per_second[busy]"] == {
        "name": "engine.pairs_per_second[busy]",
        "value": 15_000.0,
        "unit": "pairs/s",
        "target": {"op": ">=", "value": 20_000.0},
        "met": False,
        "test": "tests/bench/x.py::test_a[busy]",
    }
    assert by_name["engine.evaluation_best[quiet]"]["target"] is None
    assert by_name["engine.evaluation_best[quiet]"]["met"] is None
    assert [f.name for f in results.missed()] == ["engine.pairs_per_second[busy]"]
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_figures_are_refused_with_their_name():
    bench = BenchRecorder()
    bench.record("agent.max_rss", 70.0, "MiB", below=80)
    with pytest.raises(ValueError, match="'agent.max_rss' recorded twice"):
        bench.record("agent.max_rss", 71.0, "MiB")
    with pytest.raises(ValueError, match="'agent.scrape_cpu': value must be finite, got nan"):
        bench.record("agent.scrape_cpu", math.nan, "ms")
    with pytest.raises(ValueError, match="'x': one target at most"):
        bench.record("x", 1.0, "ms", below=2, at_least=0)
    assert [f.name for f in bench.results.figures] == ["agent.max_rss"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_one_core_gives_the_cores_back_even_after_an_error():
    before = os.sched_getaffinity(0)
    with one_core():
        assert os.sched_getaffinity(0) == {min(before)}
    assert os.sched_getaffinity(0) == before
    with pytest.raises(RuntimeError), one_core():
        raise RuntimeError("benchmark failed")
    assert os.sched_getaffinity(0) == before
