"""The independent leak corpus: traces made at test time from a committed seed list.

The detector is tuned on the corpus of ``hack/make_corpus.py``
(``tests/fixtures/leak-corpus/``); its figures are reported on this one, which
a different generator (``kinds.py``, ``processes.py``) makes with different
parameters: rates of 100 MiB/h to 16 GiB/h, sample intervals of 1 to 60 s,
training steps of 0.2 s to 10 min, evaluations every 15 min to 3 h, heavy-tailed
noise, failed reads, ``[N/A]`` reads and logger gaps.

``tests/fixtures/leak-corpus-independent/seeds.json`` lists every trace: name,
kind, seed, sampling interval, rate band (leaks) and the SHA-256 of its
samples, so that a change of the generator (or of numpy's random streams) shows
as a failed check instead of silently new figures. ``python -m
tests.leak_corpora.independent --out DIR`` writes the traces as
``t_seconds,bytes`` CSVs with a ``labels.json`` (``--seeds`` rewrites the seed list).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np

from .kinds import KINDS, LEAK_KINDS, NON_LEAK_KINDS, Setting, Shape
from .processes import MIB, MINUTE, Rng, allocator_noise, failed_reads, logger_gaps, loguniform, not_available
from .trace import Trace

__all__ = ["INTERVALS", "LEAK_KINDS", "NON_LEAK_KINDS", "checksum", "entries", "names", "seed_list", "trace"]

SEEDS = Path(__file__).resolve().parents[1] / "fixtures" / "leak-corpus-independent" / "seeds.json"
LEAK_VARIANTS, NON_LEAK_VARIANTS = 8, 6
INTERVALS = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)
FIRST_SEED = 160_000  # far from the tuning corpus's seeds (1000..15003)


def seed_list() -> list[dict[str, object]]:
    """The seed list as ``--seeds`` writes it (without checksums)."""
    entries: list[dict[str, object]] = []
    for k, kind in enumerate(KINDS):
        variants = LEAK_VARIANTS if kind in LEAK_KINDS else NON_LEAK_VARIANTS
        for variant in range(variants):
            entries.append({
                "name": f"{kind}-{variant}",
                "kind": kind,
                "seed": FIRST_SEED + 100 * k + variant,
                "sample_interval_seconds": INTERVALS[(variant * 3 + k) % len(INTERVALS)],
                "band": variant % 4 if kind in LEAK_KINDS else None,
            })
    return entries


def make(entry: dict[str, object]) -> Trace:
    """Generate the trace of one seed-list entry (deterministic)."""
    rng = np.random.default_rng(int(entry["seed"]))  # type: ignore[call-overload]
    kind = str(entry["kind"])
    dt = float(entry["sample_interval_seconds"])  # type: ignore[arg-type]
    shape = KINDS[kind](rng, Setting(dt, int(entry["band"] or 0)))  # type: ignore[call-overload]
    exhaustion = _exhaust(rng, shape)
    values, keep = dress(rng, shape, heavy=kind == "flaky-reads")
    return Trace(
        name=str(entry["name"]),
        kind=kind,
        leak=shape.leak,
        rate_bytes_per_hour=shape.rate_bytes_per_hour,
        onset_t_seconds=shape.onset_t_seconds,
        restarts_t_seconds=tuple(shape.restarts_t_seconds),
        limit_bytes=None if shape.limit_bytes is None else int(shape.limit_bytes),
        exhaustion_t_seconds=exhaustion,
        sample_interval_seconds=dt,
        description=shape.description,
        t=np.round(shape.t[keep], 3),
        v=values[keep],
    )


def shape_dt(shape: Shape) -> float:
    return float(np.median(np.diff(shape.t)))


def _exhaust(rng: Rng, shape: Shape) -> float | None:
    """Set a leak's limit and say when the trace first meets it.

    A leak gets the pod limit it would meet 30 minutes to 4 hours after its onset
    at its rate (at least 1 GiB above its highest use without the leak), or the
    device's capacity when that is lower. A leak that meets it dies there: a few
    zero reads, then the log ends. The oom-restarts kind has its own limit and
    dies and restarts by itself: its exhaustion is its first death."""
    if not shape.leak or shape.onset_t_seconds is None:
        return None
    if shape.restarts_t_seconds:
        dead = np.flatnonzero((shape.v <= 0) & (shape.t > shape.onset_t_seconds))
        return float(shape.t[dead[0]]) if dead.size else None
    usual = float(np.max(shape.v - (shape.leaked if shape.leaked is not None else 0.0)))
    headroom = max(shape.rate_bytes_per_hour * loguniform(rng, 0.5, 4.0), float(2**30))
    shape.limit_bytes = min(shape.limit_bytes or np.inf, usual + headroom)
    over = np.flatnonzero(shape.v >= shape.limit_bytes)
    if not over.size:
        return None
    end = min(shape.t.size, int(over[0]) + int(rng.integers(2, 8)))
    shape.v = np.where(np.arange(shape.t.size) >= over[0], 0.0, shape.v)[:end]
    shape.t = shape.t[:end]
    return float(shape.t[over[0]])


def dress(rng: Rng, shape: Shape, heavy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Noise, failed reads, ``[N/A]`` and logger gaps, then whole MiB as NVML reports
    them: (values with NaN for ``[N/A]``, mask of the samples the log kept)."""
    alive = shape.v > 0
    v = np.where(alive, shape.v + allocator_noise(rng, shape.t.size, loguniform(rng, MIB, 32 * MIB)), 0.0)
    if heavy:
        v = failed_reads(rng, v, shape_dt(shape), rng.uniform(0.01, 0.03), int(rng.integers(3, 9)))
        v = not_available(rng, v, rng.uniform(0.02, 0.05))
        keep = logger_gaps(rng, shape.t, int(rng.integers(2, 5)), hi=30 * MINUTE)
    else:
        v = failed_reads(rng, v, shape_dt(shape), rng.uniform(0, 0.005), int(rng.integers(0, 4)))
        v = not_available(rng, v, rng.uniform(0, 0.01))
        keep = logger_gaps(rng, shape.t, int(rng.integers(0, 3)))
    return np.round(np.maximum(v, 0.0) / MIB) * MIB, keep


def checksum(tr: Trace) -> str:
    """SHA-256 of a trace's samples (times to the millisecond, whole MiB)."""
    data = np.concatenate([np.round(tr.t * 1000), np.nan_to_num(tr.v / MIB, nan=-1.0)]).astype(np.int64)
    return hashlib.sha256(data.tobytes()).hexdigest()


@cache
def entries() -> tuple[dict[str, object], ...]:
    return tuple(json.loads(SEEDS.read_text()))


@cache
def trace(name: str) -> Trace:
    return make(next(e for e in entries() if e["name"] == name))


def names(leak: bool | None = None) -> list[str]:
    """Trace names, all or only leaks / non-leaks."""
    return [
        str(e["name"])
        for e in entries()
        if leak is None or (e["kind"] in LEAK_KINDS) == leak
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the independent leak corpus as CSVs, or its seed list.")
    parser.add_argument("--out", type=Path, help="folder for t_seconds,bytes CSVs and labels.json")
    parser.add_argument("--seeds", action="store_true", help=f"rewrite {SEEDS} (seeds and checksums)")
    args = parser.parse_args(argv)
    if args.seeds:
        listed = seed_list()
        for e in listed:
            e["sha256"] = checksum(make(e))
        SEEDS.parent.mkdir(parents=True, exist_ok=True)
        SEEDS.write_text(json.dumps(listed, indent=1) + "\n")
        print(f"wrote {len(listed)} entries to {SEEDS}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        labels = []
        for e in entries():
            tr = trace(str(e["name"]))
            lines = ["t_seconds,bytes"] + [f"{t:.3f},{'' if np.isnan(v) else int(v)}" for t, v in zip(tr.t, tr.v, strict=True)]
            (args.out / f"{tr.name}.csv").write_text("\n".join(lines) + "\n")
            labels.append(tr.label())
        (args.out / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
        print(f"wrote {len(labels)} traces to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
