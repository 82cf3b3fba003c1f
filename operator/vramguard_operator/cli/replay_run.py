"""The run of ``vramguard replay``: the replayed node and its pods, the node
report built at each sample time, the engine on it, and its output applied as
by a successful actions layer (``engine.apply``, shared with the fleet
simulation). ``replay.py`` reads the inputs and prints.

The world: every pod of the recording is selected by the budget (it gets labels
that satisfy the selector) and runs on one node (``NODE``) with one device
(``DEVICE``) from its first row to its last; times are seconds since ``EPOCH``.
A pod's uid is a UUIDv5 of ``namespace/name`` (``pod_uid``). With leak
detection on, trend features come from ``vramguard_api.history.HistoryStore``,
the agent's own history code, with the agent's defaults (only the window
follows ``--trend-window``), fed as the agent's sampler feeds it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.history import DEFAULT_WINDOW_S, HistoryStore
from vramguard_api.meta import LabelSelector
from vramguard_api.trend import TrendFeatures
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.apply import apply_output
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.engine.types import (
    ContainerFacts,
    EffectivePolicy,
    EngineConfig,
    EngineInput,
    EngineOutput,
    PodFacts,
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


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """One sample time of a replay: the node report the engine saw (with each
    pod's trend features, as the agent would have reported them) and what the
    engine returned."""

    t_seconds: float
    report: NodeGPUUsage
    output: EngineOutput


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
