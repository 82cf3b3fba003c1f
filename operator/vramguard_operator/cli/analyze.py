"""``vramguard analyze FILE``: say whether a VRAM log shows a leak.

Reads a plain ``t_seconds,bytes`` CSV, or the CSV that
``nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_gpu_memory --format=csv -l N``
(one series per pid) or ``nvidia-smi --query-gpu=timestamp,memory.used --format=csv -l N``
(one series per GPU) writes, and runs :func:`vramguard_api.leak.detect_leak` on
each series. Exit status: 0 no leak, 1 a leak in at least one series, 2 bad input.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from vramguard_api.cliargs import duration_arg as _duration
from vramguard_api.cliargs import quantity_arg as _quantity
from vramguard_api.leak import (
    DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    DEFAULT_MIN_WINDOW_SECONDS,
    LeakResult,
    detect_leak,
)
from vramguard_api.units import format_bytes, format_seconds

EXIT_NO_LEAK, EXIT_LEAK, EXIT_BAD_INPUT = 0, 1, 2

# nvidia-smi writes "[N/A]", "[Not Supported]", "[Insufficient Permissions]"... for unknown values.
_UNKNOWN = re.compile(r"^\[.*\]$|^N/A$", re.IGNORECASE)
_UNIT_BYTES = {"B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_VALUE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?i?B)?$", re.IGNORECASE)
_HEADER_UNIT = re.compile(r"\[([KMGT]?i?B)\]", re.IGNORECASE)
_TIMESTAMP_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")
# Columns that name the series, most specific first; the memory column per query.
_GPU_KEYS = ("gpu_uuid", "uuid", "gpu_bus_id", "pci.bus_id", "index")
_MEMORY_COLUMNS = ("used_gpu_memory", "used_memory", "memory.used")
# Rows of one query loop carry timestamps this close together (ms apart per GPU).
_SAME_LOOP_SECONDS = 0.5


class LogError(ValueError):
    """A memory log that cannot be read; the message names the line."""


@dataclass
class Series:
    """One VRAM series from a log: its label and samples (seconds from the log's
    first timestamp or as written, bytes; NaN for an unknown value)."""

    label: str
    pid: int | None = None
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    origin: datetime | None = None  # wall-clock time of t = 0 (nvidia-smi logs)

    def add(self, t: float, value: float, line: int) -> None:
        """Append a sample; a second sample at the same time adds to it (one pid on two GPUs)."""
        if self.times and t == self.times[-1]:
            self.values[-1] = _nan_sum(self.values[-1], value)
            return
        if self.times and t < self.times[-1]:
            raise LogError(f"line {line}: time goes back ({t:g} s after {self.times[-1]:g} s at line {self.lines[-1]})")
        self.times.append(t)
        self.values.append(value)
        self.lines.append(line)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vramguard analyze``."""
    parser.add_argument("file", metavar="FILE", type=Path, help="memory log: t_seconds,bytes CSV or nvidia-smi CSV")
    parser.add_argument(
        "--limit",
        metavar="QUANTITY",
        type=_quantity("--limit"),
        help="project the time until this (e.g. 80Gi)",
    )
    parser.add_argument("--pid", type=int, help="analyze only this process (nvidia-smi --query-compute-apps logs)")
    parser.add_argument(
        "--min-growth",
        metavar="QUANTITY",
        type=_quantity("--min-growth"),
        default=DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
        help="smallest growth per hour that counts as a leak (default 200Mi)",
    )
    parser.add_argument(
        "--min-window",
        metavar="DURATION",
        type=_duration("--min-window"),
        default=DEFAULT_MIN_WINDOW_SECONDS,
        help="shortest rise that counts as a leak (default 30m)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per series, one per line")


def run(args: argparse.Namespace) -> int:
    """Analyze the log; print the verdicts; return the exit status."""
    try:
        series = read_log(args.file)
        series = _select(series, args.pid)
    except (OSError, UnicodeDecodeError) as err:
        print(f"vramguard analyze: cannot read {args.file}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LogError as err:
        print(f"vramguard analyze: {args.file}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    leak = False
    for s in series:
        result = detect_leak(
            s.times,
            s.values,
            limit_bytes=args.limit,
            min_growth_bytes_per_hour=args.min_growth,
            min_window_seconds=args.min_window,
        )
        leak = leak or result.leak
        print(json.dumps(to_json(s, result)) if args.json else describe(s, result, args.limit))
    return EXIT_LEAK if leak else EXIT_NO_LEAK


def to_json(series: Series, result: LeakResult) -> dict[str, object]:
    """The ``--json`` object of one series."""
    return {
        "series": series.label,
        "leak": result.leak,
        "growth_bytes_per_hour": result.growth_bytes_per_hour,
        "growth_low_bytes_per_hour": result.growth_low_bytes_per_hour,
        "onset_t_seconds": result.onset_t_seconds,
        "time_to_limit_seconds": result.time_to_limit_seconds,
        "samples": result.samples,
    }


def describe(series: Series, result: LeakResult, limit: int | None) -> str:
    """The human-readable verdict on one series."""
    span = series.times[-1] - series.times[0] if series.times else 0.0
    lines = [f"{series.label}: {len(series.times)} samples over {format_seconds(span)}"]
    growth = (
        f"growth {format_bytes(result.growth_bytes_per_hour)}/h "
        f"(95% lower bound {format_bytes(result.growth_low_bytes_per_hour)}/h)"
    )
    if result.leak and result.onset_t_seconds is not None:
        lines.append(f"  leak: yes, {growth} since {_when(series, result.onset_t_seconds)}")
    else:
        lines.append(f"  leak: no, {growth}")
    if limit is not None:
        ttl = result.time_to_limit_seconds
        eta = "not projected (no significant growth)" if ttl is None else format_seconds(ttl)
        lines.append(f"  time to limit {format_bytes(limit)}: {eta}")
    return "\n".join(lines)


# --- reading logs -------------------------------------------------------------


def read_log(path: Path) -> list[Series]:
    """Read a memory log into series; raises ``LogError`` naming the line of bad input."""
    rows = list(_rows(path.read_text(encoding="utf-8")))
    if not rows:
        raise LogError("no samples")
    first = rows[0][1]
    if first[0].strip().lower() == "timestamp" or _timestamp(first[0]) is not None:
        return _read_nvidia_smi(rows)
    return [_read_plain(rows, label=str(path))]


def _rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of the non-blank, non-comment lines."""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.lower() == "no running processes found":
            continue
        yield number, [f.strip() for f in next(csv.reader([stripped], skipinitialspace=True))]


def _read_plain(rows: list[tuple[int, list[str]]], label: str) -> Series:
    """``t_seconds,bytes`` lines, with an optional header line of those names."""
    if [f.lower() for f in rows[0][1]] == ["t_seconds", "bytes"]:
        rows = rows[1:]
    series = Series(label=label)
    for line, fields in rows:
        if len(fields) != 2:
            raise LogError(f"line {line}: expected t_seconds,bytes, got {','.join(fields)!r}")
        t, value = _number(fields[0], line, "t_seconds"), _number(fields[1], line, "bytes")
        if value < 0:
            raise LogError(f"line {line}: bytes must not be negative, got {fields[1]!r}")
        if series.times and t <= series.times[-1]:
            raise LogError(f"line {line}: t_seconds must increase, got {t:g} after {series.times[-1]:g}")
        series.add(t, value, line)
    if not series.times:
        raise LogError("no samples")
    return series


def _read_nvidia_smi(rows: list[tuple[int, list[str]]]) -> list[Series]:
    """Rows of ``nvidia-smi --query-compute-apps`` or ``--query-gpu`` CSV, one series per pid or GPU."""
    header, body = _nvidia_smi_header(rows)
    columns = {name: i for i, name in enumerate(_column_name(h) for h in header)}
    memory = next((columns[c] for c in _MEMORY_COLUMNS if c in columns), None)
    if "timestamp" not in columns or memory is None:
        raise LogError(
            f"line {rows[0][0]}: an nvidia-smi log needs the timestamp and used_gpu_memory "
            f"or memory.used columns, got {', '.join(header)}"
        )
    unit = _header_unit(header[memory])
    series: dict[tuple[str, ...], Series] = {}
    origin: datetime | None = None
    loop_start, ordinal = None, 0
    for line, fields in body:
        if [f.lower() for f in fields] == [h.lower() for h in header]:
            continue  # the header again, as nvidia-smi -l may repeat it
        fields = _fit_fields(fields, header, columns, line)
        stamp = _timestamp(fields[columns["timestamp"]])
        if stamp is None:
            raise LogError(
                f"line {line}: bad timestamp {fields[columns['timestamp']]!r} (want 2024/05/01 12:00:00.123)"
            )
        origin = origin or stamp
        if loop_start is None or not 0 <= (stamp - loop_start).total_seconds() <= _SAME_LOOP_SECONDS:
            loop_start, ordinal = stamp, 0
        else:
            ordinal += 1
        key, label, pid = _series_key(fields, columns, ordinal)
        s = series.setdefault(key, Series(label=label, pid=pid, origin=origin))
        s.add((stamp - origin).total_seconds(), _memory(fields[memory], unit, line), line)
    if not series:
        raise LogError("no samples")
    return list(series.values())


def _nvidia_smi_header(
    rows: list[tuple[int, list[str]]],
) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the data rows; a headerless log (``--format=csv,noheader``) is
    read by its column count: 2 for --query-gpu, 4 for --query-compute-apps."""
    first = rows[0][1]
    if first[0].strip().lower() == "timestamp":
        return first, rows[1:]
    if len(first) == 2:
        return ["timestamp", "memory.used [MiB]"], rows
    if len(first) == 4:
        return ["timestamp", "pid", "process_name", "used_gpu_memory [MiB]"], rows
    raise LogError(f"line {rows[0][0]}: nvidia-smi log without a header line and {len(first)} columns; keep the header")


def _column_name(header_field: str) -> str:
    """``used_gpu_memory [MiB]`` -> ``used_gpu_memory``."""
    return header_field.split("[")[0].strip().lower()


def _header_unit(header_field: str) -> int:
    match = _HEADER_UNIT.search(header_field)
    return _UNIT_BYTES[match.group(1).upper()] if match else _UNIT_BYTES["MIB"]


def _fit_fields(fields: list[str], header: list[str], columns: dict[str, int], line: int) -> list[str]:
    """Match a row to the header; extra fields are commas inside the process name."""
    if len(fields) > len(header) and "process_name" in columns:
        i, extra = columns["process_name"], len(fields) - len(header)
        fields = fields[:i] + [",".join(fields[i : i + extra + 1])] + fields[i + extra + 1 :]
    if len(fields) != len(header):
        raise LogError(f"line {line}: expected {len(header)} fields ({', '.join(header)}), got {len(fields)}")
    return fields


def _series_key(fields: list[str], columns: dict[str, int], ordinal: int) -> tuple[tuple[str, ...], str, int | None]:
    """(key, label, pid) of the series a row belongs to."""
    gpu = next((f"{c} {fields[columns[c]]}" for c in _GPU_KEYS if c in columns), None)
    if "pid" in columns:
        pid_text = fields[columns["pid"]]
        name = fields[columns["process_name"]] if "process_name" in columns else ""
        label = f"pid {pid_text}" + (f" ({name})" if name else "") + (f" on {gpu}" if gpu else "")
        return ("pid", pid_text, gpu or ""), label, int(pid_text) if pid_text.isdigit() else None
    gpu = gpu or f"gpu {ordinal}"  # without an id column: the row's place in its query loop
    return ("gpu", gpu), gpu, None


def _memory(text: str, unit: int, line: int) -> float:
    """Bytes of an nvidia-smi memory value (``1234 MiB`` or ``1234``); NaN when unknown."""
    if _UNKNOWN.match(text):
        return math.nan
    match = _VALUE.match(text)
    if not match:
        raise LogError(f"line {line}: bad memory value {text!r} (want e.g. 1234 MiB)")
    scale = _UNIT_BYTES[match.group(2).upper()] if match.group(2) else unit
    return float(match.group(1)) * scale


def _timestamp(text: str) -> datetime | None:
    for fmt in _TIMESTAMP_FORMATS:
        try:
            return datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
    return None


def _number(text: str, line: int, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise LogError(f"line {line}: {name} is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise LogError(f"line {line}: {name} is not finite: {text!r}")
    return value


def _select(series: list[Series], pid: int | None) -> list[Series]:
    if pid is None:
        return series
    chosen = [s for s in series if s.pid == pid]
    if not chosen:
        pids = sorted({s.pid for s in series if s.pid is not None})
        found = ", ".join(map(str, pids)) if pids else "none (not a --query-compute-apps log)"
        raise LogError(f"--pid {pid}: no such process in the log; pids: {found}")
    return chosen


def _nan_sum(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return b if math.isnan(a) else a
    return a + b


# --- formatting and argument types -------------------------------------------------


def _when(series: Series, t: float) -> str:
    if series.origin is None:
        return f"t={t:g}s"
    return f"{series.origin + timedelta(seconds=t):%Y/%m/%d %H:%M:%S} (t={t:g}s)"


