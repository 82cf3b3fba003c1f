"""The node's swap activity and memory pressure, read from ``/proc`` (read only).

Swap activity: the ``pswpin`` and ``pswpout`` counters of ``/proc/vmstat``
(pages swapped in and out since boot; ``Documentation/admin-guide/mm`` and
``mm/vmstat.c``), turned into bytes per second between two readings.

Memory pressure (PSI, ``Documentation/accounting/psi.rst``): ``/proc/pressure/memory``
and, on cgroup v2, each cgroup's ``memory.pressure``
(``Documentation/admin-guide/cgroup-v2.rst``) hold two lines::

    some avg10=0.00 avg60=0.00 avg300=0.00 total=0
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``some``: the share of time at least one task stalled on memory; ``full``: the
share of time all non-idle tasks stalled at once. ``avg*`` are percentages over
10, 60 and 300 seconds; ``total`` is the stall time in microseconds. Kernels
before 4.20, or booted without ``psi=1`` where it is off by default, have no file.

vramguard only reads these: the kubelet owns swap limits (``LimitedSwap``) and
node-pressure eviction.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vramguard_api.usage import HostMemory, MemoryPressure, PressureFigures

_PSI_LINE = re.compile(
    r"^(some|full) avg10=(\d+(?:\.\d+)?) avg60=(\d+(?:\.\d+)?) avg300=(\d+(?:\.\d+)?) total=(\d+)$"
)
_VMSTAT = re.compile(r"(?m)^(pswpin|pswpout) (\d+)$")


def parse_pressure(text: str) -> MemoryPressure | None:
    """The ``some`` and ``full`` lines of a PSI file, None when neither parses.

    A line missing (the system-wide ``cpu`` file had no ``full`` line before
    5.13) leaves that figure absent."""
    figures: dict[str, PressureFigures] = {}
    for line in text.splitlines():
        match = _PSI_LINE.match(line.strip())
        if match:
            kind, avg10, avg60, avg300, total = match.groups()
            figures[kind] = PressureFigures(
                avg10=float(avg10), avg60=float(avg60), avg300=float(avg300), totalMicroseconds=int(total)
            )
    if not figures:
        return None
    return MemoryPressure(some=figures.get("some"), full=figures.get("full"))


def parse_vmstat_swap(text: str) -> tuple[int, int] | None:
    """``(pswpin, pswpout)`` pages from the text of ``/proc/vmstat``; None when either is missing
    (a kernel built without swap has neither)."""
    found = dict(_VMSTAT.findall(text))
    if "pswpin" not in found or "pswpout" not in found:
        return None
    return int(found["pswpin"]), int(found["pswpout"])


def swap_rate(
    before: tuple[float, int] | None, after: tuple[float, int], page_size: int
) -> float | None:
    """Bytes per second between two ``(seconds, pages)`` counter readings.

    None without a previous reading, when no time passed, or when the counter
    went back (a reset cannot be told from a wrap)."""
    if before is None:
        return None
    dt, pages = after[0] - before[0], after[1] - before[1]
    if dt <= 0 or pages < 0:
        return None
    return pages * page_size / dt


@dataclass(slots=True)
class HostMemoryReader:
    """Reads the node's swap rates and memory pressure under ``proc_root``.

    ``read()`` returns a ``HostMemory``; its rates are None on the first read
    (they need two). ``clock`` gives seconds (monotonic)."""

    proc_root: Path = Path("/proc")
    clock: Callable[[], float] = time.monotonic
    page_size: int = os.sysconf("SC_PAGE_SIZE")
    _last: tuple[float, int, int] | None = None

    def read(self) -> HostMemory:
        """One reading; unreadable files leave their figures absent."""
        now = self.clock()
        vmstat = _read_text(self.proc_root / "vmstat")
        counters = parse_vmstat_swap(vmstat) if vmstat is not None else None
        swap_in = swap_out = None
        if counters is not None:
            last = self._last
            swap_in = swap_rate((last[0], last[1]) if last else None, (now, counters[0]), self.page_size)
            swap_out = swap_rate((last[0], last[2]) if last else None, (now, counters[1]), self.page_size)
            self._last = (now, *counters)
        psi = _read_text(self.proc_root / "pressure" / "memory")
        return HostMemory(
            swapInBytesPerSecond=swap_in,
            swapOutBytesPerSecond=swap_out,
            pressure=parse_pressure(psi) if psi is not None else None,
        )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
