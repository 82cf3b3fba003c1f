"""The Leak violation rule: decided from a pod's trend features and the budget's
``spec.leakDetection`` thresholds.

The live operator only sees the node report's ``TrendFeatures`` (computed by the
agent with ``vramguard_api.trend.compute_trend``); the replay computes the same
features from the recorded series with the same function, so both apply this
rule to the same numbers.

Rule (a violation *holds*): ``vramguard_api.trend.trend_verdict`` with the
budget's ``minGrowthPerHour``, ``minWindow`` and ``minEvidence`` — the very
decision ``detect_leak`` makes on the agent's history. It needs a rise the
agent reported: a structural rise (``riseSeconds``, the slow path: a leak from
``minWindow`` on) or a recent rise that qualifies, from a flat floor or from the
process's start (``evidenceSeconds`` with
``evidenceGrowthLowBytesPerHour``, the fast path: a leak from ``minEvidence``
on when that lower bound reaches ``minGrowthPerHour``). Features without either
are no leak, however steep the growth.

Hysteresis: an open Leak violation closes only when the rule no longer holds
*and* the point estimate ``growthBytesPerHour`` is below ``minGrowthPerHour``;
in between it stays open without escalating. Missing growth figures are unknown
data: nothing opens, escalates or closes.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramguard_api.budget import LeakDetection, LeakMemory
from vramguard_api.leak import DEFAULT_MIN_EVIDENCE_SECONDS, VerdictPath
from vramguard_api.trend import TrendFeatures, trend_verdict, verdict_growth
from vramguard_api.units import parse_duration, quantity_to_bytes


@dataclass(frozen=True, slots=True)
class LeakThresholds:
    """``spec.leakDetection`` in numbers: bytes per hour and seconds (``minEvidence``
    defaults to the API's 7m for thresholds built without it), and the memories
    they watch (each alike)."""

    min_growth_bytes_per_hour: float
    min_window_seconds: float
    evict_before_seconds: float | None
    min_evidence_seconds: float = DEFAULT_MIN_EVIDENCE_SECONDS
    memories: tuple[LeakMemory, ...] = ("VRAM",)

    @classmethod
    def of(cls, ld: LeakDetection) -> LeakThresholds:
        """Convert (raises ``ValueError`` naming the field on a bad value)."""
        return cls(
            min_growth_bytes_per_hour=float(
                quantity_to_bytes(ld.min_growth_per_hour, "spec.leakDetection.minGrowthPerHour")
            ),
            min_window_seconds=parse_duration(ld.min_window, "spec.leakDetection.minWindow"),
            evict_before_seconds=None
            if ld.evict_before is None
            else parse_duration(ld.evict_before, "spec.leakDetection.evictBefore"),
            min_evidence_seconds=parse_duration(ld.min_evidence, "spec.leakDetection.minEvidence"),
            memories=tuple(ld.memories),
        )


def leak_verdict(trend: TrendFeatures, th: LeakThresholds) -> VerdictPath | None:
    """Which path calls a leak on the features with ``th`` (``trend_verdict``), or None."""
    return trend_verdict(
        trend,
        min_growth_bytes_per_hour=th.min_growth_bytes_per_hour,
        min_window_seconds=th.min_window_seconds,
        min_evidence_seconds=th.min_evidence_seconds,
    )


def leak_holds(trend: TrendFeatures, th: LeakThresholds) -> bool | None:
    """Whether the features show a leak by the rule above; None when they lack
    growth figures (too few samples)."""
    if trend.growth_bytes_per_hour is None:
        return None
    return leak_verdict(trend, th) is not None


def leak_growth(trend: TrendFeatures, th: LeakThresholds) -> tuple[float | None, float | None]:
    """(growth, lower bound), bytes per hour, of the rise the rule rests on
    (``vramguard_api.trend.verdict_growth``): what the Event shows and the
    projection to the limit uses."""
    return verdict_growth(trend, leak_verdict(trend, th))


def leak_cleared(trend: TrendFeatures, th: LeakThresholds) -> bool | None:
    """Whether an open Leak violation closes (rule no longer holds and point
    growth below the threshold); None when the features cannot tell."""
    holds = leak_holds(trend, th)
    if holds is None or trend.growth_bytes_per_hour is None:
        return None
    return not holds and trend.growth_bytes_per_hour < th.min_growth_bytes_per_hour
