"""The canary and the tally of the fuzz tests (issue 17, item 7).

Each test puts hostile objects of one kind next to a well-formed canary (a
budget with over-limit pods in its own namespace, on its own node, its
escalation under way), runs them through the operator's own parsing (the
index entries), its planning and the engine, and compares what the canary
gets with what it gets alone. ``VRAMGUARD_FUZZ_EXAMPLES`` sets the number of
inputs per kind (``make fuzz``: 10,000; the unit suite: a few hundred); the
counts are printed at the end of the run (``conftest.py``) and written to
``fuzz-results.json`` when ``VRAMGUARD_FUZZ_RESULTS`` names it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings

from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import EngineConfig, EngineOutput
from vramguard_operator.plan.entries import Versioned, budget_entry, pod_entry, report_entry
from vramguard_operator.plan.full_pass import Snapshot, plan

EXAMPLES = int(os.environ.get("VRAMGUARD_FUZZ_EXAMPLES", "300"))
TALLY: dict[str, Counter[str]] = {}

NOW = datetime(2024, 5, 1, 10, 10, 0, tzinfo=UTC)
GI = 1 << 30
CANARY_NS = "canary"
CANARY_NODE = "node-c"
HOSTILE_NODE = "node-h"
KEY = b"fuzz-state-key-0123456789abcdef"


def fuzz_settings() -> Any:
    """Hypothesis settings of the fuzz tests: ``EXAMPLES`` inputs, no deadline
    (one evaluation may take longer on a loaded machine)."""
    return settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def tally(kind: str, outcome: str) -> None:
    TALLY.setdefault(kind, Counter())[outcome] += 1


def pod_body(ns: str, name: str, node: str, annotations: dict[str, Any] | None = None,
             cpu: Any = "4", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": labels if labels is not None else {"app": "train"},
                     "annotations": annotations or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {
            "limits": {"cpu": cpu}, "requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running"},
    }


def budget_obj(ns: str, name: str, vram: str = "10Gi", status: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryBudget",
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "generation": 1, "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": {"app": "train"}}, "limits": {"perPod": {"vram": vram}},
                 "enforcement": {"escalation": [{"action": "Annotate", "after": "0s"},
                                                {"action": "Throttle", "after": "5m"},
                                                {"action": "Evict", "after": "30m"}]}},
    }
    if status is not None:
        body["status"] = status
    return body


def report_obj(node: str, pods: dict[str, int], ns: str, t: datetime = NOW) -> dict[str, Any]:
    return {
        "apiVersion": "vramguard.io/v1alpha1", "kind": "NodeGPUUsage",
        "metadata": {"name": node, "uid": f"uid-report-{node}", "resourceVersion": "1"},
        "spec": {"nodeName": node},
        "status": {"sampleTime": t.isoformat(), "devices": [{"uuid": f"GPU-{node}", "index": 0, "memory": {
            "totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI}}],
            "pods": [{"uid": f"uid-{n}", "namespace": ns, "name": n, "vramBytes": b,
                      "devices": [{"uuid": f"GPU-{node}", "usedBytes": b}]} for n, b in pods.items()]},
    }


def canary_snapshot() -> Snapshot:
    """The canary: budget ``canary`` (10Gi per pod) with pods c0 (12Gi: over, its
    Annotate fired 10 minutes ago, Throttle due now) and c1 (9Gi: warning)."""
    snap = Snapshot()
    since = (NOW - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"violations": [{"kind": "PodVRAM", "pod": "c0", "observedBytes": 12 * GI, "limitBytes": 10 * GI,
                              "since": since, "openedAt": since, "step": "Annotate", "stepTime": since,
                              "message": "over"}]}
    snap.budgets[CANARY_NS] = [budget_entry(budget_obj(CANARY_NS, "canary", status=status))]
    record = json.dumps([{"budget": "canary", "budgetUID": "uid-canary", "kind": "PodVRAM", "since": since,
                          "openedAt": since, "step": "Annotate", "stepTime": since, "observedBytes": 12 * GI,
                          "limitBytes": 10 * GI}], separators=(",", ":"))
    snap.pods[CANARY_NS] = [pod_entry(pod_body(CANARY_NS, "c0", CANARY_NODE, {"vramguard.io/violations": record})),
                            pod_entry(pod_body(CANARY_NS, "c1", CANARY_NODE))]
    snap.reports[CANARY_NODE] = report_entry(report_obj(CANARY_NODE, {"c0": 12 * GI, "c1": 9 * GI}, CANARY_NS))
    snap.namespaces.update({CANARY_NS: {"team": "canary"}, "h1": {"team": "hostile"}, "h2": {}})
    return snap


def run(snap: Snapshot, config: EngineConfig) -> list[EngineOutput]:
    """Plan and evaluate every group of ``snap``, as the reconcile loop does."""
    work = plan(snap, NOW, config)
    return [evaluate(g.input) for g in work.groups]


def canary_part(outs: list[EngineOutput]) -> tuple[Any, ...]:
    """What the canary namespace got: decisions, pod patches, statuses, problems."""
    mine: Callable[[str], bool] = lambda ns: ns == CANARY_NS  # noqa: E731
    return (
        [d for o in outs for d in o.decisions if mine(d.budget.namespace)],
        [p for o in outs for p in o.pod_patches if mine(p.pod.namespace)],
        [s for o in outs for s in o.statuses if mine(s.budget.namespace)],
        [p for o in outs for p in o.object_problems if mine(p.namespace)],
    )


def check_canary(kind: str, snap: Snapshot, config: EngineConfig, alone: tuple[Any, ...]) -> list[EngineOutput]:
    """Run ``snap`` and compare the canary's part with ``alone``; tally the
    outcome. An exception escaping is tallied and re-raised (hypothesis then
    shrinks and reports the input)."""
    try:
        outs = run(snap, config)
    except Exception:
        tally(kind, "escaped exceptions")
        raise
    tally(kind, "inputs")
    if canary_part(outs) != alone:
        tally(kind, "canary differences")
        raise AssertionError(f"{kind}: the canary was evaluated differently next to hostile input")
    return outs


def entries(items: list[Any]) -> list[Versioned[Any]]:
    return list(items)
