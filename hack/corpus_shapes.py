"""Building blocks and non-leak kinds of the tuning corpus (``hack/make_corpus.py``).

Deterministic: every function draws from the trace's generator in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MIB = 2**20
GIB = 2**30
MINUTE = 60.0
HOUR = 3600.0


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


# --- non-leak kinds added for issue 16 ----------------------------------------------


def slow_steps(rng: np.random.Generator, dt: float) -> Trace:
    # Long training steps (big batches, gradient accumulation): the step's rise and
    # fall show in a one-minute floor.
    t = sample_times(rng, dt, duration(rng))
    base, period, amp = pick(rng, 8, 40) * GIB, pick(rng, 30, 300), pick(rng, 1, 10) * GIB
    v = base + training_sawtooth(rng, t, period, amp) + noise(rng, t.size, 8 * MIB)
    return Trace(t, v, False, f"training steps of {period:.0f} s, {amp / GIB:.1f} GiB")


def cache_fill(rng: np.random.Generator, dt: float) -> Trace:
    # A cache fills after a change (more traffic, a longer context): a ramp of a few
    # minutes that stops, one to three times.
    t = sample_times(rng, dt, duration(rng))
    v = pick(rng, 8, 40) * GIB + training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 0.5, 4) * GIB)
    fills = []
    for _ in range(int(rng.integers(1, 4))):
        at, size, tau = pick(rng, 0.15, 0.9) * t[-1], pick(rng, 0.3, 6) * GIB, pick(rng, 30, 240)
        v = v + size * (1 - np.exp(-np.maximum(t - at, 0.0) / tau)) * (t >= at)
        fills.append(f"{size / GIB:.1f} GiB at {at / 60:.0f} min (tau {tau:.0f} s)")
    v += noise(rng, t.size, 8 * MIB)
    return Trace(t, v, False, "cache fills that stop: " + ", ".join(fills))
