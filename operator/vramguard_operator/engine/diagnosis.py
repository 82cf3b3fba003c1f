"""One diagnosis per pod, from what is measured: which memory is the problem.

Pure: a function of ``PodMeasures`` and the policy's ``DiagnosisThresholds``
(``vramguard_api.diagnosis``). The rules are tried in the order of ``RULES``
and the first that holds is the pod's diagnosis (docs/policy.md, "Diagnosis"):

========== ============================================================ =====================================
diagnosis  holds when                                                  why this place
========== ============================================================ =====================================
RAMLeak    the leak detector calls its RAM working set a leak          a leak explains the shortage it causes;
VRAMLeak   the leak detector calls its VRAM a leak                     RAM first: a RAM leak takes the node
RAMShort   working set >= ramShortRatio x RAM limit, swap >= minSwap,  the kernel's OOM killer and swapping
           or memory pressure some avg10 >= pressurePercent            hit neighbours too
VRAMShort  VRAM >= vramShortRatio x VRAM limit, or a device it uses    a CUDA out-of-memory error is its own
           holds >= deviceFullRatio of its usable memory
VRAMIdle   holds >= idleHoldRatio of its share while its GPU's peak    hoarding on a shared GPU: a note, not
           utilisation over idleFor is <= idleUtilizationPercent       a fault
OK         none of the above, with its VRAM or RAM known
========== ============================================================ =====================================

Inputs that are not measured (None) are not judged: a rule on them neither
holds nor fails, so the fields other reports add (swap, pressure, GPU
utilisation) plug in as they arrive. A pod with neither its VRAM nor its RAM
known gets no diagnosis (None): nothing is said on unknown data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramguard_api.diagnosis import DiagnosisThresholds, PodDiagnosis
from vramguard_api.units import format_bytes


@dataclass(frozen=True, slots=True)
class PodMeasures:
    """What is measured of one pod (bytes; None: not measured).

    ``devices``: ``(used, usable)`` per device it uses; ``vram_leak`` and
    ``ram_leak``: the leak detector's verdicts (``Leak``/``RAMLeak`` open, or the
    trend features' ``leak``); ``swap_bytes``: its swap in use;
    ``pressure_percent``: PSI ``some avg10`` of its cgroup (percent);
    ``gpu_utilization_peak_percent``: the highest GPU utilisation of the pod over
    the last ``idleFor`` (None unless watched that long)."""

    vram_bytes: int | None = None
    vram_limit_bytes: int | None = None
    devices: tuple[tuple[int | None, int | None], ...] = ()
    ram_bytes: int | None = None
    ram_limit_bytes: int | None = None
    vram_leak: bool | None = None
    ram_leak: bool | None = None
    swap_bytes: int | None = None
    pressure_percent: float | None = None
    gpu_utilization_peak_percent: float | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """A pod's diagnosis and why, in words for its Event (``because``)."""

    diagnosis: PodDiagnosis
    because: str


Rule = Callable[[PodMeasures, DiagnosisThresholds], str | None]
"""A rule: why it holds (words), or None when it does not (or cannot be judged)."""


def _ratio(value: int | None, limit: int | None) -> float | None:
    return None if value is None or not limit else value / limit


def _ram_leak(m: PodMeasures, th: DiagnosisThresholds) -> str | None:
    return "the leak detector sees its RAM working set rising" if m.ram_leak else None


def _vram_leak(m: PodMeasures, th: DiagnosisThresholds) -> str | None:
    return "the leak detector sees its VRAM rising" if m.vram_leak else None


def _ram_short(m: PodMeasures, th: DiagnosisThresholds) -> str | None:
    ratio = _ratio(m.ram_bytes, m.ram_limit_bytes)
    if ratio is not None and ratio >= th.ram_short_ratio:
        return (
            f"RAM working set {format_bytes(m.ram_bytes)} is {ratio:.0%} of its limit "
            f"{format_bytes(m.ram_limit_bytes)} (from {th.ram_short_ratio:.0%})"
        )
    if m.swap_bytes is not None and m.swap_bytes >= th.min_swap_bytes():
        return f"{format_bytes(m.swap_bytes)} in swap (from {th.min_swap})"
    if m.pressure_percent is not None and m.pressure_percent >= th.pressure_percent:
        return f"memory pressure stalls {m.pressure_percent:g}% of the time (from {th.pressure_percent:g}%)"
    return None


def _vram_short(m: PodMeasures, th: DiagnosisThresholds) -> str | None:
    ratio = _ratio(m.vram_bytes, m.vram_limit_bytes)
    if ratio is not None and ratio >= th.vram_short_ratio:
        return (
            f"VRAM {format_bytes(m.vram_bytes)} is {ratio:.0%} of its limit "
            f"{format_bytes(m.vram_limit_bytes)} (from {th.vram_short_ratio:.0%})"
        )
    for used, usable in m.devices:
        full = _ratio(used, usable)
        if full is not None and full >= th.device_full_ratio:
            return f"a device it uses is {full:.0%} full (from {th.device_full_ratio:.0%})"
    return None


def _vram_idle(m: PodMeasures, th: DiagnosisThresholds) -> str | None:
    peak = m.gpu_utilization_peak_percent
    if peak is None or peak > th.idle_utilization_percent or m.vram_bytes is None:
        return None
    share = m.vram_limit_bytes or sum(usable or 0 for _, usable in m.devices)
    held = _ratio(m.vram_bytes, share)
    if held is None or held < th.idle_hold_ratio:
        return None
    return (
        f"holds {format_bytes(m.vram_bytes)} ({held:.0%} of its share) while its GPU utilisation peaked at "
        f"{peak:g}% over {th.idle_for} (idle up to {th.idle_utilization_percent:g}%)"
    )


RULES: tuple[tuple[PodDiagnosis, Rule], ...] = (
    ("RAMLeak", _ram_leak),
    ("VRAMLeak", _vram_leak),
    ("RAMShort", _ram_short),
    ("VRAMShort", _vram_short),
    ("VRAMIdle", _vram_idle),
)
"""The rules in the order they are tried (the module docstring's table)."""


def diagnose(m: PodMeasures, th: DiagnosisThresholds) -> Finding | None:
    """The pod's one diagnosis: the first rule of ``RULES`` that holds, else OK;
    None when neither its VRAM nor its RAM is known."""
    if m.vram_bytes is None and m.ram_bytes is None:
        return None
    for diagnosis, rule in RULES:
        because = rule(m, th)
        if because is not None:
            return Finding(diagnosis, because)
    return Finding("OK", "no memory is short, leaking or idle")


def diagnosis_changed_text(pod: str, before: PodDiagnosis | None, now: Finding) -> str:
    """The Event text of a change of diagnosis: ``pod w0: RAMShort (was OK): ...``."""
    was = "" if before is None else f" (was {before})"
    return f"pod {pod}: {now.diagnosis}{was}: {now.because}"
