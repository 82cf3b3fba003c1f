"""``vramguard replay --budget FILE --usage FILE [--json]``: run the policy engine
offline on recorded usage and print the decisions it would have made, with times.

The usage CSV has the header ``t_seconds,pod,vram_bytes[,ram_bytes]``, one row
per pod per sample; an empty cell is an unknown value. ``--usage`` also takes the
memory logs ``vramguard analyze`` reads (``memlog.parse_log``), each series a pod
named after its label (``log_samples``). Every pod in the file is
taken as selected by the budget (it gets labels that satisfy the selector) and
runs on one node with one device (``--device-memory`` usable bytes) from its
first row to its last. At each sample time the engine sees a fresh node report
built from that time's rows (a pod without a row at that time is reported with
unknown usage), applies its decisions as a successful actions layer would
(annotations, CPU resize, eviction: the pod is terminating afterwards) and
carries the state to the next sample. With leak detection on, each pod's trend
features come from the agent's own history code with the agent's defaults
(``vramguard_api.history.HistoryStore``: ``--trend-window`` seconds, default
7200, in 120 points each the minimum of its bucket, features recomputed every
300 s per pod with the agent's per-pod stagger, which follows from the pod's
uid: ``pod_uid``), so the leak rule sees the features the agent would have
reported at each sample. The run itself is ``replay_run``.

After the decisions it gives each pod the verdict ``vramguard analyze`` would
give its VRAM series (leak, no leak, or undetermined with the reason;
``vramguard_api.leak.judgement``). Exit status (docs/cli.md, "Exit codes"):
0, or 1 when ``--fail-on STEP`` is given and a decision took that step (dry
run included: it is what would have happened), 2 on bad input.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from vramguard_api.budget import LEAK_MEMORY, GPUMemoryBudget
from vramguard_api.cliargs import duration_arg, one_line
from vramguard_api.explain import validation_error
from vramguard_api.history import DEFAULT_MAX_POINTS, DEFAULT_TREND_INTERVAL_S
from vramguard_api.leak import analyse, verdict
from vramguard_api.leak.judgement import Judgement, judge
from vramguard_api.steps import Action
from vramguard_api.units import MAX_BYTES, format_bytes, format_seconds, quantity_to_bytes
from vramguard_operator.cli.memlog import LogError, Series, parse_log, read_text
from vramguard_operator.engine.types import Decision, DryRunStep, EngineConfig

from .replay_run import TREND_WINDOW_S, ReplayError, Sample, replay_steps


@dataclass(frozen=True, slots=True)
class ReplayEvent:
    """One printed decision."""

    t_seconds: float
    pod: str | None
    action: str
    violation: str
    observed_bytes: int
    limit_bytes: int
    message: str
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form."""
        t = int(self.t_seconds) if float(self.t_seconds).is_integer() else self.t_seconds
        return {
            "t_seconds": t,
            "pod": self.pod,
            "action": self.action,
            "violation": self.violation,
            "observed_bytes": self.observed_bytes,
            "limit_bytes": self.limit_bytes,
            "message": self.message,
            "dry_run": self.dry_run,
        }


STEPS: tuple[str, ...] = ("Warn", "Recover", *(a.value for a in Action))  # engine.outputs.DecisionAction
MAX_T_SECONDS = 10 * 365 * 86400.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vramguard replay``."""
    parser.add_argument("--budget", required=True, type=Path, help="GPUMemoryBudget YAML file")
    parser.add_argument("--usage", required=True, type=Path,
                        help="CSV: t_seconds,pod,vram_bytes[,ram_bytes]; or a memory log vramguard analyze reads"
                        " (t_seconds,bytes; nvidia-smi CSV), each series a pod; - for stdin")
    parser.add_argument("--interval", metavar="DURATION", type=duration_arg("--interval", positive=True),
                        help="time per step of a memory log indexed by step (as vramguard analyze's)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: decisions and each pod's leak verdict")
    parser.add_argument("--fail-on", metavar="STEP", choices=STEPS,
                        help=f"exit 1 when any decision takes this step ({', '.join(STEPS)}), for CI")
    parser.add_argument(
        "--device-memory",
        default="80Gi",
        help="usable memory of the replayed device, for perDevice fractions (default 80Gi)",
    )
    parser.add_argument(
        "--trend-window",
        metavar="DURATION",
        type=duration_arg("--trend-window", legacy_unit_s=1.0, positive=True, maximum_s=30 * 86400.0),
        default=TREND_WINDOW_S,
        help=f"history for leak trend features (default {format_seconds(TREND_WINDOW_S)}, the agent's; a bare"
        " number of seconds is deprecated); as in the"
        f" agent, {DEFAULT_MAX_POINTS} points per history, features recomputed every"
        f" {DEFAULT_TREND_INTERVAL_S:.0f} s per pod",
    )


def run(args: argparse.Namespace) -> int:
    """Run the replay; 0 on success, 1 when ``--fail-on`` STEP was taken, 2 on bad input (message on stderr)."""
    try:
        budget = load_budget(args.budget)
        samples = load_usage(args.usage, args.interval)
        device_bytes = quantity_to_bytes(args.device_memory, "--device-memory")
        events = replay(budget, samples, device_bytes, trend_window_s=args.trend_window)
    except (ReplayError, ValueError, OSError) as err:
        print(f"vramguard replay: {err}", file=sys.stderr)
        return 2
    verdicts = pod_verdicts(samples)
    if args.json:
        json.dump({"decisions": [e.to_json() for e in events],
                   "pods": [{"pod": pod, "verdict": j.verdict.value, "reason": j.reason and j.reason.value,
                             "detail": j.detail or None} for pod, j in verdicts.items()]},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_table(events, sys.stdout)
        for pod, j in verdicts.items():
            print(f"{pod}: leak: {j.text}" + (f": {j.detail}" if j.detail else ""))
    return 1 if args.fail_on is not None and any(e.action == args.fail_on for e in events) else 0


def pod_verdicts(samples: Sequence[Sample]) -> dict[str, Judgement]:
    """Each pod's leak verdict on its VRAM series (unknown values as NaN), with the
    detector's default thresholds, as ``vramguard analyze`` gives it; pods in order of first row."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for s in samples:
        times, values = series.setdefault(s.pod, ([], []))
        times.append(s.t)
        values.append(float("nan") if s.vram is None else float(s.vram))
    out = {}
    for pod, (times, values) in series.items():
        a = analyse(times, values)
        out[pod] = judge(a, verdict(a))
    return out


# --- input ---------------------------------------------------------------------------


def load_budget(path: Path) -> GPUMemoryBudget:
    """The first GPUMemoryBudget document of a YAML file; metadata defaults to
    ``replay/<file stem>``. Raises ``ReplayError`` naming the file and field."""
    with path.open(encoding="utf-8") as f:
        try:
            docs = [d for d in yaml.safe_load_all(f) if d]
        except yaml.YAMLError as err:
            raise ReplayError(f"{path}: invalid YAML: {one_line(str(err))}") from None
        except UnicodeDecodeError as err:
            raise ReplayError(f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    doc = next((d for d in docs if isinstance(d, dict) and d.get("kind") == "GPUMemoryBudget"), None)
    if doc is None:
        raise ReplayError(f"{path}: no GPUMemoryBudget document")
    doc = dict(doc)
    meta = dict(doc.get("metadata") or {})
    meta.setdefault("name", path.stem)
    meta.setdefault("namespace", "replay")
    meta.setdefault("uid", f"replay-{meta['name']}")
    meta.setdefault("generation", 1)
    doc["metadata"] = meta
    doc.pop("status", None)
    try:
        return GPUMemoryBudget.model_validate(doc)
    except ValidationError as err:
        raise ReplayError(f"{path}: {validation_error(err, GPUMemoryBudget)}") from None


def load_usage(path: Path, interval_s: float | None = None) -> list[Sample]:
    """Read the recording (``-``: stdin): the replay's usage CSV (header
    ``t_seconds,pod,...``), else a memory log ``vramguard analyze`` reads
    (``memlog.parse_log``: ``t_seconds,bytes`` or step-indexed CSV with
    ``interval_s`` seconds per step, nvidia-smi CSV), each of its series one pod
    (``log_samples``). Raises ``ReplayError`` naming the file, line and field."""
    try:
        text = read_text(path)
    except UnicodeDecodeError as err:
        raise ReplayError(f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    if _is_usage_csv(text):
        if interval_s is not None:
            raise ReplayError(f"{path}: --interval is for memory logs indexed by step; this usage CSV has t_seconds")
        try:
            return parse_usage(io.StringIO(text, newline=""), str(path))
        except csv.Error as err:
            raise ReplayError(f"{path}: not a CSV file ({err})") from None
    try:
        series = parse_log(text, interval_s, path.stem if str(path) != "-" else "stdin")
    except LogError as err:
        raise ReplayError(f"{path}: {err}") from None
    return log_samples(series, str(path))


def _is_usage_csv(text: str) -> bool:
    """Whether the first line that is not blank names the usage CSV's ``pod`` column."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    return "pod" in (f.strip() for f in first.split(","))


def log_samples(series: Sequence[Series], name: str = "log") -> list[Sample]:
    """Samples from memory-log series: each series is a pod named by its label
    (the file's name for a log of one series; ``pid 4242 (python) on gpu_uuid
    GPU-...``, ``gpu 0``... for nvidia-smi's), its values VRAM (an unknown value,
    NaN, as unknown), no RAM. Raises ``ReplayError`` for a time outside
    [0, 10 years] or a series of RAM."""
    out = []
    for s in series:
        if s.memory != "VRAM":
            raise ReplayError(f"{name}: {s.label}: a {s.memory} series; replay reads VRAM")
        for t, value, line in zip(s.times, s.values, s.lines, strict=True):
            if not 0 <= t <= MAX_T_SECONDS:
                raise ReplayError(f"{name}:{line}: time {t:g} s is not in [0, {MAX_T_SECONDS:.0f}]"
                                  " (seconds from the start of the recording, at most 10 years)")
            out.append(Sample(t, s.label, None if math.isnan(value) else int(value), None))
    out.sort(key=lambda sample: sample.t)
    return out


def parse_usage(f: Iterable[str], name: str = "usage") -> list[Sample]:
    """Parse usage CSV lines (header ``t_seconds,pod,vram_bytes[,ram_bytes]``)."""
    reader = csv.DictReader(f)
    fields = [h.strip() for h in reader.fieldnames or []]
    for required in ("t_seconds", "pod", "vram_bytes"):
        if required not in fields:
            raise ReplayError(f"{name}: header {fields} lacks {required!r}")
    reader.fieldnames = fields
    out = []
    for row in reader:
        line = reader.line_num
        try:
            t = float(row["t_seconds"])
        except (TypeError, ValueError):
            raise ReplayError(f"{name}:{line}: t_seconds: not a number: {row['t_seconds']!r}") from None
        if not 0 <= t <= MAX_T_SECONDS:
            raise ReplayError(f"{name}:{line}: t_seconds: {row['t_seconds']!r} is not in [0, {MAX_T_SECONDS:.0f}]"
                              " (seconds from the start of the recording, at most 10 years)")
        pod = (row["pod"] or "").strip()
        if not pod:
            raise ReplayError(f"{name}:{line}: pod: empty")
        out.append(
            Sample(
                t,
                pod,
                _bytes(row.get("vram_bytes"), name, line, "vram_bytes"),
                _bytes(row.get("ram_bytes"), name, line, "ram_bytes"),
            )
        )
    if not out:
        raise ReplayError(f"{name}: no samples (a header and no rows): want t_seconds,pod,vram_bytes rows")
    out.sort(key=lambda s: s.t)
    return out


def _bytes(value: str | None, name: str, line: int, field: str) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise ReplayError(f"{name}:{line}: {field}: not a number: {value!r} (want bytes, e.g. 21474836480)") from None
    if number < 0:
        raise ReplayError(f"{name}:{line}: {field}: negative: {value!r}")
    if not number <= MAX_BYTES:  # also NaN and inf (1e400)
        raise ReplayError(f"{name}:{line}: {field}: {value!r} is above the maximum of 8Pi (2^53 bytes)")
    return int(number)


# --- the replay ----------------------------------------------------------------------


def replay(
    budget: GPUMemoryBudget,
    samples: Sequence[Sample],
    device_bytes: int,
    *,
    trend_window_s: float = TREND_WINDOW_S,
    config: EngineConfig | None = None,
) -> list[ReplayEvent]:
    """Run the engine at every sample time; return the decisions in time order."""
    events: list[ReplayEvent] = []
    for step in replay_steps(budget, samples, device_bytes, trend_window_s=trend_window_s, config=config):
        events.extend(_events(step.t_seconds, step.output.decisions))
    return events


def _events(t: float, decisions: Iterable[Decision]) -> Iterable[ReplayEvent]:
    for d in decisions:
        yield ReplayEvent(
            t_seconds=t,
            pod=None if d.pod is None else d.pod.name,
            action=d.action,
            violation=d.violation.kind,
            observed_bytes=d.observed_bytes,
            limit_bytes=d.limit_bytes,
            message=relative_times(d.event.message),
            dry_run=isinstance(d, DryRunStep),
        )


# --- output ---------------------------------------------------------------------------

# The engine's messages carry RFC 3339 times; the replay's clock starts at the Unix epoch.
_STAMP = re.compile(r"\b(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z)")


def relative_times(message: str) -> str:
    """``message`` with each RFC 3339 time (the replay's clock: seconds since the
    recording's t=0 as Unix time) written as ``t=8m`` from the start of the log."""
    return _STAMP.sub(lambda m: "t=" + format_seconds(
        datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()), message)



def print_table(events: Sequence[ReplayEvent], out: TextIO) -> None:
    """Human-readable table: time, pod, action, violation, observed, limit, message."""
    if not events:
        out.write("no decisions\n")
        return
    rows = [("T_SECONDS", "POD", "ACTION", "VIOLATION", "OBSERVED", "LIMIT", "MESSAGE")]
    for e in events:
        unit = "/h" if e.violation in LEAK_MEMORY else ""
        t = str(int(e.t_seconds)) if float(e.t_seconds).is_integer() else str(e.t_seconds)
        action = e.action + (" (dry run)" if e.dry_run else "")
        rows.append(
            (
                t,
                e.pod or "(total)",
                action,
                e.violation,
                format_bytes(e.observed_bytes) + unit,
                format_bytes(e.limit_bytes) + unit,
                e.message,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r[:6], widths, strict=True)) + "  " + r[6] + "\n")
