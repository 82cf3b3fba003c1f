"""Memory logs that ``vramguard analyze`` reads: plain ``t_seconds,bytes`` CSV,
step-indexed CSV (a step or iteration column and no time, read with the time per
step), and the CSV that ``nvidia-smi --query-compute-apps`` or ``--query-gpu``
writes with ``-l N``. See docs/leak-detection.md, "vramguard analyze"."""

from __future__ import annotations

import csv
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from vramguard_api.units import MAX_BYTES

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


# A step-indexed log's first header field, and its memory column's names.
_STEP_COLUMNS = ("step", "iteration", "iter", "batch")
_PLAIN_MEMORY = ("bytes", "memory", "memory_bytes", "vram", "vram_bytes")


class LogError(ValueError):
    """A memory log that cannot be read; the message names the line."""


@dataclass
class Series:
    """One memory series from a log: its label, which memory (VRAM, or RAM for
    ``ramlog.py``'s logs and ``--memory RAM``) and samples (seconds from the log's
    first timestamp or as written, bytes; NaN for an unknown value)."""

    label: str
    pid: int | None = None
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    origin: datetime | None = None  # wall-clock time of t = 0 (nvidia-smi logs)
    total: float | None = None  # the device's memory.total (bytes), when the log has that column
    memory: str = "VRAM"

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


# --- reading logs -------------------------------------------------------------


def read_log(path: Path, interval_s: float | None = None) -> list[Series]:
    """Read a memory log into series; raises ``LogError`` naming the line of bad input.

    ``interval_s``: seconds per step of a step-indexed log (a ``step`` or
    ``iteration`` column, or no time column at all); such a log without it, or a
    log with timestamps given one, is an error that says so. ``-`` reads stdin."""
    return parse_log(read_text(path), interval_s, str(path))


def read_text(path: Path) -> str:
    """The text of ``path``, or of stdin for ``-``; raises ``OSError`` or ``UnicodeDecodeError``."""
    return sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")


def parse_log(text: str, interval_s: float | None = None, label: str = "-") -> list[Series]:
    """A memory log's text into series (``read_log``), a plain log's series named ``label``
    (its file); raises ``LogError`` naming the line of bad input."""
    rows = list(_rows(text))
    if not rows:
        raise LogError("no samples")
    first = rows[0][1]
    if first[0].strip().lower() == "timestamp" or _timestamp(first[0]) is not None:
        if interval_s is not None:
            raise LogError(f"line {rows[0][0]}: --interval is for logs indexed by step; this one has timestamps")
        return _read_nvidia_smi(rows)
    return [_read_plain(rows, label, interval_s)]


def _rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of the non-blank, non-comment lines."""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.lower() == "no running processes found":
            continue
        yield number, [f.strip() for f in next(csv.reader([stripped], skipinitialspace=True))]


def _read_plain(rows: list[tuple[int, list[str]]], label: str, interval_s: float | None) -> Series:
    """``t_seconds,bytes`` lines (header optional), or a step-indexed log: ``step,bytes``
    (or ``iteration``, ``iter``, ``batch``; a memory column with a unit in brackets,
    ``memory [MiB]``, gives its unit) or one column of values, read with ``interval_s``."""
    header = [_column_name(h) for h in rows[0][1]]
    named = header[0] in ("t_seconds", *_STEP_COLUMNS) or header[-1] in _PLAIN_MEMORY or bool(
        _HEADER_UNIT.search(rows[0][1][-1])
    )
    unit = _header_unit(rows[0][1][-1]) if named and _HEADER_UNIT.search(rows[0][1][-1]) else 1
    body = rows[1:] if named else rows
    by_step = (named and header[0] in _STEP_COLUMNS) or len(rows[0][1]) == 1 or (not named and interval_s is not None)
    if named and header[0] == "t_seconds" and interval_s is not None:
        raise LogError(f"line {rows[0][0]}: --interval is for logs indexed by step; this one has t_seconds")
    if by_step and interval_s is None:
        raise LogError(
            f"line {rows[0][0]}: a log indexed by step (or without a time column) needs --interval, "
            "the time per step (e.g. --interval 2s)"
        )
    columns = "step,bytes" if by_step else "t_seconds,bytes"
    series, previous = Series(label=label), None
    for index, (line, fields) in enumerate(body):
        if len(fields) == 1 and by_step:
            t, text = float(index), fields[0]
        elif len(fields) == 2:
            t, text = _number(fields[0], line, columns.split(",")[0]), fields[1]
        else:
            raise LogError(f"line {line}: expected {columns}, got {','.join(fields)!r}")
        with_unit = _VALUE.match(text)
        value = _memory(text, unit, line) if with_unit and with_unit.group(2) else _number(text, line, "bytes") * unit
        if value < 0:
            raise LogError(f"line {line}: bytes must not be negative, got {text!r}")
        if value > MAX_BYTES:
            raise LogError(f"line {line}: bytes {text!r} is above the maximum of 8Pi (2^53 bytes)")
        if previous is not None and t <= previous:
            raise LogError(f"line {line}: {columns.split(',')[0]} must increase, got {t:g} after {previous:g}")
        previous = t
        series.add(t * interval_s if by_step else t, value, line)  # type: ignore[operator]
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
    total = columns.get("memory.total")
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
        if total is not None and not math.isnan(size := _memory(fields[total], _header_unit(header[total]), line)):
            s.total = size
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
    value = float(match.group(1)) * scale
    if value > MAX_BYTES:
        raise LogError(f"line {line}: memory value {text!r} is above the maximum of 8Pi (2^53 bytes)")
    return value


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


def select(series: list[Series], pid: int | None) -> list[Series]:
    """The series of process ``pid`` (all when None); ``LogError`` when it has none."""
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


