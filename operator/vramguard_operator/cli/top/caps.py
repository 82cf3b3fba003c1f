"""The driver-enforced memory limits of each pod in ``vramguard top -o wide``:
per device, what the pod's node agent reports the driver holds (hard and soft
limit, state and reason), else what the ``vramguard.io/memory-limits``
annotation asks for (not reported yet), and the devices the pod uses that
cannot hold limits (with the reason the agent found). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vramguard_api.memlimits import MemoryLimitsError, memory_limits_of
from vramguard_api.units import format_bytes
from vramguard_operator.cli.top.limits import UsageView, device_label
from vramguard_operator.cli.top.model import CapFigure


def cap_figures(annotations: Mapping[str, str], u: UsageView | None) -> tuple[CapFigure, ...]:
    """The pod's memory limits per device (see the module doc), by device label."""
    try:
        wanted = memory_limits_of(annotations) or {}
    except MemoryLimitsError:
        wanted = {}
    reported = {e.uuid: e for e in (u.pod.memory_limits or ())} if u is not None else {}
    devices = u.devices if u is not None else {}
    out = []
    for uuid in sorted({*wanted, *reported}):
        label = device_label(devices.get(uuid))
        e = reported.get(uuid)
        if e is not None:
            out.append(CapFigure(label, uuid, e.hard_limit_bytes, e.soft_limit_bytes, e.state, e.reason))
        else:
            w = wanted[uuid]
            out.append(CapFigure(label, uuid, w.hard_limit, w.soft_limit or None, "Wanted", "NotReported"))
    for d in (u.pod.devices if u is not None else ()):
        gpu = devices.get(d.uuid)
        if d.uuid not in wanted and d.uuid not in reported and gpu is not None and gpu.memory_limits == "Unsupported":
            out.append(CapFigure(device_label(gpu), d.uuid, None, None, "Unsupported", gpu.memory_limits_reason or ""))
    return tuple(sorted(out, key=lambda f: f.label))


def caps_text(figures: Sequence[CapFigure]) -> str:
    """``gpu0 hard 45Gi soft 20Gi Applied; gpu1 Unsupported (DriverTooOld)``, or ``-``."""
    parts = []
    for f in figures:
        limits = [f"{name} {format_bytes(v)}" for name, v in (("hard", f.hard_bytes), ("soft", f.soft_bytes)) if v]
        why = "" if f.reason in ("", f.state) else f" ({f.reason})"
        parts.append(" ".join([f.label, *limits, f.state]) + why)
    return "; ".join(parts) or "-"


def is_capped(figures: Sequence[CapFigure]) -> bool:
    """Whether a hard limit is asked for or held on some device."""
    return any(f.hard_bytes is not None and f.state != "Unsupported" for f in figures)
