"""The tuning corpus (tests/fixtures/leak-corpus/, written by hack/make_corpus.py):
the traces the detector's constants were chosen on."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

from .trace import Trace

__all__ = ["CORPUS", "Trace", "labels", "names", "trace"]

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "leak-corpus"


@cache
def labels() -> tuple[dict[str, object], ...]:
    return tuple(json.loads((CORPUS / "labels.json").read_text()))


@cache
def trace(name: str) -> Trace:
    """The trace of file ``name``. Its exhaustion is the first death (a zero read
    after the onset) of a trace with a limit: the oom-restart kind."""
    label = next(lab for lab in labels() if lab["file"] == name)
    data = np.loadtxt(CORPUS / name, delimiter=",", skiprows=1)
    t, v = data[:, 0], data[:, 1]
    onset = None if label["onset_t_seconds"] is None else float(label["onset_t_seconds"])  # type: ignore[arg-type]
    limit = label["limit_bytes"]
    exhaustion = None
    if limit is not None and onset is not None:
        dead = np.flatnonzero((v <= 0) & (t > onset))
        exhaustion = float(t[dead[0]]) if dead.size else None
    return Trace(
        name=name,
        kind=str(label["kind"]),
        leak=bool(label["leak"]),
        rate_bytes_per_hour=float(label["rate_bytes_per_hour"]),  # type: ignore[arg-type]
        onset_t_seconds=onset,
        restarts_t_seconds=tuple(label["restarts_t_seconds"]),  # type: ignore[arg-type]
        limit_bytes=None if limit is None else int(limit),  # type: ignore[call-overload]
        exhaustion_t_seconds=exhaustion,
        sample_interval_seconds=float(label["sample_interval_seconds"]),  # type: ignore[arg-type]
        description=str(label["description"]),
        t=t,
        v=v,
    )


def names(leak: bool | None = None) -> list[str]:
    """Trace file names, all or only leaks / non-leaks."""
    return [str(lab["file"]) for lab in labels() if leak is None or lab["leak"] == leak]
