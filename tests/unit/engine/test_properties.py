"""Property tests (hypothesis) of the engine's safety invariants over random
budgets, ladders, usage timelines, stale reports, unknown attribution, modes and
operator restarts:

1. no Annotate/Throttle/Evict (and no pod patch) in DryRun;
2. no action on stale or unknown data;
3. never an Evict before the earlier steps' delays have passed (and never
   before those steps fired);
4. a step never fires twice for one violation.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.steps import ACTIONS
from vramguard_operator.engine.types import (
    SIDE_EFFECT_DECISIONS,
    EffectivePolicy,
    EngineOutput,
    Recover,
    Warn,
)

from .builders import GI, apply, at, budget, pod, report, run

PODS = ("w0", "w1", "w2")


@dataclass
class Sample:
    t: int
    usage: dict[str, float | None]  # GiB; None: unknown attribution
    lag: int  # seconds the report is older than now
    restart: bool


@st.composite
def ladders(draw):
    actions = [a for a in ACTIONS if draw(st.booleans())] or [draw(st.sampled_from(ACTIONS))]
    delays = sorted(draw(st.lists(st.integers(0, 900), min_size=len(actions), max_size=len(actions), unique=True)))
    return [{"action": a, "after": f"{d}s"} for a, d in zip(actions, delays, strict=True)]


@st.composite
def scenarios(draw):
    ladder = draw(ladders())
    kinds = draw(st.sampled_from(["pod", "total", "both"]))
    kw = {}
    if kinds in ("pod", "both"):
        kw["per_pod"] = {"vram": "40Gi"}
    if kinds in ("total", "both"):
        kw["total"] = {"vram": "80Gi"}
    tol = draw(st.sampled_from([None, {"overshootPercent": 10, "duration": "90s"}]))
    b = budget(ladder=ladder, tolerance=tol, mode=draw(st.sampled_from(["Enforce", "DryRun"])), **kw)
    policy = EffectivePolicy(mode=draw(st.sampled_from(["Enforce", "DryRun"])))
    n = draw(st.integers(3, 25))
    t = 0
    samples = []
    level = st.one_of(st.none(), st.floats(0, 60), st.sampled_from([39.5, 40.5, 41, 45, 50]))
    for _ in range(n):
        t += draw(st.sampled_from([30, 60, 120, 300]))
        usage = {p: draw(level) for p in PODS}
        lag = draw(st.sampled_from([0, 0, 0, 5, 120]))
        samples.append(Sample(t, usage, lag, draw(st.booleans())))
    return b, policy, samples


def usage_fields(gib):
    if gib is None:
        return {"attribution": "Unknown"}
    b = int(gib * GI)
    return {"vramBytes": b, "devices": [{"uuid": "GPU-0", "usedBytes": b}]}


def through_api(budgets):
    return [GPUMemoryBudget.model_validate(b.to_api()) for b in budgets]


def drive(b, policy, samples):
    """Yield (sample, output, budgets-after) for each evaluation."""
    budgets, pods = [b], [pod(p) for p in PODS]
    for s in samples:
        live = [p for p in pods if not p.terminating]
        rep = report("node-a", at(s.t - s.lag), {p.name: usage_fields(s.usage[p.name]) for p in live})
        out = run(budgets, pods, [rep], at(s.t), policy=policy)
        yield s, out, budgets, pods
        budgets, pods = apply(out, budgets, pods)
        if s.restart:
            budgets = through_api(budgets)


def side_effects(out: EngineOutput):
    return [d for d in out.decisions if isinstance(d, SIDE_EFFECT_DECISIONS)]


PROFILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROFILE
@given(scenarios())
def test_no_action_in_dry_run(scenario):
    b, policy, samples = scenario
    dry = b.spec.enforcement.mode == "DryRun" or policy.mode == "DryRun"
    for _, out, _, _ in drive(b, policy, samples):
        if dry:
            assert side_effects(out) == []
            assert out.pod_patches == ()
            assert all(not getattr(d, "restore", ()) for d in out.decisions)


@PROFILE
@given(scenarios())
def test_no_action_on_stale_or_unknown_data(scenario):
    b, policy, samples = scenario
    for s, out, _, pods in drive(b, policy, samples):
        stale = s.lag > 60
        running = [p for p in pods if not p.terminating]
        unknown = {p.name for p in running if s.usage[p.name] is None}
        for d in side_effects(out):
            assert not stale, d
            if d.violation.pod is not None:
                assert d.pod.name not in unknown, d
            else:  # a total acts only when every member is measured
                assert not unknown, d
        if stale:
            assert not [d for d in out.decisions if not isinstance(d, Recover)]


@PROFILE
@given(scenarios())
def test_never_evict_before_the_earlier_steps(scenario):
    b, policy, samples = scenario
    ladder = {s.action: s.after_seconds() for s in b.spec.enforcement.escalation}
    fired: dict[tuple, set[str]] = {}
    for s, out, _, _ in drive(b, policy, samples):
        opened = {(v.kind, v.pod): v.opened_at for v in out.statuses[0].status.violations or ()}
        for d in out.decisions:
            key = (d.violation.kind, d.violation.pod)
            if isinstance(d, Recover):
                fired.pop(key, None)
                continue
            if isinstance(d, Warn):
                continue
            fired.setdefault(key, set()).add(d.action)
            if d.action == "Evict":
                age = (at(s.t) - opened[key]).total_seconds()
                for action, after in ladder.items():
                    assert age >= after, (d, action)
                    if action != "Evict":
                        assert action in fired[key], (d, action)


@PROFILE
@given(scenarios())
def test_a_step_never_fires_twice_for_one_violation(scenario):
    b, policy, samples = scenario
    seen: dict[tuple, set[tuple[str, str | None]]] = {}
    for _, out, _, _ in drive(b, policy, samples):
        for d in out.decisions:
            key = (d.violation.kind, d.violation.pod)
            if isinstance(d, Recover):
                seen.pop(key, None)
            elif not isinstance(d, Warn):
                step = (d.action, d.pod.name if d.pod else None)
                assert step not in seen.setdefault(key, set()), d
                seen[key].add(step)


@PROFILE
@given(scenarios())
def test_no_throttle_and_restore_for_one_pod_in_one_output(scenario):
    # the apply order in engine_types relies on it
    b, policy, samples = scenario
    for _, out, _, _ in drive(b, policy, samples):
        throttled = {d.pod.uid for d in out.decisions if d.action == "Throttle" and d.pod}
        restored = {d.pod.uid for d in out.decisions if isinstance(d, Recover) and d.restore and d.pod}
        assert not throttled & restored
