"""The labelled leak corpus (tests/fixtures/leak-corpus/, written by hack/make_corpus.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "leak-corpus"
MINUTE = 60.0


@dataclass(frozen=True)
class Trace:
    """One labelled trace: times (s), VRAM (bytes) and its label from labels.json."""

    name: str
    kind: str
    leak: bool
    rate_bytes_per_hour: float
    onset_t_seconds: float | None
    restarts_t_seconds: tuple[float, ...]
    limit_bytes: int | None
    t: np.ndarray
    v: np.ndarray

    def prefix(self, end_t_seconds: float) -> tuple[np.ndarray, np.ndarray]:
        """The samples up to ``end_t_seconds``, as a live detector would have them then."""
        n = int(np.searchsorted(self.t, end_t_seconds, side="right"))
        return self.t[:n], self.v[:n]


@cache
def labels() -> tuple[dict[str, object], ...]:
    return tuple(json.loads((CORPUS / "labels.json").read_text()))


@cache
def trace(name: str) -> Trace:
    label = next(lab for lab in labels() if lab["file"] == name)
    data = np.loadtxt(CORPUS / name, delimiter=",", skiprows=1)
    onset = label["onset_t_seconds"]
    return Trace(
        name=name,
        kind=str(label["kind"]),
        leak=bool(label["leak"]),
        rate_bytes_per_hour=float(label["rate_bytes_per_hour"]),  # type: ignore[arg-type]
        onset_t_seconds=None if onset is None else float(onset),  # type: ignore[arg-type]
        restarts_t_seconds=tuple(label["restarts_t_seconds"]),  # type: ignore[arg-type]
        limit_bytes=label["limit_bytes"],  # type: ignore[arg-type]
        t=data[:, 0],
        v=data[:, 1],
    )


def names(leak: bool | None = None) -> list[str]:
    """Trace file names, all or only leaks / non-leaks."""
    return [str(lab["file"]) for lab in labels() if leak is None or lab["leak"] == leak]
