"""Escalation state on a pod is obeyed only when this operator wrote it (issue 17,
item 6): with a state key, what the engine writes is sealed (HMAC over the
pod's uid and its state), and state whose seal does not verify (forged where
the annotation guard is off, edited by an admin group, copied from another
pod, written before the key) is ignored, reported, and replaced at once. The
forgeries of the issue: an ``original-cpu`` above what the pod had, and a step
the operator never reached."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from vramguard_operator.engine.seal import seal, verify
from vramguard_operator.engine.types import (
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_STATE_SIGNATURE,
    ANNOTATION_VIOLATIONS,
    Annotate,
    EngineConfig,
    Evict,
    PodFacts,
    Recover,
    Throttle,
)

from .builders import apply, at, budget, pod, report, run, simulate, steps, vram

KEY = b"k" * 32
SEALED = EngineConfig(state_key=KEY)
LADDER = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "5m"},
          {"action": "Evict", "after": "10m"}]


def forged(p: PodFacts, **annotations: str) -> PodFacts:
    return replace(p, annotations={**p.annotations, **annotations})


def record(step: str, **extra: Any) -> str:
    return json.dumps([{"budget": "train", "budgetUID": "uid-train", "kind": "PodVRAM",
                        "since": "2024-05-01T09:00:00Z", "openedAt": "2024-05-01T09:00:00Z",
                        "step": step, "stepTime": "2024-05-01T09:10:00Z", **extra}])


def test_sealed_state_round_trips_and_the_ladder_runs_as_without_a_key():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    timeline = [(t, {"w0": vram(41)}) for t in (0, 300, 600)]
    sealed_events, _, pods = simulate([b], [pod("w0")], timeline, config=SEALED)
    plain_events, _, _ = simulate([b], [pod("w0")], timeline)
    assert steps(sealed_events) == steps(plain_events) == [
        (0, "Annotate", "w0"), (300, "Throttle", "w0"), (600, "Evict", "w0")]
    ann = pods[0].annotations
    assert ann[ANNOTATION_STATE_SIGNATURE].startswith("v1:") and verify(KEY, "uid-w0", ann)


def test_a_forged_original_cpu_is_not_obeyed():
    """A 100m pod (at the default throttle target) claims it had 64 CPUs and that
    budget train throttled it: without a key the operator would restore 64 CPUs."""
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    lie = forged(pod("w0", cpu="100m"), **{ANNOTATION_ORIGINAL_CPU: '{"main":{"limit":"64","request":"64"}}',
                                          ANNOTATION_VIOLATIONS: record("Throttle")})
    rep = [report("node-a", at(0), {"w0": vram(1)})]
    obeyed = run([b], [lie], rep, at(0))  # no key: the hole the annotation guard closes
    assert [c.limit for d in obeyed.decisions if isinstance(d, Recover) for c in d.restore] == ["64"]
    out = run([b], [lie], rep, at(0), config=SEALED)
    assert not [d for d in out.decisions if isinstance(d, Recover) and d.restore]
    (problem,) = out.object_problems
    assert (problem.kind, problem.name, problem.reason) == ("Pod", "w0", "StateRejected")
    assert "has no seal" in problem.message and '"limit":"64"' in problem.message
    (patch,) = out.pod_patches  # replaced by the state the operator holds: none
    assert patch.annotations == {ANNOTATION_ORIGINAL_CPU: None, ANNOTATION_VIOLATIONS: None}


def test_a_forged_evict_step_does_not_make_a_pod_unevictable():
    """An over-limit pod claims its Evict step fired already; the ladder runs anyway."""
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    lie = forged(pod("w0"), **{ANNOTATION_VIOLATIONS: record("Evict")})
    rep = [report("node-a", at(0), {"w0": vram(41)})]
    obeyed = run([b], [lie], rep, at(0)).decisions  # no key: the forgery is obeyed (no step ever fires)
    assert not [d for d in obeyed if isinstance(d, Annotate | Evict)]
    out = run([b], [lie], rep, at(0), config=SEALED)
    assert [type(d) for d in out.decisions] == [Annotate]
    timeline = [(t, {"w0": vram(41)}) for t in (0, 300, 600)]
    events, _, _ = simulate([b], [lie], timeline, config=SEALED)
    assert steps(events) == [(0, "Annotate", "w0"), (300, "Throttle", "w0"), (600, "Evict", "w0")]


def test_a_step_the_budget_holds_is_written_back_over_a_rejected_state():
    """The budget's record (its status, which only the operator writes) survives a
    pod whose state was tampered with: the step is put back on the pod, sealed."""
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)}), (300, {"w0": vram(41)})],
                                     config=SEALED)
    tampered = forged(pods[0], **{ANNOTATION_VIOLATIONS: record("Evict")})
    out = run(budgets, [tampered], [report("node-a", at(360), {"w0": vram(41)})], at(360), config=SEALED)
    assert not [d for d in out.decisions if not isinstance(d, Throttle)]
    budgets, pods = apply(out, budgets, [tampered])
    (rec,) = json.loads(pods[0].annotations[ANNOTATION_VIOLATIONS])
    assert rec["step"] == "Throttle" and verify(KEY, "uid-w0", pods[0].annotations)
    out = run(budgets, pods, [report("node-a", at(600), {"w0": vram(41)})], at(600), config=SEALED)
    assert [type(d) for d in out.decisions] == [Evict]


def test_state_copied_from_another_pod_or_sealed_with_another_key_is_rejected():
    b = budget(per_pod={"vram": "40Gi"}, ladder=LADDER)
    _, _, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})], config=SEALED)
    copied = replace(pod("w1"), annotations=dict(pods[0].annotations))
    assert not verify(KEY, "uid-w1", copied.annotations)
    other_key = seal(b"x" * 32, "uid-w0", pods[0].annotations[ANNOTATION_VIOLATIONS], None)
    rekeyed = forged(pods[0], **{ANNOTATION_STATE_SIGNATURE: other_key})
    rep = [report("node-a", at(60), {"w0": vram(41), "w1": vram(41)})]
    out = run([b], [rekeyed, copied], rep, at(60), config=SEALED)
    assert sorted(p.name for p in out.object_problems) == ["w0", "w1"]
    assert all("does not match its seal" in p.message for p in out.object_problems)


def test_without_state_no_seal_is_needed_and_none_is_written():
    b = budget(per_pod={"vram": "40Gi"})
    out = run([b], [pod("w0")], [report("node-a", at(0), {"w0": vram(1)})], at(0), config=SEALED)
    assert out.pod_patches == () and out.object_problems == ()
