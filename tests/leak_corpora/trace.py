"""One labelled VRAM trace, as the leak benchmark and tests read both corpora."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Trace:
    """A labelled trace: times ``t`` (seconds from 0) and VRAM ``v`` (bytes; NaN for
    a read that gave no value, 0 for a failed read or no process).

    ``onset_t_seconds``: the first leak onset (None for a non-leak);
    ``restarts_t_seconds``: when a new process started; ``limit_bytes``: the limit
    the process runs into (None when none is modelled); ``exhaustion_t_seconds``:
    when the trace first meets that limit (None when it does not within the trace).
    """

    name: str
    kind: str
    leak: bool
    rate_bytes_per_hour: float
    onset_t_seconds: float | None
    restarts_t_seconds: tuple[float, ...]
    limit_bytes: int | None
    exhaustion_t_seconds: float | None
    sample_interval_seconds: float
    description: str
    t: np.ndarray
    v: np.ndarray

    def prefix(self, end_t_seconds: float) -> tuple[np.ndarray, np.ndarray]:
        """The samples up to ``end_t_seconds``, as a live detector would have them then."""
        n = int(np.searchsorted(self.t, end_t_seconds, side="right"))
        return self.t[:n], self.v[:n]

    def label(self) -> dict[str, object]:
        """The trace's label as labels.json writes it."""
        return {
            "file": f"{self.name}.csv",
            "kind": self.kind,
            "leak": self.leak,
            "rate_bytes_per_hour": round(self.rate_bytes_per_hour),
            "onset_t_seconds": None if self.onset_t_seconds is None else round(self.onset_t_seconds, 1),
            "restarts_t_seconds": [round(r, 1) for r in self.restarts_t_seconds],
            "limit_bytes": self.limit_bytes,
            "exhaustion_t_seconds": None if self.exhaustion_t_seconds is None else round(self.exhaustion_t_seconds, 1),
            "sample_interval_seconds": self.sample_interval_seconds,
            "duration_seconds": round(float(self.t[-1]), 1),
            "description": self.description,
        }
