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
step-then-flat, hourly-cycle, checkpoint-sawtooth, dropouts;
leaks: sawtooth-slow-leak, linear, fast, stairs, bursty-requests, late-onset,
oom-restart.

Usage: python hack/make_corpus.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MIB = 2**20
GIB = 2**30
MINUTE = 60.0
HOUR = 3600.0
VARIANTS = 4
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "leak-corpus"


@dataclass
class Trace:
    """One generated trace: sample times (s), VRAM (bytes, float) and its label."""

    t: np.ndarray
    v: np.ndarray
    leak: bool
    description: str
    rate_bytes_per_hour: float = 0.0
    onset_t_seconds: float | None = None
    restarts_t_seconds: list[float] = field(default_factory=list)
    limit_bytes: int | None = None


# --- building blocks ---------------------------------------------------------


def sample_times(rng: np.random.Generator, dt: float, duration: float) -> np.ndarray:
    """Sample times of ``nvidia-smi -l dt``: every dt seconds plus a little jitter."""
    n = int(duration // dt) + 1
    t = np.arange(n) * dt + rng.uniform(0.0, min(0.2, dt / 10), n)
    t[0] = 0.0
    return t


def step_shape(phase: np.ndarray) -> np.ndarray:
    """One training step's activation memory, 0..1, by phase in [0, 1): 20% of the
    step at the floor (optimizer, data loading), forward pass allocating, backward
    pass freeing."""
    p = np.mod(phase, 1.0)
    up = np.clip((p - 0.05) / 0.40, 0.0, 1.0)
    down = np.clip((p - 0.45) / 0.40, 0.0, 1.0)
    return up - down


def training_sawtooth(
    rng: np.random.Generator, t: np.ndarray, period: float, amplitude: float, jitter: float = 0.03
) -> np.ndarray:
    """A training loop's sawtooth: steps of ``period`` seconds, each ``jitter`` (relative
    standard deviation) longer or shorter, sampled at ``t``: the samples land at
    random places in the step, or alias it when the step times barely vary."""
    steps = np.diff(t, prepend=0.0) / period
    wobble = rng.normal(0.0, jitter, t.size) * np.sqrt(np.maximum(steps, 1e-9))
    phase = np.cumsum(steps + wobble) + rng.uniform()
    return amplitude * step_shape(phase)


def noise(rng: np.random.Generator, n: int, sigma: float) -> np.ndarray:
    """Allocator jitter: small Gaussian noise, bytes."""
    return rng.normal(0.0, sigma, n)


def ou(rng: np.random.Generator, t: np.ndarray, tau: float, sigma: float) -> np.ndarray:
    """An Ornstein–Uhlenbeck process (mean 0, stationary std ``sigma``, time constant ``tau``)."""
    x = np.empty(t.size)
    x[0] = rng.normal(0.0, sigma)
    for i in range(1, t.size):
        a = np.exp(-(t[i] - t[i - 1]) / tau)
        x[i] = a * x[i - 1] + sigma * np.sqrt(1 - a * a) * rng.normal()
    return x


def leak_ramp(t: np.ndarray, onset: float, rate_per_hour: float) -> np.ndarray:
    """Leaked bytes: zero before ``onset``, then ``rate_per_hour`` bytes per hour."""
    return np.maximum(t - onset, 0.0) * rate_per_hour / HOUR


def pick(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def duration(rng: np.random.Generator, lo_h: float = 3.0, hi_h: float = 8.0) -> float:
    """A trace length between lo_h and hi_h hours, rounded to 5 minutes."""
    return float(round(rng.uniform(lo_h, hi_h) * 12) / 12 * HOUR)


# --- non-leaks ---------------------------------------------------------------


def aliased_sawtooth(rng: np.random.Generator, dt: float) -> Trace:
    # A step period just off a divisor of the sampling interval: the samples walk
    # slowly through the step's shape, so the sawtooth shows up as a slow wave
    # whose period (10–40 min) is the alias, not the step.
    alias = pick(rng, 10, 40) * MINUTE
    per_sample = int(rng.integers(1, 4)) + dt / alias
    period = dt / per_sample
    t = sample_times(rng, dt, duration(rng))
    base, amp = pick(rng, 8, 40) * GIB, pick(rng, 2, 10) * GIB
    v = base + training_sawtooth(rng, t, period, amp, jitter=0.005) + noise(rng, t.size, 4 * MIB)
    return Trace(
        t,
        v,
        False,
        f"training step {period:.3f}s sampled every {dt:g}s: alias period {alias / 60:.0f} min",
    )


def eval_spikes(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng))
    base, amp = pick(rng, 10, 50) * GIB, pick(rng, 1, 6) * GIB
    every, length, spike = (
        pick(rng, 20, 60) * MINUTE,
        pick(rng, 1, 4) * MINUTE,
        pick(rng, 2, 12) * GIB,
    )
    v = base + training_sawtooth(rng, t, pick(rng, 0.4, 6), amp) + noise(rng, t.size, 8 * MIB)
    start = pick(rng, 0, every)
    in_eval = np.mod(t - start, every) < length
    v = v + in_eval * spike
    return Trace(
        t,
        v,
        False,
        f"training, eval every {every / 60:.0f} min for {length / 60:.1f} min (+{spike / GIB:.1f} GiB)",
    )


def allocator_warmup(rng: np.random.Generator, dt: float) -> Trace:
    # The caching allocator reserves segments during the first steps and the
    # first eval, then reuses them: growth that stops within ~20 minutes.
    t = sample_times(rng, dt, duration(rng))
    base, grow, tau = pick(rng, 4, 30) * GIB, pick(rng, 2, 20) * GIB, pick(rng, 1, 5) * MINUTE
    warm = grow * (1 - np.exp(-t / tau))
    extra_at, extra = pick(rng, 5, 20) * MINUTE, pick(rng, 0.2, 2) * GIB
    v = (
        base
        + warm
        + (t >= extra_at) * extra
        + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 1, 4) * GIB)
    )
    v += noise(rng, t.size, 8 * MIB)
    return Trace(
        t,
        v,
        False,
        f"allocator warms up by {(grow + extra) / GIB:.1f} GiB (tau {tau / 60:.1f} min), then a plateau",
    )


def mean_reverting(rng: np.random.Generator, dt: float) -> Trace:
    # An inference server: KV cache and activations follow the load, which
    # wanders and returns to its mean; requests add short spikes.
    t = sample_times(rng, dt, duration(rng))
    base, tau, sigma = pick(rng, 10, 40) * GIB, pick(rng, 1, 8) * MINUTE, pick(rng, 0.2, 1.5) * GIB
    load = np.abs(ou(rng, t, tau, sigma))
    spikes = (rng.uniform(size=t.size) < 0.05) * rng.uniform(0.1, 1.0, t.size) * GIB
    v = base + load + spikes + noise(rng, t.size, 16 * MIB)
    return Trace(
        t,
        v,
        False,
        f"mean-reverting inference load (tau {tau / 60:.1f} min, sd {sigma / GIB:.1f} GiB)",
    )


def step_then_flat(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng))
    base, step, at = pick(rng, 8, 40) * GIB, pick(rng, 0.5, 8) * GIB, pick(rng, 0.2, 0.8) * t[-1]
    v = (
        base
        + (t >= at) * step
        + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 4) * GIB)
    )
    v += noise(rng, t.size, 8 * MIB)
    return Trace(
        t, v, False, f"one step up of {step / GIB:.1f} GiB at {at / 60:.0f} min, then flat"
    )


def hourly_cycle(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng))
    base, amp, phase = pick(rng, 10, 40) * GIB, pick(rng, 0.5, 4) * GIB, pick(rng, 0, 2 * np.pi)
    wave = np.sin(2 * np.pi * t / HOUR + phase) + 0.2 * np.sin(4 * np.pi * t / HOUR + 2 * phase)
    v = base + amp * (1 + wave) + noise(rng, t.size, 32 * MIB)
    return Trace(t, v, False, f"hourly load cycle, amplitude {amp / GIB:.1f} GiB")


def checkpoint_sawtooth(rng: np.random.Generator, dt: float) -> Trace:
    # Buffers accumulate between checkpoints and are freed at each one.
    t = sample_times(rng, dt, duration(rng))
    base, period, rise = (
        pick(rng, 10, 40) * GIB,
        pick(rng, 10, 25) * MINUTE,
        pick(rng, 0.5, 5) * GIB,
    )
    tooth = np.mod(t + pick(rng, 0, period), period) / period * rise
    v = base + tooth + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 3) * GIB)
    v += noise(rng, t.size, 8 * MIB)
    return Trace(
        t,
        v,
        False,
        f"checkpoint every {period / 60:.0f} min frees {rise / GIB:.1f} GiB accumulated since the last",
    )


def dropouts(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng))
    base = pick(rng, 8, 40) * GIB
    v = (
        base
        + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 4) * GIB)
        + noise(rng, t.size, 8 * MIB)
    )
    v = drop_to_zero(rng, v, single=pick(rng, 0.005, 0.03), runs=int(rng.integers(2, 8)))
    return Trace(
        t, v, False, "flat training with failed reads: single zeros and short runs of zeros"
    )


def drop_to_zero(rng: np.random.Generator, v: np.ndarray, single: float, runs: int) -> np.ndarray:
    """Set a fraction ``single`` of samples, and ``runs`` runs of 2–10 samples, to zero."""
    v = v.copy()
    v[rng.uniform(size=v.size) < single] = 0.0
    for start in rng.integers(1, v.size - 12, runs):
        v[start : start + int(rng.integers(2, 11))] = 0.0
    return v


# --- leaks -------------------------------------------------------------------


def sawtooth_slow_leak(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng))
    base, amp = pick(rng, 10, 40) * GIB, pick(rng, 4, 12) * GIB
    rate, onset = pick(rng, 240, 400) * MIB, pick(rng, 0, 1.5) * HOUR
    v = base + leak_ramp(t, onset, rate) + training_sawtooth(rng, t, pick(rng, 0.3, 8), amp)
    v += noise(rng, t.size, 8 * MIB)
    return Trace(
        t,
        v,
        True,
        f"{rate / MIB:.0f} MiB/h under a {amp / GIB:.1f} GiB training sawtooth",
        rate,
        onset,
    )


def linear(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng))
    base, rate, onset = pick(rng, 4, 30) * GIB, pick(rng, 300, 2048) * MIB, pick(rng, 0, 0.5) * HOUR
    v = base + leak_ramp(t, onset, rate) + noise(rng, t.size, pick(rng, 8, 64) * MIB)
    return Trace(t, v, True, f"linear leak of {rate / MIB:.0f} MiB/h", rate, onset)


def fast(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng, 3.0, 4.0))
    base, rate, onset = pick(rng, 4, 12) * GIB, pick(rng, 4, 16) * GIB, pick(rng, 0, 0.5) * HOUR
    v = (
        base
        + leak_ramp(t, onset, rate)
        + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 3) * GIB)
    )
    v += noise(rng, t.size, 16 * MIB)
    return Trace(t, v, True, f"fast leak of {rate / GIB:.1f} GiB/h", rate, onset)


def stairs(rng: np.random.Generator, dt: float) -> Trace:
    # Every eval allocates a spike and keeps one buffer alive after it.
    t = sample_times(rng, dt, duration(rng))
    base, every = pick(rng, 8, 40) * GIB, pick(rng, 5, 12) * MINUTE
    buffer = pick(rng, 250, 1024) * MIB * every / HOUR
    length, spike = pick(rng, 0.5, 2) * MINUTE, pick(rng, 1, 6) * GIB
    first = pick(rng, 0, 0.5) * HOUR
    evals = np.maximum(np.floor((t - first) / every) + 1, 0)
    in_eval = (t >= first) & (np.mod(t - first, every) < length)
    v = (
        base
        + evals * buffer
        + in_eval * spike
        + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 3) * GIB)
    )
    v += noise(rng, t.size, 8 * MIB)
    rate = buffer * HOUR / every
    return Trace(
        t,
        v,
        True,
        f"one {buffer / MIB:.0f} MiB buffer kept per eval every {every / 60:.0f} min",
        rate,
        first,
    )


def bursty_requests(rng: np.random.Generator, dt: float) -> Trace:
    # Each request leaks a little; traffic is a quiet baseline plus bursts, so the
    # floor climbs in spurts. Activations follow the instantaneous load.
    t = sample_times(rng, dt, duration(rng))
    base, onset = pick(rng, 10, 40) * GIB, pick(rng, 0, 1) * HOUR
    gaps = np.diff(t, prepend=0.0)
    quiet = pick(rng, 0.5, 2)
    burst_on = np.zeros(t.size, dtype=bool)
    at = pick(rng, 0, 10) * MINUTE
    while at < t[-1]:
        burst_on |= (t >= at) & (t < at + pick(rng, 1, 5) * MINUTE)
        at += rng.exponential(12 * MINUTE)
    load = np.where(burst_on, pick(rng, 8, 20), quiet) * rng.uniform(0.7, 1.3, t.size)
    per_unit = pick(rng, 300, 1200) * MIB / HOUR / (quiet + 0.25 * 14)  # ~25% of the time in bursts
    leaked = np.cumsum(load * gaps * per_unit * (t >= onset))
    v = base + leaked + load * pick(rng, 0.1, 0.4) * GIB + noise(rng, t.size, 16 * MIB)
    rate = float((leaked[-1] - leaked[np.searchsorted(t, onset)]) / (t[-1] - onset) * HOUR)
    return Trace(
        t,
        v,
        True,
        f"per-request leak under bursty traffic, mean {rate / MIB:.0f} MiB/h",
        rate,
        onset,
    )


def late_onset(rng: np.random.Generator, dt: float) -> Trace:
    t = sample_times(rng, dt, duration(rng, 4.0, 8.0))
    base, rate = pick(rng, 8, 40) * GIB, pick(rng, 250, 1024) * MIB
    onset = pick(rng, 1.5, t[-1] / HOUR - 1.5) * HOUR
    wander = np.abs(ou(rng, t, pick(rng, 1, 5) * MINUTE, pick(rng, 0.05, 0.25) * GIB))
    v = (
        base
        + wander
        + leak_ramp(t, onset, rate)
        + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 2) * GIB)
    )
    v += noise(rng, t.size, 8 * MIB)
    return Trace(
        t, v, True, f"flat for {onset / 3600:.1f} h, then {rate / MIB:.0f} MiB/h", rate, onset
    )


def oom_restart(rng: np.random.Generator, dt: float) -> Trace:
    # The process leaks until its peak hits the limit, dies (VRAM 0 for a while),
    # restarts, loads its model and leaks again.
    t = sample_times(rng, dt, duration(rng))
    limit = int(rng.choice([24, 40, 48, 80])) * GIB
    base, amp = pick(rng, 0.3, 0.6) * limit, pick(rng, 0.5, 3) * GIB
    rate = (limit - base - amp) / pick(rng, 1.0, 2.5)  # one life lasts 1 to 2.5 hours
    saw = training_sawtooth(rng, t, pick(rng, 0.3, 5), amp)
    v = np.zeros(t.size)
    start, restarts, onsets = 0.0, [], []
    i = 0
    while i < t.size:
        load_s = pick(rng, 30, 120)
        onsets.append(start + load_s)
        j = i
        while j < t.size:
            level = (
                base * min(1.0, (t[j] - start) / load_s)
                + leak_ramp(t[j : j + 1], start + load_s, rate)[0]
            )
            if level + saw[j] >= limit:
                break
            v[j] = level + saw[j]
            j += 1
        if j >= t.size:
            break
        down = pick(rng, 30, 180)  # dead, then the new process starts
        k = int(np.searchsorted(t, t[j] + down))
        start = t[min(k, t.size - 1)]
        restarts.append(float(start))
        i = k
    v = np.where(v > 0, v + noise(rng, t.size, 8 * MIB), 0.0)
    desc = f"{rate / GIB:.1f} GiB/h until the {limit / GIB:.0f} GiB limit, OOM, restart ({len(restarts)} restarts)"
    return Trace(t, v, True, desc, rate, onsets[0], restarts, limit)


# kind -> (generator, sampling intervals used by its variants)
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
