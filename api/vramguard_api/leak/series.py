"""Input and segments of a VRAM series: validation, zeros, restarts and dropouts.

A sample near zero is a failed read or no process. A run of them is a
*restart* when the memory after it is lower than before it (the leaked memory
was freed): the series is cut there and only the last segment is judged.
Otherwise the run is a *dropout* and is left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..robust import median
from .tuning import TUNING as T

Samples = Sequence[float] | np.ndarray
"""A series' times (seconds) or values (bytes): a sequence or a 1-D numpy array."""


def validate_series(times_s: Samples, values_bytes: Samples) -> tuple[np.ndarray, np.ndarray]:
    """Float arrays of the samples that have a value (NaN values dropped).

    Raises ``ValueError`` naming the argument and index of the first bad entry.
    """
    t = np.asarray(times_s, dtype=float)
    v = np.asarray(values_bytes, dtype=float)
    if t.ndim != 1 or v.ndim != 1 or t.size != v.size:
        raise ValueError(
            f"times_s and values_bytes must be 1-D and of one length: {t.shape} != {v.shape}"
        )
    if not np.all(np.isfinite(t)):
        i = int(np.flatnonzero(~np.isfinite(t))[0])
        raise ValueError(f"times_s[{i}] = {t[i]} is not finite")
    if t.size > 1 and not np.all(np.diff(t) > 0):
        i = int(np.flatnonzero(np.diff(t) <= 0)[0]) + 1
        raise ValueError(f"times_s must increase: times_s[{i}] = {t[i]} follows {t[i - 1]}")
    bad = np.isinf(v) | (v < 0)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"values_bytes[{i}] = {v[i]} is not a byte count")
    keep = ~np.isnan(v)
    return t[keep], v[keep]


def current_segment(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples since the last restart, with zeros (dropouts) left out.

    ``t`` increasing seconds, ``v`` bytes (no NaN). Leading zeros (the process had
    not started) are dropped; trailing zeros are dropped too, since whether they
    end in a restart is not yet known.
    """
    start, zero = segment_start(t, v)
    keep = ~zero[start:]
    return t[start:][keep], v[start:][keep]


def previous_segment(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples of the process life before the current one (``current_segment``'s
    output for the series up to the last restart), zeros left out; empty arrays
    when the series shows no restart."""
    start, zero = segment_start(t, v)
    if start >= t.size or not zero[:start].any() or zero[:start].all():
        return t[:0], v[:0]
    return current_segment(t[:start], v[:start])


def segment_start(t: np.ndarray, v: np.ndarray) -> tuple[int, np.ndarray]:
    """(index where the current segment starts, mask of the zero samples)."""
    positive = v[v > 0]
    if positive.size == 0:
        return t.size, np.ones(t.size, dtype=bool)
    zero = v <= max(T.zero_bytes, T.zero_fraction * median(positive))
    start = 0
    for run_start, run_end in _runs(zero):
        if run_start == 0 or (run_end < t.size and _is_restart(t, v, zero, run_start, run_end)):
            start = run_end
    return start, zero


def restarts(t: np.ndarray, v: np.ndarray) -> list[float]:
    """Times (seconds) at which a new process started: the first sample after each
    run of zeros that is a restart. For a picture of the series."""
    positive = v[v > 0]
    if positive.size == 0:
        return []
    zero = v <= max(T.zero_bytes, T.zero_fraction * median(positive))
    return [
        float(t[end])
        for start, end in _runs(zero)
        if start > 0 and end < t.size and _is_restart(t, v, zero, start, end)
    ]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) index ranges of the True runs of ``mask``."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(
        zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True)
    )


def _is_restart(
    t: np.ndarray, v: np.ndarray, zero: np.ndarray, run_start: int, run_end: int
) -> bool:
    """Whether the memory after a zero run is lower than before it (the leaked memory was freed)."""
    lo = int(np.searchsorted(t, t[run_start] - T.restart_window_seconds))
    hi = int(np.searchsorted(t, t[run_end - 1] + T.restart_window_seconds, side="right"))
    before, after = v[lo:run_start][~zero[lo:run_start]], v[run_end:hi][~zero[run_end:hi]]
    if before.size == 0 or after.size == 0:
        return False
    floor_before, floor_after = float(before.min()), float(after.min())
    return floor_after < floor_before - max(
        T.restart_drop_bytes, T.restart_drop_fraction * floor_before
    )
