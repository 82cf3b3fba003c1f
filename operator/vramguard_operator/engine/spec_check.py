"""A budget's spec checked against the API's bounds once more, in the engine.

The API server and the models refuse values beyond the bounds
(docs/bounds.md), but a budget can still reach the engine without them: one
stored under an older CRD and read by an older model, or built without
validation. Such a spec must hold its own budget only, with a message that
names the field and the value, and never reach arithmetic that overflows or
a resize to an impossible CPU limit. So every quantity, duration, fraction
and the ladder are checked here with the same bounds (``vramguard_api.bounds``)
before anything is computed from them. The label selector is checked where it
is compiled (``selectors``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from vramguard_api.bounds import DELAY, GROWTH_PER_HOUR, MEMORY_LIMIT, THROTTLE_CPU, DurationBound, QuantityBound
from vramguard_api.budget import GPUMemoryBudgetSpec
from vramguard_api.steps import ACTIONS
from vramguard_api.units import duration_ns, show


def spec_problem(spec: GPUMemoryBudgetSpec) -> str | None:
    """The first field of ``spec`` outside the API's bounds, as ``<path>: <why>``
    (the path from ``spec``, the value and the bound), or None."""
    return next(_problems(spec), None)


def _problems(spec: GPUMemoryBudgetSpec) -> Iterator[str]:
    lim = spec.limits
    for path, limit in (("perPod", lim.per_pod), ("total", lim.total)):
        for kind in ("vram", "ram"):
            yield from _quantity(f"spec.limits.{path}.{kind}", getattr(limit, kind, None), MEMORY_LIMIT)
    dev = lim.per_device
    if dev is not None:
        yield from _quantity("spec.limits.perDevice.vram", dev.vram, MEMORY_LIMIT)
        yield from _fraction("spec.limits.perDevice.fraction", dev.fraction)
    yield from _fraction("spec.warningThreshold", spec.warning_threshold)
    over = spec.tolerance.overshoot_percent
    if isinstance(over, bool) or not isinstance(over, int) or not 0 <= over <= 100:
        yield f"spec.tolerance.overshootPercent: {show(over)} is not a whole number from 0 to 100"
    yield from _duration("spec.tolerance.duration", spec.tolerance.duration, DELAY)
    yield from _ladder(spec)
    ld = spec.leak_detection
    if ld is not None:
        yield from _quantity("spec.leakDetection.minGrowthPerHour", ld.min_growth_per_hour, GROWTH_PER_HOUR)
        yield from _duration("spec.leakDetection.minWindow", ld.min_window, DELAY)
        yield from _duration("spec.leakDetection.minEvidence", ld.min_evidence, DELAY)
        yield from _duration("spec.leakDetection.evictBefore", ld.evict_before, DELAY)


def _ladder(spec: GPUMemoryBudgetSpec) -> Iterator[str]:
    steps = spec.enforcement.escalation
    if not steps or len(steps) > len(ACTIONS):
        yield f"spec.enforcement.escalation: want 1 to {len(ACTIONS)} steps, got {len(steps or ())}"
        return
    actions = [s.action for s in steps]
    for i, s in enumerate(steps):
        path = f"spec.enforcement.escalation[{i}]"
        if s.action not in ACTIONS:
            yield f"{path}.action: {show(s.action)} is not one of {', '.join(ACTIONS)}"
        yield from _duration(f"{path}.after", s.after, DELAY)
        yield from _quantity(f"{path}.cpuLimit", s.cpu_limit, THROTTLE_CPU)
    if len(set(actions)) != len(actions):
        yield f"spec.enforcement.escalation: duplicate action in {actions}"
        return
    ordered = sorted(steps, key=lambda s: ACTIONS.index(s.action) if s.action in ACTIONS else 0)
    delays = [duration_ns(s.after) for s in ordered]
    if any(b <= a for a, b in zip(delays, delays[1:], strict=False)):
        yield "spec.enforcement.escalation: delays must increase along Annotate, Throttle, Evict"


def _quantity(path: str, value: Any, bound: QuantityBound) -> Iterator[str]:
    if value is None:
        return
    try:
        why = bound.problem(value)
    except ValueError as err:
        why = str(err).split(": ", 1)[-1]
    if why is not None:
        yield f"{path}: {why}"


def _duration(path: str, value: Any, bound: DurationBound) -> Iterator[str]:
    if value is None:
        return
    try:
        why = bound.problem(value)
    except ValueError as err:
        why = str(err).split(": ", 1)[-1]
    if why is not None:
        yield f"{path}: {why}"


def _fraction(path: str, value: Any) -> Iterator[str]:
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 1
    if not ok:
        yield f"{path}: {show(value)} is not a fraction in (0, 1]"
