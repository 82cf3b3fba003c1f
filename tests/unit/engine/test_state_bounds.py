"""Bounded work per object (issue 32, item 3): a pod's
``vramguard.io/violations`` holding more records than the budgets of its
namespace could have written (or more bytes than such records take) is
rejected as a whole: one ``StateRejected`` problem, no ``Recovered`` Event per
record, and the annotation replaced by the state the operator holds. A list
within the bound is read as before (a deleted budget's records still close)."""

from __future__ import annotations

import json
from dataclasses import replace

from vramguard_operator.engine.records import RECORD_BYTES, RECORDS_PER_BUDGET, records_bound
from vramguard_operator.engine.types import ANNOTATION_ORIGINAL_CPU, ANNOTATION_VIOLATIONS, Recover, Throttle

from .builders import at, budget, pod, report, run, vram


def flood(n: int) -> str:
    return json.dumps([{"budget": f"ghost-{i}", "budgetUID": f"uid-ghost-{i}", "kind": "PodVRAM",
                        "since": "2024-05-01T09:00:00Z", "openedAt": "2024-05-01T09:00:00Z",
                        "step": "Annotate", "stepTime": "2024-05-01T09:00:00Z"} for i in range(n)],
                      separators=(",", ":"))


def evaluate_with(annotation: str, **more: str):  # type: ignore[no-untyped-def]
    flooded = replace(pod("w0", cpu="500m"), annotations={ANNOTATION_VIOLATIONS: annotation, **more})
    return run([budget(per_pod={"vram": "10Gi"})], [flooded, pod("w1")],
               [report("node-a", at(0), {"w0": vram(4), "w1": vram(12)})], at(0))


def test_a_flood_of_records_is_rejected_as_a_whole_with_one_problem():
    out = evaluate_with(flood(900), **{ANNOTATION_ORIGINAL_CPU: '{"main":{"limit":"64"}}'})
    assert not [d for d in out.decisions if isinstance(d, Recover)]  # not 900 Recovered, no 64-CPU restore
    (problem,) = out.object_problems
    assert (problem.kind, problem.name, problem.reason) == ("Pod", "w0", "StateRejected")
    assert "166281 bytes, more than the" in problem.message  # 900 records are too long to parse
    (patch,) = [p for p in out.pod_patches if p.pod.name == "w0"]
    assert patch.annotations == {ANNOTATION_VIOLATIONS: None, ANNOTATION_ORIGINAL_CPU: None}
    # the other pod is evaluated as ever
    assert [(type(d).__name__, d.pod.name) for d in out.decisions if d.pod and not isinstance(d, Recover)] == [
        ("Annotate", "w1")]


def test_more_records_than_the_budgets_could_write_are_rejected():
    (problem,) = evaluate_with(flood(records_bound(1) + 1)).object_problems
    assert f"{records_bound(1) + 1} records, more than the {records_bound(1)} the budgets" in problem.message


def test_an_oversized_text_is_rejected_unparsed():
    text = "[" + " " * (records_bound(1) * RECORD_BYTES) + "]"
    (problem,) = evaluate_with(text).object_problems
    assert "bytes, more than the" in problem.message


def test_records_within_the_bound_are_read_and_a_deleted_budgets_close():
    out = evaluate_with(flood(3))
    assert sorted(d.budget.name for d in out.decisions if isinstance(d, Recover)) == ["ghost-0", "ghost-1", "ghost-2"]
    assert not out.object_problems
    assert not [d for d in out.decisions if isinstance(d, Throttle)]


def test_the_bound_covers_every_record_one_budget_can_write():
    # one per kind but DeviceVRAM (the per-pod and total VRAM and RAM, Leak, RAMLeak), and a
    # DeviceVRAM record per device of the report's bound
    assert RECORDS_PER_BUDGET == 6 + 64
    assert records_bound(0) == 2 * RECORDS_PER_BUDGET
