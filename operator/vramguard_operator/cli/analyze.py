"""``vramguard analyze FILE``: say whether a VRAM or RAM log shows a leak.

Reads a plain ``t_seconds,bytes`` CSV (VRAM, or RAM with ``--memory RAM``: a
process's RSS or a cgroup's usage), a step-indexed log (``--interval``),
``pidstat -r`` or ``ps -o etimes,rss`` output (RAM, ``ramlog.py``), or
the CSV that
``nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_gpu_memory --format=csv -l N``
(one series per pid) or ``nvidia-smi --query-gpu=timestamp,memory.used --format=csv -l N``
(one series per GPU) writes (``memlog.py``), and judges each series with the
detector the agent and the operator use (:mod:`vramguard_api.leak`). Says when
a log is too short to judge, draws a sparkline of the floor, and with
``--plot`` a picture of the verdict (``analyze_plot.py``, matplotlib). A
container log or kernel lines that show an out-of-memory kill are read as such
instead (``oom_log.py``).

Each series gets one of three verdicts (``vramguard_api.leak.judgement``): a
leak, no leak, or undetermined with the reason (no usable values, too short,
too sparse): "no leak" is never said of a log too small to show one. Exit
status (docs/cli.md, "Exit codes"): 0 no leak in any series (or no OOM in a
log), 1 a leak in at least one series (or an OOM in the log), 2 bad input, 3 no
leak found but at least one series undetermined.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path

from vramguard_api.cliargs import duration_arg as _duration
from vramguard_api.cliargs import quantity_arg as _quantity
from vramguard_api.leak import (
    DEFAULT_MIN_EVIDENCE_SECONDS,
    DEFAULT_MIN_GROWTH_BYTES_PER_HOUR,
    DEFAULT_MIN_WINDOW_SECONDS,
    Analysis,
    LeakResult,
    analyse,
    verdict,
)
from vramguard_api.leak.judgement import Judgement, Verdict, judge
from vramguard_api.units import format_bytes, format_seconds
from vramguard_operator.cli import oom_log, ramlog
from vramguard_operator.cli.analyze_plot import PlotError, plot, sparkline
from vramguard_operator.cli.memlog import LogError, Series, parse_log, read_text, select
from vramguard_operator.cli.oom_log import shows_oom

EXIT_NO_LEAK, EXIT_LEAK, EXIT_BAD_INPUT, EXIT_UNDETERMINED = 0, 1, 2, 3
EXIT_OOM = 1  # a log that shows an out-of-memory kill (oom_log.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vramguard analyze``."""
    parser.add_argument(
        "file", metavar="FILE", type=Path,
        help="memory log: t_seconds,bytes CSV, step-indexed CSV or nvidia-smi CSV; - reads stdin"
    )
    parser.add_argument(
        "--limit",
        metavar="QUANTITY",
        type=_quantity("--limit"),
        help="project the time until this (e.g. 80Gi; default the device's memory.total when the log has it)",
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
        help="a steady rise this long is a leak however noisy: the longest a leak waits (default 30m)",
    )
    parser.add_argument(
        "--min-evidence",
        metavar="DURATION",
        type=_duration("--min-evidence"),
        default=DEFAULT_MIN_EVIDENCE_SECONDS,
        help="no leak rests on a rise shorter than this, however fast (default 7m)",
    )
    parser.add_argument(
        "--interval",
        metavar="DURATION",
        type=_duration("--interval"),
        help="time per step of a log with a step or iteration column and no time (e.g. 2s)",
    )
    parser.add_argument(
        "--memory",
        choices=("VRAM", "RAM"),
        help="which memory a t_seconds,bytes CSV holds (default VRAM; pidstat and ps logs are RAM)",
    )
    parser.add_argument("--plot", metavar="PNG", type=Path, help="draw the verdict to this PNG file (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per series, one per line")


def run(args: argparse.Namespace) -> int:
    """Analyze the log; print the verdicts; return the exit status."""
    if args.interval is not None and args.interval <= 0:
        print(f"vramguard analyze: --interval must be above 0s, got {args.interval:g}s", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        text = read_text(args.file)  # "-": stdin, read once for both readers
        if shows_oom(text):  # a container log or kernel lines, not a memory CSV (oom_log.py)
            return _oom_log(args, text)
        series = select(_read(args.file, text, args.interval, args.memory), args.pid)
    except (OSError, UnicodeDecodeError) as err:
        print(f"vramguard analyze: cannot read {args.file}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LogError as err:
        print(f"vramguard analyze: {args.file}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    thresholds = {
        "min_growth_bytes_per_hour": args.min_growth,
        "min_window_seconds": args.min_window,
        "min_evidence_seconds": args.min_evidence,
    }
    judged = []
    for s in series:
        a = analyse(s.times, s.values)
        limit = args.limit if args.limit is not None else (None if s.total is None else int(s.total))
        result = verdict(a, limit_bytes=limit, **thresholds)
        j = judge(a, result, **thresholds)
        judged.append((s, a, result, j))
        print(json.dumps(to_json(s, a, result, j)) if args.json else describe(s, a, result, j, limit))
    if args.plot is not None:
        try:
            plot(judged, args.plot, args.limit)
        except PlotError as err:
            print(f"vramguard analyze: --plot: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not args.json:
            print(f"plot written to {args.plot}")
    return exit_code([j for *_, j in judged])


def _read(path: Path, text: str, interval_s: float | None, memory: str | None) -> list[Series]:
    """The log's series: a pidstat or ps log (RAM), else a CSV (``memlog``) of ``memory``."""
    if ramlog.recognises(text):
        if memory == "VRAM":
            raise LogError("--memory VRAM: this is a pidstat or ps log, which holds RAM (RSS)")
        return ramlog.read_ram_log(text, interval_s)
    series = parse_log(text, interval_s, str(path))
    for s in series:
        s.memory = memory or "VRAM"
    return series


def _oom_log(args: argparse.Namespace, text: str) -> int:
    findings = oom_log.judge(text)
    print(oom_log.to_json(str(args.file), findings) if args.json else oom_log.describe(str(args.file), findings))
    return EXIT_OOM if findings.any else EXIT_NO_LEAK


def exit_code(judgements: list[Judgement]) -> int:
    """1 when any series leaks, else 3 when any is undetermined, else 0 (docs/cli.md, "Exit codes")."""
    verdicts = {j.verdict for j in judgements}
    if Verdict.LEAK in verdicts:
        return EXIT_LEAK
    return EXIT_UNDETERMINED if Verdict.UNDETERMINED in verdicts or not verdicts else EXIT_NO_LEAK


def measured(a: Analysis) -> bool:
    """Whether the series' growth was measured (the slow path could fit its floor)."""
    return a.rise is not None


def to_json(series: Series, a: Analysis, result: LeakResult, j: Judgement) -> dict[str, object]:
    """The ``--json`` object of one series: ``verdict`` (Leak, NoLeak, Undetermined), ``reason``
    and ``detail`` when undetermined, growth (bytes per hour) null when not measured."""
    grown = measured(a)
    return {
        "series": series.label,
        "verdict": j.verdict.value,
        "reason": None if j.reason is None else j.reason.value,
        "detail": j.detail or None,
        "memory": series.memory,
        "leak": result.leak,
        "growth_bytes_per_hour": result.growth_bytes_per_hour if grown else None,
        "growth_low_bytes_per_hour": result.growth_low_bytes_per_hour if grown else None,
        "onset_t_seconds": result.onset_t_seconds,
        "time_to_limit_seconds": result.time_to_limit_seconds,
        "samples": result.samples,
        "evidence_seconds": result.evidence_seconds,
        "too_short": j.needed_seconds is not None,
        "needed_seconds": j.needed_seconds,
    }


def describe(series: Series, a: Analysis, result: LeakResult, j: Judgement, limit: int | None) -> str:
    """The human-readable verdict on one series."""
    span = series.times[-1] - series.times[0] if series.times else 0.0
    memory = "" if series.memory == "VRAM" else f" ({series.memory})"  # VRAM unless said
    lines = [f"{series.label}{memory}: {len(series.times)} samples over {format_seconds(span)}"]
    line = sparkline(a.t, a.v)
    if line:
        lines.append(f"  floor {line}")
    growth = (
        f", growth {format_bytes(result.growth_bytes_per_hour)}/h "
        f"(95% lower bound {format_bytes(result.growth_low_bytes_per_hour)}/h)"
        if measured(a) else ""
    )
    if j.verdict is Verdict.LEAK and result.onset_t_seconds is not None:
        risen = "" if result.evidence_seconds is None else f", rising for {format_seconds(result.evidence_seconds)}"
        lines.append(f"  leak: yes{growth} since {_when(series, result.onset_t_seconds)}{risen}")
    elif j.verdict is Verdict.NO_LEAK:
        lines.append(f"  leak: no{growth}")
    else:
        lines.append(f"  leak: {j.text}{growth}")
        lines.append(f"  cannot judge: {j.detail}")
    if j.verdict is not Verdict.LEAK and a.evidence is not None and a.evidence.objection is not None \
            and a.evidence.growth_low_bytes_per_hour > 0:
        lines.append(f"  recent rise since {_when(series, a.evidence.onset_t_seconds)}: {a.evidence.objection}")
    if limit is not None:
        ttl = result.time_to_limit_seconds
        eta = "not projected (no significant growth)" if ttl is None else format_seconds(ttl)
        lines.append(f"  time to limit {format_bytes(limit)}: {eta}")
    return "\n".join(lines)


def _when(series: Series, t: float) -> str:
    if series.origin is None:
        return f"t={t:g}s"
    return f"{series.origin + timedelta(seconds=t):%Y/%m/%d %H:%M:%S} (t={t:g}s)"
