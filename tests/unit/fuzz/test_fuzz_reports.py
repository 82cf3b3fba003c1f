"""Hostile node reports next to a canary (issue 17, item 7): numbers at and
beyond their bounds, duplicated pods and devices, impossible memory, times
far off, reports that do not parse, and two reports claiming one node. No
exception escapes; the canary (on its own node) is evaluated exactly as when
alone, and a report that is not believed leads to no action on its node."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_operator.engine.types import SIDE_EFFECT_DECISIONS, EngineConfig
from vramguard_operator.plan.entries import Versioned, budget_entry, pod_entry, report_entry
from vramguard_operator.plan.full_pass import snapshot_of

from .harness import (
    HOSTILE_NODE,
    budget_obj,
    canary_part,
    canary_snapshot,
    check_canary,
    fuzz_settings,
    pod_body,
    run,
    tally,
)
from .strategies import report_status

pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("ignore::UserWarning")]
ALONE = canary_part(run(canary_snapshot(), EngineConfig()))
TIMES = ["2024-05-01T10:10:00Z", "2024-05-01T10:09:59Z", "2024-05-01T09:00:00Z", "2024-05-01T10:11:00Z",
         "2999-12-31T23:59:59Z", "1970-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "2024-05-01T10:10:00.999999999Z",
         "junk", ""]


def report_body(name: str, node: Any, status: Any) -> dict[str, Any]:
    return {"apiVersion": "vramguard.io/v1alpha1", "kind": "NodeGPUUsage",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
            "spec": {"nodeName": node}, "status": status}


@given(st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3"]), st.sampled_from([HOSTILE_NODE, "node-h2", 7, ""]),
                          report_status(["uid-h0", "uid-h1", "uid-h0"], ["GPU-a", "GPU-b", "GPU-a"], TIMES)),
                min_size=1, max_size=3, unique_by=lambda r: r[0]))
@fuzz_settings()
def test_reports(reports: list[tuple[str, Any, Any]]) -> None:
    snap = canary_snapshot()
    snap.budgets["h1"] = [budget_entry(budget_obj("h1", "b0"))]
    snap.pods["h1"] = [pod_entry(pod_body("h1", n, HOSTILE_NODE)) for n in ("h0", "h1")]
    # as the index holds them: by the node each report claims (two may claim one)
    index: dict[str, list[Versioned[Any]]] = {}
    for name, node, status in reports:
        body = report_body(name, node, status)
        entry = report_entry(body)
        index.setdefault(str(node or name), []).append(entry)
        tally("reports", "parsed" if not isinstance(entry.value, str) else "do not parse")
    hostile = snapshot_of({}, {}, index, {}, {})
    snap.reports.update(hostile.reports)
    snap.report_conflicts.update(hostile.report_conflicts)
    outs = check_canary("reports", snap, EngineConfig(), ALONE)
    unknown = snap.unknown_nodes()
    for o in outs:
        for d in o.decisions:
            if isinstance(d, SIDE_EFFECT_DECISIONS) and d.pod is not None and d.pod.namespace == "h1":
                assert HOSTILE_NODE not in unknown, f"acted on a pod of a node not believed: {unknown}"
    not_believed = {p.name for o in outs for p in o.object_problems if p.kind == "NodeGPUUsage"}
    tally("reports", "a node not believed" if not_believed else "every node believed")
