#!/usr/bin/env python3
"""Generate the labelled VRAM trace corpus for leak detection (tests/fixtures/leak-corpus/).

Deterministic: every trace has a fixed seed, so running this again writes the
same bytes (``--check`` verifies that the checked-in corpus is up to date).

Each trace is a ``t_seconds,bytes`` CSV (times from 0, bytes as whole MiB in
bytes, as NVML reports them) of 3 to 8 hours sampled every 5 to 60 seconds.
``labels.json`` lists, per trace: file, kind, leak, rate_bytes_per_hour,
onset_t_seconds (first leak onset, null for non-leaks), restarts_t_seconds
(process restarts, where the leak starts again), limit_bytes (where the trace
runs into a limit), sample_interval_seconds, duration_seconds, seed and a
one-line description.

Kinds (see docs/leak-detection.md for why each one is there):
non-leaks: aliased-sawtooth, eval-spikes, allocator-warmup, mean-reverting,
step-then-flat, hourly-cycle, checkpoint-sawtooth, dropouts, slow-steps,
cache-fill; leaks: sawtooth-slow-leak, linear, fast, stairs, bursty-requests,
late-onset, oom-restart, fast-after-flat, checkpoint-leak, batch-floor,
bursty-fast; host RAM (issue 30): ram-loader-cow, ram-pinned-leak (leaks),
ram-cache-plateau, ram-page-cache (non-leaks). The shapes are in
corpus_shapes.py (building blocks, non-leaks), corpus_leaks.py, corpus_lives.py
and corpus_ram.py.

Usage: python hack/make_corpus.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kinds, beside this script
from corpus_leaks import (  # noqa: E402
    batch_floor,
    bursty_fast,
    bursty_requests,
    checkpoint_leak,
    fast,
    fast_after_flat,
    late_onset,
    linear,
    oom_restart,
    sawtooth_slow_leak,
    stairs,
)
from corpus_lives import (  # noqa: E402
    cycle_start,
    gappy_steps,
    long_step_leak,
    record_warmup,
    redeploy,
    short_lives,
    start_leak,
)
from corpus_ram import cache_plateau, loader_cow, page_cache, pinned_leak  # noqa: E402
from corpus_shapes import (  # noqa: E402
    MIB,
    Trace,
    aliased_sawtooth,
    allocator_warmup,
    cache_fill,
    checkpoint_sawtooth,
    dropouts,
    eval_spikes,
    hourly_cycle,
    mean_reverting,
    slow_steps,
    step_then_flat,
)

VARIANTS = 4
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "leak-corpus"


KINDS: dict[str, tuple[Callable[[np.random.Generator, float], Trace], tuple[float, ...]]] = {
    "aliased-sawtooth": (aliased_sawtooth, (5, 10, 15, 30)),
    "eval-spikes": (eval_spikes, (5, 15, 30, 60)),
    "allocator-warmup": (allocator_warmup, (5, 10, 30, 60)),
    "mean-reverting": (mean_reverting, (5, 15, 30, 60)),
    "step-then-flat": (step_then_flat, (5, 15, 30, 60)),
    "hourly-cycle": (hourly_cycle, (10, 15, 30, 60)),
    "checkpoint-sawtooth": (checkpoint_sawtooth, (5, 15, 30, 60)),
    "dropouts": (dropouts, (5, 10, 15, 30)),
    "sawtooth-slow-leak": (sawtooth_slow_leak, (5, 10, 15, 30)),
    "linear": (linear, (5, 15, 30, 60)),
    "fast": (fast, (5, 15, 30, 60)),
    "stairs": (stairs, (5, 10, 15, 30)),
    "bursty-requests": (bursty_requests, (5, 10, 15, 30)),
    "late-onset": (late_onset, (10, 15, 30, 60)),
    "oom-restart": (oom_restart, (5, 15, 30, 60)),
    # issue 16: fast leaks after a flat start, the shapes users report, and their look-alikes
    "fast-after-flat": (fast_after_flat, (5, 10, 15, 30)),
    "checkpoint-leak": (checkpoint_leak, (5, 15, 30, 10)),
    "batch-floor": (batch_floor, (5, 10, 15, 30)),
    "bursty-fast": (bursty_fast, (5, 10, 15, 30)),
    "slow-steps": (slow_steps, (5, 10, 15, 30)),
    "cache-fill": (cache_fill, (5, 10, 15, 60)),
    # issue 16, second pass: a process's start, restarts and logger gaps (corpus_lives.py)
    "start-leak": (start_leak, (5, 15, 30, 60)),
    "short-lives": (short_lives, (5, 10, 15, 30)),
    "long-step-leak": (long_step_leak, (5, 10, 15, 30)),
    "record-warmup": (record_warmup, (5, 15, 30, 60)),
    "cycle-start": (cycle_start, (5, 10, 15, 30)),
    "redeploy": (redeploy, (5, 15, 30, 60)),
    "gappy-steps": (gappy_steps, (5, 10, 30, 60)),
    # issue 30: host RAM working sets, the same detector (corpus_ram.py)
    "ram-loader-cow": (loader_cow, (5, 10, 15, 30)),
    "ram-pinned-leak": (pinned_leak, (5, 10, 30, 60)),
    "ram-cache-plateau": (cache_plateau, (5, 15, 30, 60)),
    "ram-page-cache": (page_cache, (5, 10, 15, 30)),
}


def generate(out: Path) -> list[dict[str, object]]:
    """Write every trace and labels.json under ``out``; return the labels."""
    out.mkdir(parents=True, exist_ok=True)
    labels = []
    for k, (kind, (gen, intervals)) in enumerate(KINDS.items()):
        for variant in range(VARIANTS):
            seed = 1000 * (k + 1) + variant
            dt = float(intervals[variant % len(intervals)])
            trace = gen(np.random.default_rng(seed), dt)
            name = f"{kind}-{variant}.csv"
            write_csv(out / name, trace)
            labels.append(label(name, kind, trace, dt, seed))
    (out / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
    return labels


def write_csv(path: Path, trace: Trace) -> None:
    mib = np.rint(np.maximum(trace.v, 0.0) / MIB).astype(np.int64)
    lines = ["t_seconds,bytes"] + [f"{t:.1f},{m * MIB}" for t, m in zip(trace.t, mib, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def label(name: str, kind: str, trace: Trace, dt: float, seed: int) -> dict[str, object]:
    return {
        "file": name,
        "kind": kind,
        "leak": trace.leak,
        "rate_bytes_per_hour": round(trace.rate_bytes_per_hour),
        "onset_t_seconds": None
        if trace.onset_t_seconds is None
        else round(trace.onset_t_seconds, 1),
        "restarts_t_seconds": [round(r, 1) for r in trace.restarts_t_seconds],
        "limit_bytes": trace.limit_bytes,
        "sample_interval_seconds": dt,
        "duration_seconds": round(float(trace.t[-1]), 1),
        "seed": seed,
        "description": trace.description,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="fail if the corpus in --out is not what this script writes",
    )
    args = parser.parse_args(argv)
    if not args.check:
        labels = generate(args.out)
        print(f"wrote {len(labels)} traces to {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        names = sorted(p.name for p in Path(tmp).iterdir())
        _, mismatch, errors = filecmp.cmpfiles(tmp, args.out, names, shallow=False)
        extra = (
            sorted({p.name for p in args.out.iterdir()} - set(names)) if args.out.is_dir() else []
        )
    if mismatch or errors or extra:
        print(
            f"corpus out of date in {args.out}: differs {mismatch}, missing {errors}, extra {extra}",
            file=sys.stderr,
        )
        return 1
    print(f"corpus in {args.out} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
