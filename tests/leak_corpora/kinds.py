"""The kinds of the independent leak corpus: one function per kind, drawing its
parameters from the trace's generator (see ``processes.py`` for the building
blocks and ``independent.py`` for the seed list and the labels).

Leak kinds cover the shapes users report (issue 16): a leak under a training
loop of any step length, growth at each evaluation or checkpoint (stairs on a
training sawtooth), per-request growth under bursty load, growth that only shows
in the minimum between batches, a leak that starts after hours of flat use,
repeated OOM-restart cycles, and a leak from the process's start. Their rates
are drawn by band (``RATE_BANDS``) so that every band has traces: 100 MiB/h to
16 GiB/h, the lowest band below the default threshold of 200 MiB/h.

Non-leak kinds: a training loop alone (steps of a fifth of a second to ten
minutes), an allocator warm-up, step-ups that stop (instant or ramped), load
cycles and wandering inference load, evaluations every 15 minutes to 3 hours,
checkpoint accumulate-and-release cycles, failed reads and logger gaps, and
restarts that come back at the same level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .processes import (
    GIB,
    HOUR,
    MIB,
    MINUTE,
    Rng,
    ar1,
    bursty_traffic,
    loguniform,
    sample_clock,
    saturating,
    segment_grabs,
    training_loop,
)

CAPACITIES_GIB = (24, 40, 48, 80, 94, 141)
RATE_BANDS = ((100 * MIB, 200 * MIB), (200 * MIB, GIB), (GIB, 4 * GIB), (4 * GIB, 16 * GIB))


@dataclass
class Shape:
    """A kind's output before the common dressing (noise, reads, gaps): true memory
    ``v`` (bytes) at ``t`` (seconds) and the label."""

    t: np.ndarray
    v: np.ndarray
    leak: bool
    description: str
    rate_bytes_per_hour: float = 0.0
    onset_t_seconds: float | None = None
    restarts_t_seconds: list[float] = field(default_factory=list)
    limit_bytes: float | None = None
    leaked: np.ndarray | None = None  # a leak's own bytes at each sample (the rest is its usual use)


@dataclass(frozen=True)
class Setting:
    """What the seed list fixes for a trace: sampling interval and, for leaks, the rate band."""

    dt: float
    band: int


def device(rng: Rng) -> tuple[float, float]:
    """(capacity, model memory) of the GPU a trace runs on, bytes."""
    capacity = float(rng.choice(CAPACITIES_GIB)) * GIB
    return capacity, rng.uniform(0.2, 0.55) * capacity


def rate_in(rng: Rng, band: int) -> float:
    lo, hi = RATE_BANDS[band]
    return loguniform(rng, lo, hi)


def leak_duration(rng: Rng, onset: float) -> float:
    return min(8 * HOUR, onset + loguniform(rng, 1.5 * HOUR, 5 * HOUR))


def model_load(t: np.ndarray, start: float, size: float, load_s: float) -> np.ndarray:
    """The model's weights, loaded linearly over ``load_s`` from ``start``."""
    return size * np.clip((t - start) / load_s, 0.0, 1.0)


def step_length(rng: Rng) -> float:
    """A training step: a fifth of a second to ten minutes (log-uniform)."""
    return loguniform(rng, 0.2, 600.0)


# --- leaks ---------------------------------------------------------------------------


def ramp(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    rate, onset = rate_in(rng, s.band), rng.uniform(5 * MINUTE, 2 * HOUR)
    t = sample_clock(rng, s.dt, leak_duration(rng, onset))
    step, amp = step_length(rng), loguniform(rng, 0.2 * GIB, 0.15 * capacity)
    saw = training_loop(rng, t, step, amp, cv=rng.uniform(0.02, 0.2), floor_share=rng.uniform(0.05, 0.35))
    leaked = np.maximum(t - onset, 0.0) * rate / HOUR
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + leaked + saw
    return Shape(t, v, True, f"{rate / MIB:.0f} MiB/h under {step:.1f}-s steps of {amp / GIB:.1f} GiB",
                 rate, onset, limit_bytes=capacity, leaked=leaked)


def stairs(rng: Rng, s: Setting) -> Shape:
    # Each evaluation (or checkpoint) allocates a spike and keeps one buffer.
    capacity, base = device(rng)
    rate, onset = rate_in(rng, s.band), rng.uniform(5 * MINUTE, 1.5 * HOUR)
    every = loguniform(rng, 2 * MINUTE, 30 * MINUTE)
    t = sample_clock(rng, s.dt, leak_duration(rng, onset))
    evals = np.floor(np.maximum(t - onset, 0.0) / every) + (t >= onset)
    length, spike = rng.uniform(0.3, 3) * MINUTE, loguniform(rng, 0.5 * GIB, 8 * GIB)
    in_eval = (t >= onset) & (np.mod(t - onset, every) < length)
    saw = training_loop(rng, t, loguniform(rng, 0.3, 20.0), loguniform(rng, 0.3 * GIB, 6 * GIB))
    leaked = evals * rate * every / HOUR
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + leaked + in_eval * spike + saw
    return Shape(t, v, True, f"{rate * every / HOUR / MIB:.0f} MiB kept per evaluation every {every / 60:.1f} min",
                 rate, onset, limit_bytes=capacity, leaked=leaked)


def per_request(rng: Rng, s: Setting) -> Shape:
    # Every request leaks a little; traffic is bursty, so the floor climbs in spurts.
    capacity, base = device(rng)
    rate, onset = rate_in(rng, s.band), rng.uniform(0, 1.5 * HOUR)
    t = sample_clock(rng, s.dt, leak_duration(rng, onset))
    quiet, burst = loguniform(rng, 0.2, 5.0), loguniform(rng, 10.0, 80.0)
    load, served = bursty_traffic(rng, t, quiet, burst, loguniform(rng, 3, 30) * MINUTE, loguniform(rng, 0.5, 8) * MINUTE)
    since = np.maximum(served - np.interp(onset, t, served), 0.0)
    per = rate * (t[-1] - onset) / HOUR / max(float(since[-1]), 1.0)
    activations = load * loguniform(rng, 5 * MIB, 200 * MIB)
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + since * per + activations
    return Shape(t, v, True, f"per-request leak of {per / 2**10:.0f} KiB, bursty traffic, mean {rate / MIB:.0f} MiB/h",
                 rate, onset, limit_bytes=capacity, leaked=since * per)


def between_batches(rng: Rng, s: Setting) -> Shape:
    # Batches of varying size: the peaks wander by GiBs, only the minimum between
    # batches shows the growth.
    capacity, base = device(rng)
    rate, onset = rate_in(rng, s.band), rng.uniform(5 * MINUTE, 1.5 * HOUR)
    t = sample_clock(rng, s.dt, leak_duration(rng, onset))
    amp = loguniform(rng, 2 * GIB, 0.2 * capacity)
    saw = training_loop(rng, t, loguniform(rng, 0.5, 60.0), amp, floor_share=rng.uniform(0.05, 0.2), spread=0.8)
    leaked = np.maximum(t - onset, 0.0) * rate / HOUR
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + leaked + saw
    return Shape(t, v, True, f"{rate / MIB:.0f} MiB/h in the minimum between batches whose peaks vary by "
                 f"{0.8 * amp / GIB:.1f} GiB", rate, onset, limit_bytes=capacity, leaked=leaked)


def late(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    rate, onset = rate_in(rng, s.band), rng.uniform(1.5 * HOUR, 5 * HOUR)
    t = sample_clock(rng, s.dt, min(8 * HOUR, onset + loguniform(rng, 1.5 * HOUR, 3 * HOUR)))
    wander = ar1(rng, t, loguniform(rng, 60, 900), loguniform(rng, 16 * MIB, 300 * MIB))
    saw = training_loop(rng, t, step_length(rng), loguniform(rng, 0.2 * GIB, 4 * GIB))
    leaked = np.maximum(t - onset, 0.0) * rate / HOUR
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + wander + leaked + saw
    return Shape(t, v, True, f"flat for {onset / HOUR:.1f} h, then {rate / MIB:.0f} MiB/h", rate, onset,
                 limit_bytes=capacity, leaked=leaked)


def from_start(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    load_s = rng.uniform(30, 180)
    rate = rate_in(rng, s.band)
    t = sample_clock(rng, s.dt, leak_duration(rng, 0.0))
    saw = training_loop(rng, t, step_length(rng), loguniform(rng, 0.2 * GIB, 0.1 * capacity))
    leaked = np.maximum(t - load_s, 0.0) * rate / HOUR
    v = model_load(t, 0.0, base, load_s) + leaked + saw
    return Shape(t, v, True, f"{rate / MIB:.0f} MiB/h from the start (model loaded in {load_s:.0f} s)",
                 rate, load_s, limit_bytes=capacity, leaked=leaked)


def oom_restarts(rng: Rng, s: Setting) -> Shape:
    # Leaks until its peak meets the pod's limit, dies, comes back after a while,
    # loads its model and leaks again at about the same rate.
    capacity, base = device(rng)
    rate = rate_in(rng, max(s.band, 2))  # lives of 20 min to 3 h need GiB/h
    amp = loguniform(rng, 0.2 * GIB, 3 * GIB)
    limit = base + amp + rate * loguniform(rng, 1 / 3, 3.0)
    t = sample_clock(rng, s.dt, rng.uniform(3, 8) * HOUR)
    saw = training_loop(rng, t, loguniform(rng, 0.3, 30.0), amp)
    v, start, restarts, onsets, life_rate = np.zeros(t.size), 0.0, [], [], rate
    while start < t[-1]:
        load_s = rng.uniform(20, 150)
        onsets.append(start + load_s)
        level = model_load(t, start, base, load_s) + np.maximum(t - start - load_s, 0.0) * life_rate / HOUR
        alive = (t >= start) & (level + saw < limit)
        dead = np.flatnonzero((t >= start) & ~alive)
        end = t[dead[0]] if dead.size else np.inf
        v = np.where(alive & (t < end), level + saw, v)
        if not dead.size:
            break
        start = float(end + rng.uniform(30, 300))
        restarts.append(start)
        life_rate = rate * rng.uniform(0.9, 1.1)
    restarts = [r for r in restarts if r < t[-1]]
    return Shape(t, v, True, f"{rate / GIB:.1f} GiB/h to a {limit / GIB:.1f} GiB limit, OOM, "
                 f"{len(restarts)} restarts", rate, onsets[0], restarts, limit)


# --- non-leaks -----------------------------------------------------------------------


def training(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(2, 8) * HOUR)
    step, amp = step_length(rng), loguniform(rng, 0.2 * GIB, 0.2 * capacity)
    saw = training_loop(rng, t, step, amp, cv=rng.uniform(0.01, 0.2), floor_share=rng.uniform(0.05, 0.35))
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + saw
    return Shape(t, v, False, f"training, {step:.1f}-s steps of {amp / GIB:.1f} GiB")


def warmup(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(2, 8) * HOUR)
    total, settle = loguniform(rng, GIB, 20 * GIB), rng.uniform(2, 25) * MINUTE
    saw = training_loop(rng, t, loguniform(rng, 0.2, 30.0), loguniform(rng, 0.2 * GIB, 6 * GIB))
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + segment_grabs(rng, t, total, settle) + saw
    return Shape(t, v, False, f"allocator reserves {total / GIB:.1f} GiB within {settle / 60:.0f} min, then flat")


def step_ups(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(2, 8) * HOUR)
    v = model_load(t, 0.0, base, rng.uniform(20, 120))
    steps = []
    for _ in range(int(rng.integers(1, 4))):
        at, size = rng.uniform(0.1, 0.9) * t[-1], loguniform(rng, 0.3 * GIB, 8 * GIB)
        tau = 0.0 if rng.uniform() < 0.4 else loguniform(rng, 20.0, 300.0)
        v = v + saturating(t, at, size, tau)
        steps.append(f"{size / GIB:.1f} GiB at {at / 60:.0f} min (tau {tau:.0f} s)")
    v = v + training_loop(rng, t, loguniform(rng, 0.2, 60.0), loguniform(rng, 0.2 * GIB, 6 * GIB))
    return Shape(t, v, False, "step-ups that stop: " + ", ".join(steps))


def load_cycle(rng: Rng, s: Setting) -> Shape:
    # An inference server: KV cache and activations follow the load: a periodic
    # cycle or a wander, with requests on top.
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(2, 8) * HOUR)
    amp = loguniform(rng, 0.3 * GIB, 6 * GIB)
    if rng.uniform() < 0.5:
        period = rng.uniform(15, 45) * MINUTE  # rises over at most 27 min: within minWindow
        x = np.mod(t / period + rng.uniform(), 1.0)
        cycle = amp * np.minimum(x / 0.6, (1 - x) / 0.4)  # rises over 60% of the period
        what = f"a {period / 60:.0f}-min load cycle of {amp / GIB:.1f} GiB"
    else:
        cycle = np.abs(ar1(rng, t, loguniform(rng, 60, 1200), amp / 2))
        what = f"a wandering load of {amp / GIB:.1f} GiB"
    requests = (rng.uniform(size=t.size) < 0.1) * rng.exponential(0.3 * GIB, t.size)
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + cycle + requests
    return Shape(t, v, False, what)


def evals(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(3, 8) * HOUR)
    every, length = loguniform(rng, 15 * MINUTE, 3 * HOUR), loguniform(rng, MINUTE, 15 * MINUTE)
    extra = loguniform(rng, GIB, 10 * GIB)
    start = rng.uniform(0, every)
    in_eval = (t >= start) & (np.mod(t - start, every) < length)
    saw = training_loop(rng, t, loguniform(rng, 0.2, 30.0), loguniform(rng, 0.3 * GIB, 6 * GIB))
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + in_eval * extra + saw
    return Shape(t, v, False, f"evaluation every {every / 60:.0f} min for {length / 60:.1f} min "
                 f"(+{extra / GIB:.1f} GiB)")


def checkpoints(rng: Rng, s: Setting) -> Shape:
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(2, 8) * HOUR)
    every, grows = rng.uniform(5, 25) * MINUTE, loguniform(rng, 0.3 * GIB, 4 * GIB)
    held = np.mod(t + rng.uniform(0, every), every) / every * grows
    saw = training_loop(rng, t, loguniform(rng, 0.2, 30.0), loguniform(rng, 0.3 * GIB, 4 * GIB))
    v = model_load(t, 0.0, base, rng.uniform(20, 120)) + held + saw
    return Shape(t, v, False, f"{grows / GIB:.1f} GiB gathered and freed at each checkpoint every {every / 60:.0f} min")


def flaky_reads(rng: Rng, s: Setting) -> Shape:
    # Failed reads, [N/A] and logger gaps are added by the common dressing; this
    # kind gets many of them (see independent.dress).
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(2, 8) * HOUR)
    saw = training_loop(rng, t, loguniform(rng, 0.2, 60.0), loguniform(rng, 0.3 * GIB, 6 * GIB))
    return Shape(t, model_load(t, 0.0, base, rng.uniform(20, 120)) + saw, False,
                 "training with many failed reads, [N/A] and logger gaps")


def redeploys(rng: Rng, s: Setting) -> Shape:
    # A service restarted by rollouts: each new process loads the model and comes
    # back to about the same level (sometimes a little higher: a new version).
    capacity, base = device(rng)
    t = sample_clock(rng, s.dt, rng.uniform(3, 8) * HOUR)
    stops = sorted(rng.uniform(0.15, 0.9, int(rng.integers(1, 5))) * t[-1])
    level, v, start, starts = base, np.zeros(t.size), 0.0, []
    for end in [*stops, np.inf]:
        life = (t >= start) & (t < end)
        v = np.where(life, model_load(t, start, level, rng.uniform(20, 120)), v)
        start = float(end + rng.uniform(30, 300))
        starts.append(start)
        level = level * rng.uniform(0.98, 1.06)
    wander = np.abs(ar1(rng, t, loguniform(rng, 60, 600), loguniform(rng, 32 * MIB, GIB)))
    v = np.where(v > 0, v + wander, 0.0)
    return Shape(t, v, False, f"{len(stops)} rollouts, each back at about the same level",
                 restarts_t_seconds=[r for r in starts if r < t[-1]])


Kind = Callable[[Rng, Setting], Shape]
LEAK_KINDS: dict[str, Kind] = {
    "ramp": ramp,
    "stairs": stairs,
    "per-request": per_request,
    "between-batches": between_batches,
    "late": late,
    "from-start": from_start,
    "oom-restarts": oom_restarts,
}
NON_LEAK_KINDS: dict[str, Kind] = {
    "training": training,
    "warmup": warmup,
    "step-ups": step_ups,
    "load-cycle": load_cycle,
    "evals": evals,
    "checkpoints": checkpoints,
    "flaky-reads": flaky_reads,
    "redeploys": redeploys,
}
KINDS: dict[str, Kind] = {**LEAK_KINDS, **NON_LEAK_KINDS}
