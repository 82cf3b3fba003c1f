"""The floor of a VRAM series: its lowest sample per block of time.

A training sawtooth, eval spikes and request bursts sit above their floor; a
leak raises the floor itself. Floor points far above their neighbours (a block
that missed the floor) are left out by :func:`misread`.
"""

from __future__ import annotations

import numpy as np

from ..robust import median
from .tuning import MIB
from .tuning import TUNING as T


def floor_points(
    t: np.ndarray, v: np.ndarray, block_seconds: float = T.slow_block_seconds, min_samples: int = T.min_block_samples
) -> tuple[np.ndarray, np.ndarray]:
    """The segment's floor: the lowest sample per block, at the time it was seen.

    Blocks are ``block_seconds`` long (or ``min_samples`` sampling intervals when
    sampling is sparse), counted back from the last sample; the oldest block is
    dropped when it covers less than half a block, since its minimum over fewer
    samples would sit high. ``t`` increasing, ``v`` without NaN
    (``validate_series``'s output), both non-empty.
    """
    dt = median(np.diff(t)) if t.size > 1 else block_seconds
    width = max(block_seconds, min_samples * dt)
    block = np.floor((t[-1] - t) / width).astype(np.int64)
    starts = np.flatnonzero(np.diff(block, prepend=block[0] + 1))
    # The first lowest sample of each block, without a Python loop over blocks
    # (the agent computes this for every pod).
    lengths = np.diff(np.append(starts, t.size))
    hits = np.flatnonzero(v == np.repeat(np.minimum.reduceat(v, starts), lengths))
    idx = hits[np.diff(block[hits], prepend=block[0] + 1) != 0]
    if t[-1] - t[0] < (block[0] + 0.5) * width and idx.size > 1:
        idx = idx[1:]
    return t[idx], v[idx]


def misread(fv: np.ndarray) -> np.ndarray:
    """Floor points that misread the floor.

    Interior points far above the line through their neighbours (a block that
    missed a sawtooth's floor, a spike covering a whole block); the last point
    far above the line through the two before it. A floor can only read too high,
    and only isolated points count: a run of high points is a level (a step). The
    first points may also read too low (the process was still loading its
    model) and are peeled off while they lie far from the line through the next two.
    """
    out = np.zeros(fv.size, dtype=bool)
    if fv.size < 4:
        return out
    d2 = fv[1:-1] - (fv[:-2] + fv[2:]) / 2
    scale = 1.4826 * median(np.abs(d2 - median(d2)))
    threshold = T.outlier_sigmas * max(scale, median(np.abs(d2)), MIB)
    if abs(fv[0] - (2 * fv[1] - fv[2])) > 2 * threshold:
        out[0] = True
        out[1:] = misread(fv[1:])
        return out
    out[1:-1] = d2 > threshold
    out[-1] = fv[-1] - (2 * fv[-2] - fv[-3]) > 2 * threshold
    return out


def rolling_floor(fv: np.ndarray) -> np.ndarray:
    """Each floor point replaced by the lowest of it and its two neighbours.

    A block that missed the floor (or two in a row) reads its neighbour's
    floor instead; on a rising or falling line each point reads its lower
    neighbour, one block's growth lower, and keeps its time.
    """
    if fv.size < 2:
        return fv.copy()
    padded = np.concatenate(([np.inf], fv, [np.inf]))
    return np.minimum(np.minimum(padded[:-2], padded[1:-1]), padded[2:])
