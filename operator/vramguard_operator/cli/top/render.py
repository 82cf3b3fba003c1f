"""The text and JSON of ``vramguard top`` (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from vramguard_api.units import format_bytes
from vramguard_operator.cli.top.caps import caps_text
from vramguard_operator.cli.top.devices import DeviceRow
from vramguard_operator.cli.top.model import DeviceFigure, Row

# Growth below this (bytes per hour) is shown as "flat": the noise of a steady pod.
FLAT_GROWTH_BYTES_PER_HOUR = 64 * 2**20


def trend_text(growth_bytes_per_hour: float | None) -> str:
    """``+1.2Gi/h``, ``-300Mi/h``, ``flat`` (below 64Mi/h either way) or ``-`` (unknown)."""
    if growth_bytes_per_hour is None:
        return "-"
    if abs(growth_bytes_per_hour) < FLAT_GROWTH_BYTES_PER_HOUR:
        return "flat"
    sign = "+" if growth_bytes_per_hour > 0 else "-"
    return f"{sign}{format_bytes(abs(growth_bytes_per_hour))}/h"


def _devices_text(devices: Sequence[DeviceFigure], most: int = 3) -> str:
    if not devices:
        return "-"
    shown = sorted(devices, key=lambda d: -(d.used_bytes or 0))[:most]
    parts = [f"{d.label}:{format_bytes(d.used_bytes) if d.used_bytes is not None else '?'}" for d in shown]
    if len(devices) > most:
        parts.append(f"+{len(devices) - most}")
    return " ".join(sorted(parts))


def table_rows(rows: Iterable[Row], all_namespaces: bool, wide: bool = False) -> list[list[str]]:
    """The cells of the table, header first."""
    header = ["POD", "NODE", "VRAM", "DEVICES", "RAM", "LIMIT", "SOURCE", "USE", "TREND", "STATE", "DIAGNOSIS"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    if wide:
        header += ["SWAP", "RAM PSI", "LIMITS", "CAPS", "LAST OOM", "WHY"]
    out = [header]
    for r in rows:
        bind = r.binding
        vram = "?" if r.vram_bytes is None else format_bytes(r.vram_bytes)
        cells = [
            r.pod,
            r.node or "-",
            vram + ("*" if r.stale else ""),
            _devices_text(r.devices),
            format_bytes(r.ram_bytes),
            f"{bind.name} {format_bytes(bind.limit_bytes)}" if bind else "-",
            bind.source if bind else "-",
            f"{r.pressure:.0%}" if r.pressure is not None else "-",
            trend_text(r.growth_bytes_per_hour),
            r.state,
            r.diagnosis or "-",
        ]
        if all_namespaces:
            cells.insert(0, r.namespace)
        if wide:
            cells.append(format_bytes(r.swap_bytes))
            cells.append(f"{r.ram_pressure:.1f}%" if r.ram_pressure is not None else "-")
            cells.append(", ".join(f"{x.name} {format_bytes(x.limit_bytes)} ({x.source})" for x in r.limits) or "-")
            cells.append(caps_text(r.caps))
            cells.append(r.last_oom or "-")
            cells.append("; ".join(r.why) or "-")
        out.append(cells)
    return out


# ANSI SGR codes (ECMA-48) for the states of pods and devices: red where vramguard
# acts or will, yellow for a warning or a device it cannot judge, green for ok.
STATE_COLORS = {
    "leak": "1;31",  # bold red
    "violating": "31",  # red
    "capped": "35",  # magenta: limited by the driver
    "throttled": "35",
    "warning": "33",  # yellow
    "ok": "32",  # green
    "pressure": "31",
    "unknown": "33",
    "stale": "33",
}


def paint_state(state: str) -> str:
    """``state`` in its colour (``STATE_COLORS``), unchanged when it has none."""
    code = STATE_COLORS.get(state)
    return f"\x1b[{code}m{state}\x1b[0m" if code else state


def _padded(cells: list[list[str]], color_column: str | None = None) -> list[str]:
    """The cells padded to their column's width; with ``color_column`` (a header)
    that column's cells below the header painted after padding, so that the
    escapes take no width."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    at = cells[0].index(color_column) if color_column else None
    lines = []
    for n, row in enumerate(cells):
        padded = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        if at is not None and n > 0:
            padded[at] = paint_state(row[at]) + " " * (widths[at] - len(row[at]))
        lines.append("   ".join(padded).rstrip())
    return lines


def device_cells(devices: Iterable[DeviceRow]) -> list[list[str]]:
    """The cells of the device-pressure table, header first."""
    out = [["DEVICE", "NODE", "FREE", "MIN FREE", "RULE", "PODS", "STATE", "ACTION"]]
    for d in devices:
        free = format_bytes(d.free_bytes) if d.free_bytes is not None else "?"
        out.append([d.label, d.node, free, format_bytes(d.min_free_bytes), d.rule, str(len(d.pods)), d.state, d.action])
    return out


def render(
    rows: Sequence[Row],
    notes: Sequence[str] = (),
    all_namespaces: bool = False,
    wide: bool = False,
    devices: Sequence[DeviceRow] = (),
    color: bool = False,
) -> str:
    """The table as text (columns padded like kubectl's), the devices under a
    device-pressure rule when there are any, and footnotes; ``color``: the
    STATE cells in ANSI colours (``STATE_COLORS``)."""
    state = "STATE" if color else None
    if not rows:
        lines = ["No GPU pods found."]
    else:
        lines = _padded(table_rows(rows, all_namespaces, wide), state)
        if any(r.stale for r in rows):
            lines.append("* no fresh node report: the figures may be old or missing")
    if devices:
        lines += ["", *_padded(device_cells(devices), state)]
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def devices_json(devices: Sequence[DeviceRow]) -> list[dict[str, Any]]:
    """Device rows as JSON-ready dicts (``-o json``)."""
    return [{**asdict(d), "pods": list(d.pods)} for d in devices]


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (``-o json``)."""
    out = []
    for r in rows:
        d = asdict(r)
        d["devices"] = [asdict(x) for x in r.devices]
        d["limits"] = [{**asdict(x), "ratio": x.ratio} for x in r.limits]
        d["why"] = list(r.why)
        d["caps"] = [asdict(x) for x in r.caps]
        out.append(d)
    return out

