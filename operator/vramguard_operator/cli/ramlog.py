"""Host-RAM logs that ``vramguard analyze`` reads besides the CSVs of ``memlog.py``:
what people paste from ``pidstat -r`` and from ``ps -o rss`` run in a loop.

- ``pidstat -r [-h] [-p PID] N`` (sysstat; pidstat(1)): a header line naming
  ``PID`` and ``RSS`` after the time (``05:40:01 PM``, ``17:40:01``, or with
  ``-h`` ``# Time`` and Unix seconds), one data line per process and interval;
  ``RSS`` is in kilobytes (KiB); the ``Average:`` lines and the banner are left
  out; one series per PID, labelled with its ``Command``. A clock time that goes
  back is read as the next day.
- ``ps -o etimes,rss -p PID`` (procps; ps(1)) in a loop: a header naming ``RSS``
  (KiB) and, for the time, ``ELAPSED`` (``etimes``: seconds since the process
  started); without a time column each line is one step of ``--interval``. The
  header may repeat (each ``ps`` prints it); ``PID`` and ``COMMAND`` columns
  split and label the series.

A ``t_seconds,bytes`` CSV of RSS or of a cgroup's ``memory.current`` is read by
``memlog.py`` as any other; ``--memory RAM`` names it RAM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vramguard_operator.cli.memlog import LogError, Series

KIB = 1024
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2})$")
_DAY_SECONDS = 86400.0


@dataclass(frozen=True, slots=True)
class _Header:
    """A header line's columns (upper case) after the time fields; ``timed``:
    pidstat's (the time comes before the columns)."""

    columns: tuple[str, ...]
    timed: bool


def recognises(text: str) -> bool:
    """Whether ``text`` is a pidstat or ps log (a whitespace-separated header with RSS)."""
    return any(_header(line) is not None for line in text.splitlines()[:20])


def read_ram_log(text: str, interval_s: float | None) -> list[Series]:
    """One RAM series per process (bytes); ``interval_s``: seconds per line of a ps
    log without a time column. Raises ``LogError`` naming the line of bad input."""
    header: _Header | None = None
    series: dict[str, Series] = {}
    steps: dict[str, int] = {}
    clock: dict[str, tuple[float, float]] = {}  # per series: last clock time, days added
    for number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if not tokens or tokens[0].startswith("Average") or tokens[0] == "Linux":
            continue
        found = _header(line)
        if found is not None:
            header = found
            continue
        if header is None:
            raise LogError(f"line {number}: data before a header naming RSS")
        _row(header, tokens, number, interval_s, series, steps, clock)
    if not series:
        raise LogError("no samples")
    return list(series.values())


def _row(
    header: _Header,
    tokens: list[str],
    number: int,
    interval_s: float | None,
    series: dict[str, Series],
    steps: dict[str, int],
    clock: dict[str, tuple[float, float]],
) -> None:
    n = len(header.columns)
    if len(tokens) < n:
        raise LogError(f"line {number}: expected {n} columns ({' '.join(header.columns)}), got {len(tokens)}")
    # pidstat's Command (last) has no spaces; ps's COMMAND may: join what is left over
    if "COMMAND" in header.columns and not header.timed:
        i = header.columns.index("COMMAND")
        cells = tokens[:i] + [" ".join(tokens[i : len(tokens) - (n - 1 - i)])] + tokens[len(tokens) - (n - 1 - i) :]
    else:
        cells = tokens[-n:]
    row = dict(zip(header.columns, cells, strict=True))
    pid = row.get("PID", "")
    label = f"pid {pid}" + (f" ({row['COMMAND']})" if row.get("COMMAND") else "") if pid else "RSS"
    s = series.setdefault(label, Series(label=label, pid=int(pid) if pid.isdigit() else None, memory="RAM"))
    rss = _number(row["RSS"], number, "RSS") * KIB
    if header.timed:
        t = _clock_time(tokens[: len(tokens) - n], number, label, clock)
    elif "ELAPSED" in row:
        t = _number(row["ELAPSED"], number, "ELAPSED")
    elif interval_s is not None:
        steps[label] = steps.get(label, -1) + 1
        t = steps[label] * interval_s
    else:
        raise LogError(f"line {number}: a ps log without ELAPSED (ps -o etimes,rss) needs --interval, the time per line")
    s.add(t, rss, number)


def _header(line: str) -> _Header | None:
    tokens = [t.upper() for t in line.split()]
    if "RSS" not in tokens or "," in line:
        return None
    if "UID" in tokens and "PID" in tokens:  # pidstat: time fields, then UID...
        return _Header(tuple(tokens[tokens.index("UID") :]), timed=True)
    if all(not any(ch.isdigit() for ch in t) for t in tokens):  # ps: names only
        return _Header(tuple("ELAPSED" if t == "ETIMES" else t for t in tokens), timed=False)
    return None


def _clock_time(fields: list[str], number: int, label: str, clock: dict[str, tuple[float, float]]) -> float:
    """Seconds of pidstat's time: Unix seconds (``-h``) or a clock time, 12- or 24-hour."""
    if len(fields) == 1 and fields[0].isdigit():
        return float(fields[0])
    match = _CLOCK.match(fields[0]) if fields else None
    h, m, sec = (int(g) for g in match.groups()) if match else (99, 0, 0)
    twelve = len(fields) == 2 and fields[1].upper() in ("AM", "PM")
    if not (len(fields) == 1 or twelve) or h > (12 if twelve else 23) or m > 59 or sec > 59:
        raise LogError(f"line {number}: bad pidstat time {' '.join(fields)!r} (want 05:40:01 PM, 17:40:01 or Unix seconds)")
    if len(fields) == 2:
        h = h % 12 + (12 if fields[1].upper() == "PM" else 0)
    t = float(h * 3600 + m * 60 + sec)
    last, days = clock.get(label, (t, 0.0))
    if t < last:  # past midnight
        days += _DAY_SECONDS
    clock[label] = (t, days)
    return t + days


def _number(text: str, line: int, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise LogError(f"line {line}: {name} is not a number: {text!r}") from None
    if value < 0:
        raise LogError(f"line {line}: {name} must not be negative, got {text!r}")
    return value
