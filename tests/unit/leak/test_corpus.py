"""The detector against the labelled corpus, one case per trace, as it would run live
(on growing prefixes): the targets of docs/leak-detection.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vramguard_api.leak import detect_leak

from .corpus import CORPUS, MINUTE, labels, names, trace

ROOT = Path(__file__).resolve().parents[3]
KINDS_LEAK = {
    "sawtooth-slow-leak",
    "linear",
    "fast",
    "stairs",
    "bursty-requests",
    "late-onset",
    "oom-restart",
}
KINDS_NO_LEAK = {
    "aliased-sawtooth",
    "eval-spikes",
    "allocator-warmup",
    "mean-reverting",
    "step-then-flat",
    "hourly-cycle",
    "checkpoint-sawtooth",
    "dropouts",
}


def test_corpus_covers_every_kind_with_the_issue_s_shapes():
    by_kind: dict[str, set[bool]] = {}
    for lab in labels():
        by_kind.setdefault(str(lab["kind"]), set()).add(bool(lab["leak"]))
        t = trace(str(lab["file"])).t
        assert 3 * 3600 - 300 <= t[-1] <= 8 * 3600, lab["file"]
        assert 5 <= lab["sample_interval_seconds"] <= 60, lab["file"]  # type: ignore[operator]
        if lab["leak"]:
            assert lab["rate_bytes_per_hour"] >= 200 * 2**20, lab["file"]  # type: ignore[operator]
    assert by_kind == {**{k: {True} for k in KINDS_LEAK}, **{k: {False} for k in KINDS_NO_LEAK}}
    assert sum(p.stat().st_size for p in CORPUS.iterdir()) < 5 * 2**20


def test_corpus_is_what_the_generator_writes(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "make_corpus.py"), "--check", "--out", str(CORPUS)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    subprocess.run(
        [sys.executable, str(ROOT / "hack" / "make_corpus.py"), "--out", str(tmp_path)], check=True
    )
    assert json.loads((tmp_path / "labels.json").read_text()) == list(labels())


@pytest.mark.parametrize("name", names(leak=False))
def test_no_leak_at_any_prefix_of_30_minutes_or_more(name):
    tr = trace(name)
    for end in np.arange(30 * MINUTE, tr.t[-1] + 1, 5 * MINUTE):
        result = detect_leak(*tr.prefix(end))
        assert not result.leak, f"{name}: leak at {end / MINUTE:.0f} min: {result}"
        assert result.onset_t_seconds is None


@pytest.mark.parametrize("name", names(leak=True))
def test_leak_detected_within_45_minutes_of_onset(name):
    tr = trace(name)
    assert tr.onset_t_seconds is not None
    ends = np.arange(tr.onset_t_seconds + 20 * MINUTE, tr.onset_t_seconds + 45 * MINUTE + 1, MINUTE)
    verdicts = [detect_leak(*tr.prefix(end)) for end in ends]
    first = next((r for r in verdicts if r.leak), None)
    assert first is not None, f"{name}: no leak by 45 min after onset"
    assert first.onset_t_seconds is not None
    assert abs(first.onset_t_seconds - tr.onset_t_seconds) <= 20 * MINUTE, first
    assert first.growth_low_bytes_per_hour > 0


@pytest.mark.parametrize("name", names(leak=True))
def test_no_leak_before_onset(name):
    tr = trace(name)
    assert tr.onset_t_seconds is not None
    for end in np.arange(30 * MINUTE, tr.onset_t_seconds, 5 * MINUTE):
        assert not detect_leak(*tr.prefix(end)).leak, f"{name}: leak at {end / MINUTE:.0f} min"


@pytest.mark.parametrize(
    "name", [n for n in names(leak=True) if trace(n).kind in ("linear", "fast", "late-onset")]
)
def test_growth_and_onset_match_the_label_on_the_whole_trace(name):
    tr = trace(name)
    result = detect_leak(tr.t, tr.v)
    assert result.leak
    assert result.growth_bytes_per_hour == pytest.approx(tr.rate_bytes_per_hour, rel=0.1)
    assert result.growth_low_bytes_per_hour <= tr.rate_bytes_per_hour * 1.02
    assert result.onset_t_seconds == pytest.approx(tr.onset_t_seconds, abs=10 * MINUTE)


@pytest.mark.parametrize("name", names(leak=True)[-4:])  # oom-restart
def test_restart_cycles_are_judged_from_the_last_restart(name):
    tr = trace(name)
    assert tr.kind == "oom-restart" and tr.limit_bytes is not None
    result = detect_leak(tr.t, tr.v, limit_bytes=tr.limit_bytes)
    last_start = tr.restarts_t_seconds[-1] if tr.restarts_t_seconds else 0.0
    # Samples since the last restart, less those near zero (5% of the median: loading, dead).
    segment = (tr.t >= last_start) & (tr.v > 0.05 * np.median(tr.v[tr.v > 0]))
    assert result.samples == int(segment.sum())
    if tr.t[-1] - last_start >= 45 * MINUTE:
        assert result.leak and result.onset_t_seconds is not None
        assert result.onset_t_seconds >= last_start
        # The projection from the end of the trace: the process is still alive, so the
        # limit lies ahead, less than a full life (limit - base) / rate away.
        assert result.time_to_limit_seconds is not None
        assert 0 < result.time_to_limit_seconds < tr.limit_bytes / tr.rate_bytes_per_hour * 3600
