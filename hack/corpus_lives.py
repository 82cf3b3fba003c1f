"""Kinds of the tuning corpus about a process's life (``hack/make_corpus.py``): what a
detector sees when a process starts, restarts, or when the logger misses minutes.

Added with the second pass on issue 16. The first tuning kinds mostly start at
their working level with no process start; these start with a model load, as a
pod does, so that a rule for rises from the process's start can be tuned on
them and on their look-alikes:

- leaks: ``start-leak`` (a leak from the end of the model load), ``short-lives``
  (OOM restarts with lives shorter than ``minWindow``), ``long-step-leak`` (a
  leak under training steps of minutes, after a flat hour);
- non-leaks: ``record-warmup`` (the caching allocator grows whenever a batch
  larger than any before arrives: fast at first, then ever more rarely),
  ``cycle-start`` (an accumulate-and-free cycle, or a load cycle, whose first
  rise starts with the process), ``redeploy`` (restarts that come back at about
  the same level, a little higher now and then, on a wandering load) and
  ``gappy-steps`` (step-ups that stop, some hidden in logger gaps, with runs of
  failed reads).
"""

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


def model_load(t: np.ndarray, start: float, size: float, load_s: float) -> np.ndarray:
    """A model of ``size`` bytes loaded over ``load_s`` seconds from ``start`` (0 before)."""
    return size * np.clip((t - start) / load_s, 0.0, 1.0) * (t >= start)


def logger_gaps(rng: np.random.Generator, t: np.ndarray, count: int, lo: float, hi: float) -> np.ndarray:
    """A mask of the samples written: ``count`` gaps of ``lo`` to ``hi`` seconds without a row."""
    keep = np.ones(t.size, dtype=bool)
    for _ in range(count):
        at = pick(rng, 0.1, 0.9) * t[-1]
        keep &= ~((t >= at) & (t < at + pick(rng, lo, hi)))
    return keep


# --- leaks -----------------------------------------------------------------------------


def start_leak(rng: np.random.Generator, dt: float) -> Trace:
    # The leak starts with the process: no flat floor before it.
    t = sample_times(rng, dt, duration(rng, 2.0, 5.0))
    base, load_s = pick(rng, 6, 40) * GIB, pick(rng, 30, 180)
    rate = float(np.exp(pick(rng, np.log(0.5), np.log(16)))) * GIB
    step = float(np.exp(pick(rng, np.log(0.3), np.log(90))))
    v = model_load(t, 0.0, base, load_s) + leak_ramp(t, load_s, rate)
    v += (t >= load_s) * training_sawtooth(rng, t, step, pick(rng, 0.5, 4) * GIB) + noise(rng, t.size, 16 * MIB)
    return Trace(t, np.maximum(v, 0.0), True, f"{rate / GIB:.1f} GiB/h from the start, {step:.1f}-s steps",
                 rate, load_s)


def short_lives(rng: np.random.Generator, dt: float) -> Trace:
    # OOM restarts whose lives (20-50 min) are shorter than minWindow.
    t = sample_times(rng, dt, duration(rng, 3.0, 5.0))
    base, amp = pick(rng, 6, 40) * GIB, pick(rng, 0.3, 3) * GIB
    rate = float(np.exp(pick(rng, np.log(1), np.log(16)))) * GIB
    limit = base + amp + rate * pick(rng, 20, 50) / 60
    saw = training_sawtooth(rng, t, pick(rng, 0.3, 8), amp)
    v, start, restarts, onsets = np.zeros(t.size), 0.0, [], []
    while start < t[-1]:
        load_s = pick(rng, 30, 150)
        onsets.append(start + load_s)
        life_rate = rate * pick(rng, 0.9, 1.1)
        level = model_load(t, start, base, load_s) + leak_ramp(t, start + load_s, life_rate) * (t >= start)
        over = np.flatnonzero((t >= start) & (level + saw >= limit))
        end = float(t[over[0]]) if over.size else np.inf
        v = np.where((t >= start) & (t < end), level + saw, v)
        if not over.size:
            break
        start = end + pick(rng, 30, 240)
        if start < t[-1]:
            restarts.append(start)
    v = np.where(v > 0, v + noise(rng, t.size, 8 * MIB), 0.0)
    return Trace(t, v, True, f"{rate / GIB:.1f} GiB/h until a {limit / GIB:.1f} GiB limit, OOM, "
                 f"{len(restarts)} restarts", rate, onsets[0], restarts, int(limit))


def long_step_leak(rng: np.random.Generator, dt: float) -> Trace:
    # Training steps of minutes (gradient accumulation): the step shows in a one-minute floor.
    base, amp, step = pick(rng, 8, 40) * GIB, pick(rng, 1, 8) * GIB, pick(rng, 30, 300)
    rate, onset = pick(rng, 1, 8) * GIB, pick(rng, 0.75, 1.5) * HOUR
    t = sample_times(rng, dt, onset + pick(rng, 1.0, 2.0) * HOUR)
    v = base + leak_ramp(t, onset, rate) + training_sawtooth(rng, t, step, amp) + noise(rng, t.size, 8 * MIB)
    return Trace(t, v, True, f"{rate / GIB:.1f} GiB/h under {step:.0f}-s steps of {amp / GIB:.1f} GiB",
                 rate, onset)


# --- non-leaks -------------------------------------------------------------------------


def record_warmup(rng: np.random.Generator, dt: float) -> Trace:
    # The caching allocator reserves more whenever a batch needs more than any batch
    # before it. Batches are padded to 4-12 lengths, the longer ones rarer: the
    # reserve grows fast in the first minutes, then in ever rarer steps, and stops
    # once the longest batch has come (in seconds to about an hour).
    t = sample_times(rng, dt, duration(rng, 2.0, 6.0))
    base, load_s, step = pick(rng, 6, 40) * GIB, pick(rng, 30, 150), pick(rng, 0.5, 10)
    buckets, ratio = int(rng.integers(4, 13)), pick(rng, 0.5, 0.85)
    odds = ratio ** np.arange(buckets)
    demand = rng.choice(buckets, int(t[-1] / step) + 2, p=odds / odds.sum())
    record = np.maximum.accumulate(demand)
    total, segment = pick(rng, 1, 20) * GIB, 20 * MIB
    reserved = np.floor((record + 1) / buckets * total / segment) * segment
    k = np.clip(((t - load_s) / step).astype(np.int64), 0, record.size - 1)
    v = model_load(t, 0.0, base, load_s) + (t >= load_s) * (
        reserved[k] + training_sawtooth(rng, t, step, pick(rng, 0.3, 3) * GIB))
    v += noise(rng, t.size, 8 * MIB)
    grows = np.flatnonzero(np.diff(reserved[k]) > 0)
    last = float(t[grows[-1] + 1]) if grows.size else load_s
    return Trace(t, np.maximum(v, 0.0), False, f"allocator grows at record batches ({step:.1f}-s steps, "
                 f"{buckets} lengths): {reserved[k[-1]] / GIB:.1f} GiB, the last at {last / 60:.0f} min")


def cycle_start(rng: np.random.Generator, dt: float) -> Trace:
    # A cycle whose first rise starts with the process: buffers gathered and freed at
    # each checkpoint, or a load cycle starting at its trough.
    t = sample_times(rng, dt, duration(rng, 2.0, 5.0))
    base, load_s = pick(rng, 6, 40) * GIB, pick(rng, 30, 150)
    since = np.maximum(t - load_s, 0.0)
    if rng.uniform() < 0.5:
        period, amp = pick(rng, 10, 28) * MINUTE, pick(rng, 0.5, 5) * GIB
        cycle = np.mod(since, period) / period * amp
        what = f"{amp / GIB:.1f} GiB gathered and freed every {period / 60:.0f} min from the start"
    else:
        period, amp = pick(rng, 20, 50) * MINUTE, pick(rng, 0.5, 5) * GIB
        x = np.mod(since / period, 1.0)
        cycle = amp * np.minimum(x / 0.55, (1 - x) / 0.45)
        what = f"a {period / 60:.0f}-min load cycle of {amp / GIB:.1f} GiB from its trough at the start"
    v = model_load(t, 0.0, base, load_s) + (t >= load_s) * (
        cycle + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.3, 3) * GIB))
    v += noise(rng, t.size, 8 * MIB)
    return Trace(t, np.maximum(v, 0.0), False, what)


def redeploy(rng: np.random.Generator, dt: float) -> Trace:
    # Rollouts restart the service; each new process comes back at about the same
    # level (a new version may need a little more), on a load that wanders.
    t = sample_times(rng, dt, duration(rng, 3.0, 6.0))
    level, v, start, starts = pick(rng, 6, 40) * GIB, np.zeros(t.size), 0.0, []
    stops = sorted(pick(rng, 0.1, 0.9) * t[-1] for _ in range(int(rng.integers(2, 6))))
    for end in [*stops, np.inf]:
        life = (t >= start) & (t < end)
        v = np.where(life, model_load(t, start, level, pick(rng, 20, 120)), v)
        start = end + pick(rng, 30, 300)
        starts.append(start)
        level *= pick(rng, 0.97, 1.08)
    wander = np.abs(ou(rng, t, pick(rng, 2, 15) * MINUTE, pick(rng, 0.05, 0.6) * GIB))
    v = np.where(v > 0, v + wander + noise(rng, t.size, 16 * MIB), 0.0)
    return Trace(t, v, False, f"{len(stops)} rollouts, each back at about the same level",
                 restarts_t_seconds=[s for s in starts if s < t[-1]])


def gappy_steps(rng: np.random.Generator, dt: float) -> Trace:
    # Step-ups that stop, some inside a logger gap, and runs of failed reads.
    t = sample_times(rng, dt, duration(rng, 3.0, 6.0))
    v = pick(rng, 8, 40) * GIB + training_sawtooth(rng, t, pick(rng, 0.3, 20), pick(rng, 0.5, 4) * GIB)
    steps = []
    # Two steps 10-40 minutes apart, sometimes a third an hour or more later: three
    # within half an hour would be a leak's stairs for that half hour.
    first = pick(rng, 0.15, 0.5) * t[-1]
    ats = [first, first + pick(rng, 10, 40) * MINUTE]
    if rng.uniform() < 0.5:
        ats.append(ats[-1] + pick(rng, 60, 120) * MINUTE)
    for at in ats:
        size, tau = pick(rng, 0.3, 5) * GIB, pick(rng, 0, 240)
        v = v + size * (1 - np.exp(-np.maximum(t - at, 0.0) / max(tau, 1.0))) * (t >= at)
        steps.append(f"{size / GIB:.1f} GiB at {at / 60:.0f} min")
    v += noise(rng, t.size, 8 * MIB)
    keep = logger_gaps(rng, t, int(rng.integers(2, 5)), 5 * MINUTE, 20 * MINUTE)
    for at in rng.integers(1, t.size - 40, int(rng.integers(1, 4))):
        v[at : at + int(rng.integers(2, 30))] = 0.0
    return Trace(t[keep], v[keep], False, "step-ups that stop, logger gaps: " + ", ".join(steps))
