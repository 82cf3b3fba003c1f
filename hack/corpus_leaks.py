"""Leak kinds of the tuning corpus (``hack/make_corpus.py``)."""

from __future__ import annotations

import numpy as np
from corpus_shapes import (
    GIB,
    HOUR,
    MIB,
    MINUTE,
    Trace,
    duration,
    leak_ramp,
    noise,
    ou,
    pick,
    sample_times,
    training_sawtooth,
)


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


# --- kinds added for issue 16: fast leaks after a flat start, and shapes users report ---


def fast_after_flat(rng: np.random.Generator, dt: float) -> Trace:
    # Steady training for most of an hour or more, then a fast leak.
    base, amp = pick(rng, 8, 40) * GIB, pick(rng, 0.5, 6) * GIB
    rate, onset = pick(rng, 2, 16) * GIB, pick(rng, 0.6, 2.0) * HOUR
    t = sample_times(rng, dt, onset + pick(rng, 1.0, 2.0) * HOUR)
    v = base + leak_ramp(t, onset, rate) + training_sawtooth(rng, t, pick(rng, 0.3, 8), amp)
    v += noise(rng, t.size, 16 * MIB)
    return Trace(t, v, True, f"{rate / GIB:.1f} GiB/h after {onset / 60:.0f} min of steady training", rate, onset)


def checkpoint_leak(rng: np.random.Generator, dt: float) -> Trace:
    # Each checkpoint keeps part of its buffers: the floor steps up every few minutes.
    base, every = pick(rng, 8, 40) * GIB, pick(rng, 3, 15) * MINUTE
    rate, first = pick(rng, 1, 8) * GIB, pick(rng, 0.5, 1.5) * HOUR
    t = sample_times(rng, dt, first + pick(rng, 1.0, 2.0) * HOUR)
    kept = np.maximum(np.floor((t - first) / every) + 1, 0) * rate * every / HOUR
    v = base + kept + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 4) * GIB)
    v += noise(rng, t.size, 8 * MIB)
    return Trace(t, v, True, f"{rate * every / HOUR / MIB:.0f} MiB kept per checkpoint every "
                 f"{every / 60:.0f} min", rate, first)


def batch_floor(rng: np.random.Generator, dt: float) -> Trace:
    # Batches of varying size: each step's peak is drawn anew and the peaks wander by
    # GiBs; only the floor between batches shows the leak.
    t = sample_times(rng, dt, duration(rng, 3.0, 5.0))
    base, amp, period = pick(rng, 8, 40) * GIB, pick(rng, 2, 10) * GIB, pick(rng, 0.5, 8)
    rate, onset = pick(rng, 0.3, 6) * GIB, pick(rng, 0.5, 1.5) * HOUR
    steps = np.floor(t / period).astype(np.int64)
    peaks = rng.uniform(0.2, 1.0, int(steps[-1]) + 1)[steps]
    v = base + leak_ramp(t, onset, rate) + peaks * training_sawtooth(rng, t, period, amp)
    v += noise(rng, t.size, 8 * MIB)
    return Trace(t, v, True, f"{rate / MIB:.0f} MiB/h under batches whose peaks vary by {0.8 * amp / GIB:.1f} GiB",
                 rate, onset)


def bursty_fast(rng: np.random.Generator, dt: float) -> Trace:
    # Heavy bursty traffic, each request leaking: GiBs per hour, in spurts.
    t = sample_times(rng, dt, duration(rng, 3.0, 4.0))
    base, onset = pick(rng, 10, 40) * GIB, pick(rng, 0.5, 1.5) * HOUR
    burst_on = np.zeros(t.size, dtype=bool)
    at = pick(rng, 0, 5) * MINUTE
    while at < t[-1]:
        burst_on |= (t >= at) & (t < at + pick(rng, 0.5, 3) * MINUTE)
        at += rng.exponential(6 * MINUTE)
    load = np.where(burst_on, pick(rng, 5, 15), 1.0) * rng.uniform(0.7, 1.3, t.size)
    per_unit = pick(rng, 2, 10) * GIB / HOUR / np.mean(load)
    leaked = np.cumsum(load * np.diff(t, prepend=0.0) * per_unit * (t >= onset))
    v = base + leaked + load * pick(rng, 0.05, 0.3) * GIB + noise(rng, t.size, 16 * MIB)
    rate = float((leaked[-1] - leaked[np.searchsorted(t, onset)]) / (t[-1] - onset) * HOUR)
    return Trace(t, v, True, f"per-request leak under heavy bursty traffic, mean {rate / GIB:.1f} GiB/h", rate, onset)
