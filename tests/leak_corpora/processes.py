"""Building blocks of the independent leak corpus (``tests.leak_corpora.independent``).

Written apart from ``hack/make_corpus.py`` (the tuning corpus) and on purpose
unlike it: a training loop is a renewal process of steps (lognormal step
times) whose profile has its own floor share, not a jittered phase; sampling is
``nvidia-smi -l``'s (each query takes a little time, so the clock drifts), with
gaps when the logger was down and ``[N/A]`` reads; noise is heavy-tailed
(Laplace), and loads are built on a regular grid and interpolated.

Every function takes the trace's ``numpy.random.Generator`` and draws in a fixed
order, so that a seed always gives the same trace. Times in seconds, memory in
bytes (float until the trace is written).
"""

from __future__ import annotations

import numpy as np

MIB = float(2**20)
GIB = float(2**30)
MINUTE = 60.0
HOUR = 3600.0
GRID_SECONDS = 10.0  # loads and wanders are drawn on this grid, then interpolated

Rng = np.random.Generator


def loguniform(rng: Rng, lo: float, hi: float) -> float:
    """A value between ``lo`` and ``hi``, uniform in log scale."""
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def sample_clock(rng: Rng, dt: float, duration: float) -> np.ndarray:
    """``nvidia-smi -l dt`` sample times over ``duration`` seconds: each query takes
    a few milliseconds to a few percent of ``dt``, so the clock drifts late."""
    n = int(duration / dt) + 1
    late = rng.exponential(min(0.05, 0.01 * dt), n)
    t = np.cumsum(np.full(n, dt) + late)
    return t - t[0]


def logger_gaps(rng: Rng, t: np.ndarray, count: int, lo: float = MINUTE, hi: float = 15 * MINUTE) -> np.ndarray:
    """A mask of the samples kept: ``count`` windows of ``lo``..``hi`` seconds in
    which the logger (or the agent) was down and wrote nothing."""
    keep = np.ones(t.size, dtype=bool)
    for _ in range(count):
        start = rng.uniform(0.1, 0.9) * t[-1]
        keep &= ~((t >= start) & (t < start + rng.uniform(lo, hi)))
    return keep


def not_available(rng: Rng, v: np.ndarray, fraction: float) -> np.ndarray:
    """``[N/A]`` reads (NaN) for a ``fraction`` of the samples."""
    v = v.copy()
    v[rng.uniform(size=v.size) < fraction] = np.nan
    return v


def failed_reads(rng: Rng, v: np.ndarray, dt: float, single: float, runs: int) -> np.ndarray:
    """Reads that came back as zero: a ``single`` fraction of samples, and ``runs``
    runs of 2 to 20 samples (at most 5 minutes of samples ``dt`` seconds apart)."""
    v = v.copy()
    v[rng.uniform(size=v.size) < single] = 0.0
    longest = max(3, min(21, int(300 / dt)))
    for _ in range(runs):
        i = int(rng.integers(1, max(2, v.size - longest)))
        v[i : i + int(rng.integers(2, longest))] = 0.0
    return v


def allocator_noise(rng: Rng, n: int, scale: float) -> np.ndarray:
    """Heavy-tailed allocator jitter (Laplace, ``scale`` bytes)."""
    return rng.laplace(0.0, scale, n)


def training_loop(
    rng: Rng,
    t: np.ndarray,
    step_s: float,
    amplitude: float,
    *,
    cv: float = 0.08,
    floor_share: float = 0.2,
    spread: float = 0.0,
) -> np.ndarray:
    """Activation memory of a training loop at times ``t``.

    Steps last ``step_s`` seconds on average, each drawn from a lognormal with
    coefficient of variation ``cv``. A step starts at its floor for
    ``floor_share`` of its time (data loading, optimizer), then the forward pass
    allocates up to its peak over 55% of the rest and the backward pass frees it
    over the remaining 45%. The peak is ``amplitude``, or with ``spread`` > 0 a
    uniform draw per step in ``[(1 - spread) * amplitude, amplitude]`` (batches
    of varying sequence lengths)."""
    count = int(t[-1] / step_s * 1.3) + 16
    sigma = np.sqrt(np.log(1 + cv * cv))
    steps = step_s * rng.lognormal(-sigma * sigma / 2, sigma, count)
    edges = np.concatenate(([-rng.uniform(0, step_s)], np.cumsum(steps)))
    edges[1:] += edges[0]
    k = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, count - 1)
    phase = (t - edges[k]) / steps[k]
    busy = np.clip((phase - floor_share) / (1 - floor_share), 0.0, 1.0)
    up = np.clip(busy / 0.55, 0.0, 1.0)
    down = np.clip((busy - 0.55) / 0.45, 0.0, 1.0)
    peaks = amplitude * (1 - spread * rng.uniform(0, 1, count))
    return peaks[k] * (up - down) * (busy > 0)


def grid(t: np.ndarray) -> np.ndarray:
    """The regular grid that covers ``t``."""
    return np.arange(0.0, t[-1] + 2 * GRID_SECONDS, GRID_SECONDS)


def ar1(rng: Rng, t: np.ndarray, tau: float, sd: float) -> np.ndarray:
    """A stationary AR(1) wander (time constant ``tau`` s, standard deviation ``sd``)
    on the grid, interpolated at ``t``."""
    g = grid(t)
    a = np.exp(-GRID_SECONDS / tau)
    shocks = rng.normal(0.0, sd * np.sqrt(1 - a * a), g.size)
    x = np.empty(g.size)
    x[0] = rng.normal(0.0, sd)
    for i in range(1, g.size):
        x[i] = a * x[i - 1] + shocks[i]
    return np.interp(t, g, x)


def bursty_traffic(
    rng: Rng, t: np.ndarray, quiet: float, burst: float, every_s: float, burst_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Requests at times ``t``: (requests per second, requests served so far). An
    on/off process on the grid, ``quiet`` requests/s with bursts of ``burst``
    requests/s that start on average every ``every_s`` seconds and last ``burst_s``
    on average; Poisson counts."""
    g = grid(t)
    on = np.zeros(g.size, dtype=bool)
    at = rng.exponential(every_s)
    while at < g[-1]:
        length = rng.exponential(burst_s)
        on |= (g >= at) & (g < at + length)
        at += length + rng.exponential(every_s)
    counts = rng.poisson(np.where(on, burst, quiet) * GRID_SECONDS)
    return np.interp(t, g, counts / GRID_SECONDS), np.interp(t, g, np.cumsum(counts))


def saturating(t: np.ndarray, start: float, size: float, tau: float) -> np.ndarray:
    """Memory a cache takes from ``start``: ``size`` bytes approached with time constant
    ``tau`` (0 for an instant step)."""
    after = np.maximum(t - start, 0.0)
    if tau <= 0:
        return np.where(t >= start, size, 0.0)
    return size * (1 - np.exp(-after / tau)) * (t >= start)


def segment_grabs(rng: Rng, t: np.ndarray, total: float, settle_s: float) -> np.ndarray:
    """A caching allocator's warm-up: it reserves ``total`` bytes in 2 to 12 segments,
    grabbed at times that thin out (most early, the last by ``settle_s``)."""
    count = int(rng.integers(2, 13))
    times = np.sort(settle_s * rng.uniform(0, 1, count) ** 2)
    sizes = rng.dirichlet(np.ones(count)) * total
    return np.sum([np.where(t >= at, size, 0.0) for at, size in zip(times, sizes, strict=True)], axis=0)
