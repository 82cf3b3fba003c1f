"""The three-way verdict that ``vramguard analyze`` and ``vramguard replay`` give
on one series: a leak, no leak, or undetermined with the reason.

"No leak" is said only of a series the detector could have called a leak on:
one with usable values, enough of them, over at least the span a leak would
need at its noise (:func:`vramguard_api.leak.needed_seconds`). Anything less
is *undetermined*, never "no": a verdict of "no" from too little data is a
wrong answer. Pure; the exit codes that go with the verdicts are in
docs/cli.md ("Exit codes").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ..units import format_seconds
from . import (
    DEFAULT_MIN_EVIDENCE_SECONDS,
    DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    DEFAULT_MIN_WINDOW_SECONDS,
    Analysis,
    LeakResult,
    needed_seconds,
)
from .tuning import TUNING


class Verdict(StrEnum):
    """What a series shows (the JSON ``verdict``)."""

    LEAK = "Leak"
    NO_LEAK = "NoLeak"
    UNDETERMINED = "Undetermined"


class Reason(StrEnum):
    """Why a series is undetermined (the JSON ``reason``), in the order they are checked."""

    NO_USABLE_VALUES = "NoUsableValues"
    TOO_SHORT = "TooShort"
    TOO_SPARSE = "TooSparse"


@dataclass(frozen=True)
class Judgement:
    """A verdict; ``reason`` and ``detail`` (one human sentence, e.g. "6 samples over
    19s; a leak at this noise needs at least 8m") are set only when undetermined;
    ``needed_seconds`` is the span a verdict would need when the series is too short."""

    verdict: Verdict
    reason: Reason | None = None
    detail: str = ""
    needed_seconds: float | None = None

    @property
    def text(self) -> str:
        """The short form for a line or a plot title: "leak", "no leak", "undetermined (too short)"."""
        if self.verdict is Verdict.UNDETERMINED and self.reason is not None:
            return f"undetermined ({REASON_TEXT[self.reason]})"
        return {Verdict.LEAK: "leak", Verdict.NO_LEAK: "no leak"}.get(self.verdict, "undetermined")


REASON_TEXT = {
    Reason.NO_USABLE_VALUES: "no usable values",
    Reason.TOO_SHORT: "too short",
    Reason.TOO_SPARSE: "too sparse",
}


def judge(
    a: Analysis,
    result: LeakResult,
    *,
    min_growth_bytes_per_hour: float = DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    min_window_seconds: float = DEFAULT_MIN_WINDOW_SECONDS,
    min_evidence_seconds: float = DEFAULT_MIN_EVIDENCE_SECONDS,
) -> Judgement:
    """The verdict on one analysed series (``result`` is :func:`vramguard_api.leak.verdict`'s
    on ``a`` with the same thresholds). A called leak is a leak however little data
    it rests on; otherwise, in order: no usable values (every sample missing, NaN or
    zero), too short (the current segment spans less than a leak would need at its
    noise), too sparse (fewer than the fast path's ``TUNING.fast_min_points`` usable samples); else no leak."""
    if result.leak:
        return Judgement(Verdict.LEAK)
    if a.sv.size == 0:
        return Judgement(Verdict.UNDETERMINED, Reason.NO_USABLE_VALUES,
                         f"{a.t.size} usable samples and no memory in use ([N/A], empty or zero)")
    span = float(a.st[-1] - a.st[0]) if a.st.size >= 2 else 0.0
    needed = needed_seconds(a, min_growth_bytes_per_hour=min_growth_bytes_per_hour,
                            min_window_seconds=min_window_seconds, min_evidence_seconds=min_evidence_seconds)
    if span < needed:
        per_sample = a.raw_interval_seconds if math.isfinite(a.raw_interval_seconds) else 60.0
        return Judgement(
            Verdict.UNDETERMINED, Reason.TOO_SHORT,
            f"{a.st.size} samples over {format_seconds(span)}; at least {math.ceil(needed / per_sample) + 1}"
            f" samples over {format_seconds(needed)} are needed to call a leak at this noise",
            needed_seconds=needed,
        )
    if a.sv.size < TUNING.fast_min_points:
        return Judgement(Verdict.UNDETERMINED, Reason.TOO_SPARSE,
                         f"{a.sv.size} usable samples over {format_seconds(span)}; at least {TUNING.fast_min_points} are needed")
    return Judgement(Verdict.NO_LEAK)
