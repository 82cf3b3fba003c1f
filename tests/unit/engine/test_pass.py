"""What one budget's evaluation hands to the next in the same evaluation
(``engine.work.PassState``), and the pieces that take and return it."""

from __future__ import annotations

import json

from vramguard_operator.engine.budget import evaluate_budget
from vramguard_operator.engine.keys import ANNOTATION_ORIGINAL_CPU, BudgetRef, ViolationKey
from vramguard_operator.engine.measure import read_nodes
from vramguard_operator.engine.outputs import Evict, Recover, Throttle
from vramguard_operator.engine.records import ViolationRecord
from vramguard_operator.engine.throttle import original_to_annotation, restore_unthrottled
from vramguard_operator.engine.types import ContainerFacts, EngineConfig, EventSpec, PodFacts
from vramguard_operator.engine.work import PassState

from .builders import GI, at, budget, pod, report, run, vram


def test_a_pod_is_evicted_once_when_two_budgets_ask_in_one_evaluation():
    ladder = [{"action": "Evict", "after": "0s"}]
    budgets = [budget(name=n, uid=f"uid-{n}", per_pod={"vram": "40Gi"}, ladder=ladder) for n in ("b", "a")]
    out = run(budgets, [pod("w0")], [report("node-a", at(0), {"w0": vram(50)})], at(0))
    evicts = [d for d in out.decisions if isinstance(d, Evict)]
    assert [(d.budget.name, d.pod.name) for d in evicts] == [("a", "w0")]


def test_a_second_budget_plans_its_throttle_from_the_first_ones_resize():
    w0 = PodFacts("ml", "w0", "uid-w0", {"app": "train"}, "node-a", "Running", (ContainerFacts("main", "4", "3"),))

    def throttling(name: str, cpu: str):
        ladder = [{"action": "Throttle", "after": "0s", "cpuLimit": cpu}]
        return budget(name=name, uid=f"uid-{name}", per_pod={"vram": "40Gi"}, ladder=ladder)

    out = run([throttling("a", "1"), throttling("b", "2")], [w0], [report("node-a", at(0), {"w0": vram(50)})], at(0))
    a, b = [d for d in out.decisions if isinstance(d, Throttle)]
    assert [(c.name, c.limit, c.request) for c in a.resize] == [("main", "1", "999m")]
    # budget b's target (2) is above what budget a just set: nothing to resize, never raised back
    assert b.resize == () and b.impossible_reason is None
    (patch,) = out.pod_patches
    assert json.loads(patch.annotations[ANNOTATION_ORIGINAL_CPU]) == {"main": {"limit": "4", "request": "3"}}


def test_a_budget_returns_its_changes_and_leaves_the_state_it_was_given_as_it_was():
    b = budget(per_pod={"vram": "40Gi"})
    w0 = pod("w0")
    key = ViolationKey("ml", "train", "PodVRAM", "w0")
    rec = ViolationRecord(key, "uid-train", at(0), at(0), "Annotate", at(0), 45 * GI, 40 * GI)
    records = {w0.uid: {key: rec}}
    state = PassState(at(60), EngineConfig(), {w0.uid: w0}, pod_records=records)
    nodes = read_nodes({"node-a": report("node-a", at(60), {"w0": vram(10)})}, at(60), 60)
    result = evaluate_budget(b, [w0], nodes, True, True, state)
    assert records == {w0.uid: {key: rec}} and state.pod_records is records  # not written
    assert result.pod_records == {w0.uid: {}} and result.dirty == {w0.uid}
    assert [(type(d).__name__, d.cause) for d in result.decisions] == [("Recover", "UsageBelowLimit")]
    assert w0.uid in result.pod_data and result.pairs == 1 and result.status.open_violations == 0


def recover(pod: PodFacts, restore=()) -> Recover:
    key = ViolationKey(pod.namespace, "b", "PodVRAM", pod.name)
    return Recover(
        budget=BudgetRef(pod.namespace, "b"),
        violation=key,
        pod=pod.ref,
        time=at(0),
        observed_bytes=0,
        limit_bytes=0,
        event=EventSpec("Normal", "Recovered", "x"),
        restore=restore,
    )


def throttled(name: str, original: dict) -> PodFacts:
    return PodFacts(
        "ml",
        name,
        f"uid-{name}",
        node_name="node-a",
        containers=(ContainerFacts("main", "100m", "100m"), ContainerFacts("side", "1", None)),
        annotations={ANNOTATION_ORIGINAL_CPU: original_to_annotation(original)},
    )


def test_restore_attaches_to_the_pods_recover_or_adds_one_and_reports_what_it_leaves():
    original = {"main": {"limit": "4", "request": "4"}, "side": {"limit": "2", "request": None}}
    w0, w1 = throttled("w0", original), throttled("w1", original)
    held = throttled("held", original)
    key = ViolationKey("ml", "b", "PodVRAM", "held")
    records = {held.uid: {key: ViolationRecord(key, "u", at(0), at(0), "Throttle", at(0))}}
    pods = {p.uid: p for p in (w0, w1, held)}
    targets = {w0.uid: {"100m"}, w1.uid: {"0.1"}, held.uid: {"100m"}}
    decisions = (recover(w0), recover(w0))
    r = restore_unthrottled(pods, records, {}, targets, decisions, at(0))
    restored = (("main", "4", "4"),)
    # w0: the first Recover gains the restore; w1 gets one of its own
    assert [(d.pod.name, d.cause, tuple((c.name, c.limit, c.request) for c in d.restore)) for d in r.decisions] == [
        ("w0", "UsageBelowLimit", restored),
        ("w0", "UsageBelowLimit", ()),
        ("w1", "OrphanedThrottle", restored),
    ]
    assert r.cleared == (w0.uid, w1.uid)  # "held" is still held at Throttle
    # "side" is not at a throttle target: not restored, and said so
    assert [p.split(": not restored")[0] for p in r.problems] == [
        "pod ml/w0 annotation vramguard.io/original-cpu: side",
        "pod ml/w1 annotation vramguard.io/original-cpu: side",
    ]
    # a pod throttled anew in this evaluation keeps its annotation
    assert restore_unthrottled(pods, records, {w0.uid: original}, targets, (), at(0)).cleared == (w1.uid,)
