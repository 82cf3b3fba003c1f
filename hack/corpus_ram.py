"""Host-RAM kinds of the tuning corpus (``hack/make_corpus.py``, issue 30): a pod's
working set (cgroup usage less inactive file pages, as the agent reads it) where
data loading and CPU preprocessing leak, and the look-alikes that do not.

Deterministic: every function draws from the trace's generator in a fixed order.
"""

from __future__ import annotations

import numpy as np
from corpus_shapes import GIB, HOUR, MIB, MINUTE, Trace, duration, noise, pick, sample_times, training_sawtooth


def _prefetch_ripple(rng: np.random.Generator, t: np.ndarray) -> np.ndarray:
    """Batches prefetched by the loader and freed by the step: a sawtooth of a few hundred MiB."""
    return training_sawtooth(rng, t, pick(rng, 0.3, 5), pick(rng, 100, 800) * MIB)


def loader_cow(rng: np.random.Generator, dt: float) -> Trace:
    # PyTorch DataLoader workers read a dataset held in Python objects: each access
    # writes a refcount, so every page a worker touches becomes its own copy
    # (copy-on-access). Random sampling touches 1 - exp(-t / epoch) of the dataset;
    # an epoch longer than the trace makes that a steady, slightly slowing rise.
    t = sample_times(rng, dt, duration(rng))
    workers, dataset, epoch = int(rng.integers(4, 17)), pick(rng, 2, 8) * GIB, pick(rng, 8, 24) * HOUR
    onset = pick(rng, 2, 15) * MINUTE  # workers start after the model is loaded
    touched = 1 - np.exp(-np.maximum(t - onset, 0.0) / epoch)
    v = pick(rng, 4, 16) * GIB + workers * dataset * touched + _prefetch_ripple(rng, t)
    v += noise(rng, t.size, 16 * MIB)
    rate = workers * dataset / epoch * HOUR
    desc = f"{workers} DataLoader workers copying a {dataset / GIB:.1f} GiB dataset on access (epoch {epoch / HOUR:.0f} h)"
    return Trace(t, v, True, desc, rate, onset)


def pinned_leak(rng: np.random.Generator, dt: float) -> Trace:
    # Page-locked (pinned) host buffers allocated for transfers and never freed:
    # a step of a few MiB every few seconds, from a code path taken after a while.
    t = sample_times(rng, dt, duration(rng))
    size, every, onset = pick(rng, 8, 64) * MIB, pick(rng, 5, 60), pick(rng, 0, 1.5) * HOUR
    leaked = np.floor(np.maximum(t - onset, 0.0) / every) * size
    v = pick(rng, 4, 24) * GIB + leaked + _prefetch_ripple(rng, t) + noise(rng, t.size, 8 * MIB)
    rate = size / every * HOUR
    return Trace(t, v, True, f"pinned buffers of {size / MIB:.0f} MiB leaked every {every:.0f} s", rate, onset)


def cache_plateau(rng: np.random.Generator, dt: float) -> Trace:
    # A preprocessing cache bounded by size (an LRU of decoded samples, tokenized
    # text): it fills over tens of minutes, then stays.
    t = sample_times(rng, dt, duration(rng))
    size, tau, at = pick(rng, 1, 12) * GIB, pick(rng, 5, 20) * MINUTE, pick(rng, 0, 0.3) * t[-1]
    fill = size * (1 - np.exp(-np.maximum(t - at, 0.0) / tau))
    v = pick(rng, 4, 16) * GIB + fill + _prefetch_ripple(rng, t) + noise(rng, t.size, 16 * MIB)
    return Trace(t, v, False, f"a {size / GIB:.1f} GiB cache filling with tau {tau / MINUTE:.0f} min at {at / MINUTE:.0f} min")


def page_cache(rng: np.random.Generator, dt: float) -> Trace:
    # Reading the dataset from files fills the page cache: the cgroup's usage grows
    # by the files read, but pages read once stay inactive and are not working
    # set. What the second pass promotes to the active list is, until the kernel
    # balances the lists: the working set rises a little and drops back, again.
    t = sample_times(rng, dt, duration(rng))
    period, active = pick(rng, 20, 90) * MINUTE, pick(rng, 0.3, 3) * GIB
    phase = np.mod(t + pick(rng, 0, period), period) / period
    promoted = active * np.minimum(phase / 0.7, 1.0) * (phase < 0.9)
    v = pick(rng, 4, 16) * GIB + promoted + _prefetch_ripple(rng, t) + noise(rng, t.size, 16 * MIB)
    desc = f"page cache of a dataset read: {active / GIB:.1f} GiB active file pages every {period / MINUTE:.0f} min"
    return Trace(t, v, False, desc)
