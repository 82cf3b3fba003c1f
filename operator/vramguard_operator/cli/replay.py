"""``vramguard replay --budget FILE --usage FILE [--json]``: run the policy engine
offline on recorded usage and print the decisions it would have made, with times.

The usage CSV has the header ``t_seconds,pod,vram_bytes[,ram_bytes]``, one row
per pod per sample; an empty cell is an unknown value. Every pod in the file is
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
reported at each sample.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.history import DEFAULT_MAX_POINTS, DEFAULT_TREND_INTERVAL_S, DEFAULT_WINDOW_S, HistoryStore
from vramguard_api.meta import LabelSelector
from vramguard_api.trend import TrendFeatures
from vramguard_api.units import format_bytes, quantity_to_bytes
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.engine.types import (
    ContainerFacts,
    Decision,
    DryRunStep,
    EffectivePolicy,
    EngineConfig,
    EngineInput,
    EngineOutput,
    Evict,
    PodFacts,
    Recover,
    Throttle,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # so that now.timestamp() == t_seconds
NODE = "replay-node"
DEVICE = "GPU-replay-0"
TREND_WINDOW_S = DEFAULT_WINDOW_S  # the agent's --history-window default
REPLAY_UIDS = uuid.UUID("5d0c6f3e-1b7a-4c2e-9f4d-8a6b2e1c7d30")  # namespace of replayed pods' uids


class ReplayError(ValueError):
    """Bad replay input; the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One CSV row: time (s), pod, VRAM and RAM (bytes, None when unknown)."""

    t: float
    pod: str
    vram: int | None
    ram: int | None


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
        }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vramguard replay``."""
    parser.add_argument("--budget", required=True, type=Path, help="GPUMemoryBudget YAML file")
    parser.add_argument("--usage", required=True, type=Path, help="CSV: t_seconds,pod,vram_bytes[,ram_bytes]")
    parser.add_argument("--json", action="store_true", help="print a JSON list of decisions")
    parser.add_argument(
        "--device-memory",
        default="80Gi",
        help="usable memory of the replayed device, for perDevice fractions (default 80Gi)",
    )
    parser.add_argument(
        "--trend-window",
        type=float,
        default=TREND_WINDOW_S,
        help=f"seconds of history for leak trend features (default {TREND_WINDOW_S:.0f}, the agent's); as in the"
        f" agent, {DEFAULT_MAX_POINTS} points per history, features recomputed every"
        f" {DEFAULT_TREND_INTERVAL_S:.0f} s per pod",
    )


def run(args: argparse.Namespace) -> int:
    """Run the replay; 0 on success, 2 on bad input (message on stderr)."""
    try:
        budget = load_budget(args.budget)
        samples = load_usage(args.usage)
        device_bytes = quantity_to_bytes(args.device_memory, "--device-memory")
        events = replay(budget, samples, device_bytes, trend_window_s=args.trend_window)
    except (ReplayError, ValueError, OSError) as err:
        print(f"vramguard replay: {err}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([e.to_json() for e in events], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_table(events, sys.stdout)
    return 0


# --- input ---------------------------------------------------------------------------


def load_budget(path: Path) -> GPUMemoryBudget:
    """The first GPUMemoryBudget document of a YAML file; metadata defaults to
    ``replay/<file stem>``. Raises ``ReplayError`` naming the file and field."""
    with path.open() as f:
        try:
            docs = [d for d in yaml.safe_load_all(f) if d]
        except yaml.YAMLError as err:
            raise ReplayError(f"{path}: invalid YAML: {err}") from None
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
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ReplayError(f"{path}: {where}: {first['msg']}") from None


def load_usage(path: Path) -> list[Sample]:
    """Read the usage CSV. Raises ``ReplayError`` naming the line and field."""
    with path.open(newline="") as f:
        return parse_usage(f, str(path))


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
    out.sort(key=lambda s: s.t)
    return out


def _bytes(value: str | None, name: str, line: int, field: str) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        number = float(value)
    except ValueError:
        raise ReplayError(f"{name}:{line}: {field}: not a number: {value!r}") from None
    if number < 0:
        raise ReplayError(f"{name}:{line}: {field}: negative: {value!r}")
    return int(number)


def labels_for(selector: LabelSelector) -> dict[str, str]:
    """Labels that satisfy ``selector``; raises ``ReplayError`` when none can."""
    labels = dict(selector.match_labels or {})
    for req in selector.match_expressions or ():
        if req.operator == "In" and req.key not in labels:
            labels[req.key] = (req.values or ["x"])[0]
        elif req.operator == "Exists" and req.key not in labels:
            labels[req.key] = "replay"
    if not compile_selector(selector)(labels):
        raise ReplayError("spec.selector: no set of labels satisfies it")
    return labels


# --- the replay ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One sample time of a replay: the node report the engine saw (with each
    pod's trend features, as the agent would have reported them) and what the
    engine returned."""

    t_seconds: float
    report: NodeGPUUsage
    output: EngineOutput


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


def replay_steps(
    budget: GPUMemoryBudget,
    samples: Sequence[Sample],
    device_bytes: int,
    *,
    trend_window_s: float = TREND_WINDOW_S,
    config: EngineConfig | None = None,
) -> Iterator[ReplayStep]:
    """The replay, one ``ReplayStep`` per sample time (``samples`` sorted by time).
    Raises ``ReplayError`` when no labels satisfy the budget's selector."""
    ns = budget.metadata.namespace or "replay"
    labels = labels_for(budget.spec.selector)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in samples:
        first.setdefault(s.pod, s.t)
        last[s.pod] = s.t
    pods = {
        name: PodFacts(
            ns,
            name,
            pod_uid(ns, name),
            labels,
            NODE,
            "Running",
            (ContainerFacts("main", cpu_limit="1", cpu_request="1"),),
        )
        for name in first
    }
    ld = budget.spec.leak_detection
    # The agent's history code and defaults; only the window follows --trend-window.
    history = HistoryStore(window_s=trend_window_s) if ld is not None and ld.enabled else None
    budgets = [budget]
    for t, rows in _by_time(samples):
        now = EPOCH + timedelta(seconds=t)
        alive = [p for name, p in pods.items() if first[name] <= t <= last[name]]
        report = _report(now, t, ns, {r.pod: r for r in rows}, alive, device_bytes, history)
        out = evaluate(
            EngineInput(
                budgets=tuple(budgets),
                pods=tuple(alive),
                reports={NODE: report},
                now=now,
                policy=EffectivePolicy(exempt_namespaces=frozenset()),
                config=config or EngineConfig(),
            )
        )
        yield ReplayStep(t, report, out)
        budgets, new_pods = apply_output(out, budgets, alive)
        pods.update({p.name: p for p in new_pods})


def pod_uid(namespace: str, name: str) -> str:
    """The uid a replayed pod gets: UUIDv5 of ``namespace/name`` (a real pod's uid
    is a UUID too; the agent's trend refreshes are staggered by it)."""
    return str(uuid.uuid5(REPLAY_UIDS, f"{namespace}/{name}"))


def _by_time(samples: Sequence[Sample]) -> Iterable[tuple[float, list[Sample]]]:
    rows: list[Sample] = []
    for s in samples:
        if rows and s.t != rows[0].t:
            yield rows[0].t, rows
            rows = []
        rows.append(s)
    if rows:
        yield rows[0].t, rows


def _report(
    now: datetime,
    t: float,
    ns: str,
    rows: dict[str, Sample],
    alive: Sequence[PodFacts],
    device_bytes: int,
    history: HistoryStore | None,
) -> NodeGPUUsage:
    trends: dict[str, TrendFeatures] = {}
    if history is not None:
        # As the agent's sampler: every pod's value (None: unknown, not recorded), then
        # every pod's features on the schedule (a pod of unknown usage keeps its last).
        vram = {p.uid: (rows[p.name].vram if p.name in rows else None) for p in alive}
        history.add(t, vram)
        trends = history.trends(vram, t)
    pods = []
    for p in alive:
        s = rows.get(p.name)
        entry: dict[str, Any] = {"uid": p.uid, "namespace": ns, "name": p.name}
        if s is None or s.vram is None:
            entry["attribution"] = "Unknown"
        else:
            entry["vramBytes"] = s.vram
            entry["devices"] = [{"uuid": DEVICE, "usedBytes": s.vram}]
        if p.uid in trends:
            entry["trend"] = trends[p.uid].to_api()
        if s is not None and s.ram is not None:
            entry["ramWorkingSetBytes"] = s.ram
        pods.append(entry)
    used = sum(r.vram or 0 for r in rows.values())
    return NodeGPUUsage.model_validate(
        {
            "metadata": {"name": NODE},
            "spec": {"nodeName": NODE},
            "status": {
                "sampleTime": now.isoformat(),
                "devices": [
                    {
                        "uuid": DEVICE,
                        "index": 0,
                        "memory": {
                            "totalBytes": device_bytes,
                            "reservedBytes": 0,
                            "usedBytes": min(used, device_bytes),
                            "usableBytes": device_bytes,
                        },
                    }
                ],
                "pods": pods,
            },
        }
    )


def _events(t: float, decisions: Iterable[Decision]) -> Iterable[ReplayEvent]:
    for d in decisions:
        yield ReplayEvent(
            t_seconds=t,
            pod=None if d.pod is None else d.pod.name,
            action=d.action,
            violation=d.violation.kind,
            observed_bytes=d.observed_bytes,
            limit_bytes=d.limit_bytes,
            message=d.event.message,
            dry_run=isinstance(d, DryRunStep),
        )


def apply_output(
    out: EngineOutput, budgets: Sequence[GPUMemoryBudget], pods: Sequence[PodFacts]
) -> tuple[list[GPUMemoryBudget], list[PodFacts]]:
    """Apply an engine output as an actions layer whose every call succeeds:
    statuses written, annotation patches merged, Throttle and restoring Recover
    resizes applied, evicted pods terminating. For the replay and for tests."""
    statuses = {(u.budget.namespace, u.budget.name): u.status for u in out.statuses}
    new_budgets = []
    for b in budgets:
        key = (b.metadata.namespace or "", b.metadata.name or "")
        new_budgets.append(b.model_copy(update={"status": statuses.get(key, b.status)}))
    patches = {p.pod.uid: p.annotations for p in out.pod_patches}
    resizes: dict[str, dict[str, tuple[str, str | None]]] = {}
    evicted: set[str] = set()
    for d in out.decisions:
        if d.pod is None:
            continue
        if isinstance(d, Throttle):
            resizes.setdefault(d.pod.uid, {}).update({c.name: (c.limit, c.request) for c in d.resize})
        elif isinstance(d, Recover) and d.restore:
            resizes.setdefault(d.pod.uid, {}).update({c.name: (c.limit, c.request) for c in d.restore})
        elif isinstance(d, Evict):
            evicted.add(d.pod.uid)
    return new_budgets, [_applied(p, patches.get(p.uid), resizes.get(p.uid), p.uid in evicted) for p in pods]


def _applied(
    pod: PodFacts,
    patch: dict[str, str | None] | Any,
    resize: dict[str, tuple[str, str | None]] | None,
    evicted: bool,
) -> PodFacts:
    ann = dict(pod.annotations)
    for k, v in (patch or {}).items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    containers = pod.containers
    if resize:
        containers = tuple(
            replace(c, cpu_limit=resize[c.name][0], cpu_request=resize[c.name][1] or c.cpu_request)
            if c.name in resize
            else c
            for c in pod.containers
        )
    return replace(pod, annotations=ann, containers=containers, terminating=pod.terminating or evicted)


# --- output ---------------------------------------------------------------------------


def print_table(events: Sequence[ReplayEvent], out: TextIO) -> None:
    """Human-readable table: time, pod, action, violation, observed, limit, message."""
    if not events:
        out.write("no decisions\n")
        return
    rows = [("T_SECONDS", "POD", "ACTION", "VIOLATION", "OBSERVED", "LIMIT", "MESSAGE")]
    for e in events:
        unit = "/h" if e.violation == "Leak" else ""
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
