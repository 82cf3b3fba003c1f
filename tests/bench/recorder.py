"""Benchmark figures as data: each benchmark prints its figures for a reader and
records them here, and ``make bench`` writes them all to ``bench-results.json``
(``--bench-results PATH``) so that a regression shows without reading logs.

The file (format 1, documented in README.md's development section)::

    {"format": 1,
     "time": "2025-01-01T12:00:00Z",                  # session start, UTC
     "machine": {"cores": 2, "usable_cores": 2, "cpu": "...", "python": "3.11.7", "platform": "..."},
     "commit": "<git HEAD>[-dirty]" | null,
     "tests": {"<node id>": "passed" | "failed" | "skipped", ...},
     "figures": [
       {"name": "agent.tick_median_cpu[1024-processes]", "value": 4.3, "unit": "ms",
        "target": {"op": "<", "value": 5.0} | null, "met": true | false | null,
        "test": "<node id>"}, ...]}

A missed target is recorded (``"met": false``) and reported at the end of the
run, never asserted: benchmarks measure, they do not gate.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

FORMAT = 1
Op = Literal["<", "<=", ">", ">="]
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
}


@dataclass(frozen=True, slots=True)
class Target:
    """A figure's target: ``value op bound`` (for example ``< 5`` ms)."""

    op: Op
    bound: float

    def met(self, value: float) -> bool:
        """Whether ``value`` meets the target."""
        return _OPS[self.op](value, self.bound)


@dataclass(frozen=True, slots=True)
class Figure:
    """One recorded figure: a finite ``value`` in ``unit``, from test ``test``."""

    name: str
    value: float
    unit: str
    target: Target | None
    test: str

    def to_json(self) -> dict[str, Any]:
        """The figure's entry in bench-results.json."""
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": None if self.target is None else {"op": self.target.op, "value": self.target.bound},
            "met": None if self.target is None else self.target.met(self.value),
            "test": self.test,
        }


@dataclass
class Results:
    """Every figure of a session, with the outcome of each benchmark test."""

    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    figures: list[Figure] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)

    def add(self, figure: Figure) -> None:
        """Add a figure; raises ``ValueError`` for a name already recorded."""
        if any(f.name == figure.name for f in self.figures):
            raise ValueError(f"benchmark figure {figure.name!r} recorded twice")
        self.figures.append(figure)

    def missed(self) -> list[Figure]:
        """Figures whose target is not met."""
        return [f for f in self.figures if f.target is not None and not f.target.met(f.value)]

    def to_json(self) -> dict[str, Any]:
        """The whole bench-results.json document."""
        return {
            "format": FORMAT,
            "time": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": machine(),
            "commit": _commit(),
            "tests": dict(self.outcomes),
            "figures": [f.to_json() for f in self.figures],
        }

    def write(self, path: Path) -> None:
        """Write the document to ``path`` (replaced whole, through a temporary file)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)


class BenchRecorder:
    """What a benchmark gets from the ``bench`` fixture. ``record`` adds one
    figure; a parametrized test's figures get its parameter id appended to
    their names (``name[id]``), so names stay unique across the session."""

    def __init__(self, results: Results | None = None, test: str = "", case: str | None = None) -> None:
        self.results = results if results is not None else Results()
        self.test = test
        self.case = case

    def record(
        self,
        name: str,
        value: float,
        unit: str,
        *,
        below: float | None = None,
        at_most: float | None = None,
        above: float | None = None,
        at_least: float | None = None,
    ) -> Figure:
        """Record ``value`` (finite) in ``unit`` with at most one target bound:
        ``below`` (<), ``at_most`` (<=), ``above`` (>), ``at_least`` (>=).
        Raises ``ValueError`` naming the figure for a non-finite value, more than
        one bound, or a name already recorded."""
        full = f"{name}[{self.case}]" if self.case else name
        bounds = [(op, b) for op, b in (("<", below), ("<=", at_most), (">", above), (">=", at_least)) if b is not None]
        if len(bounds) > 1:
            raise ValueError(f"benchmark figure {full!r}: one target at most, got {bounds}")
        if not math.isfinite(value):
            raise ValueError(f"benchmark figure {full!r}: value must be finite, got {value!r}")
        target = Target(bounds[0][0], float(bounds[0][1])) if bounds else None  # type: ignore[arg-type]
        figure = Figure(full, float(value), unit, target, self.test)
        self.results.add(figure)
        return figure


def machine() -> dict[str, Any]:
    """The machine the figures come from: logical cores, the cores this process
    may use, CPU model (from /proc/cpuinfo where there is one), Python, platform."""
    cpu = platform.processor() or None
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
