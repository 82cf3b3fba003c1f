"""DryRun (budget or cluster policy) and exempt namespaces: status and Events,
never an Annotate/Throttle/Evict decision or a pod patch."""

from __future__ import annotations

import pytest

from vramguard_operator.engine.types import SIDE_EFFECT_DECISIONS, DryRunStep, EffectivePolicy

from .builders import at, budget, pod, simulate, steps, vram

TIMELINE = [(t, {"w0": vram(41)}) for t in range(0, 901, 60)]

MODES = [
    # id, budget mode, policy, acts
    ("enforce", "Enforce", EffectivePolicy(), True),
    ("budget-dry-run", "DryRun", EffectivePolicy(), False),
    ("policy-dry-run-overrides-enforce", "Enforce", EffectivePolicy(mode="DryRun"), False),
    ("both-dry-run", "DryRun", EffectivePolicy(mode="DryRun"), False),
    ("exempt-namespace", "Enforce", EffectivePolicy(exempt_namespaces=frozenset({"ml"})), False),
    ("other-namespace-exempt", "Enforce", EffectivePolicy(exempt_namespaces=frozenset({"kube-system"})), True),
]


@pytest.mark.parametrize(("mode", "policy", "acts"), [m[1:] for m in MODES], ids=[m[0] for m in MODES])
def test_mode(mode, policy, acts):
    b = budget(per_pod={"vram": "40Gi"}, mode=mode)
    events, budgets, pods = simulate([b], [pod("w0")], TIMELINE, policy=policy)
    # the same steps at the same times either way ...
    assert steps(events) == [(0, "Annotate", "w0"), (300, "Throttle", "w0"), (600, "Evict", "w0")]
    side_effects = [d for _, d in events if isinstance(d, SIDE_EFFECT_DECISIONS)]
    if acts:
        assert len(side_effects) == 3 and pods[0].annotations
    else:
        # ... but only as Events, each saying what would have happened, and no pod change
        assert side_effects == []
        assert all(isinstance(d, DryRunStep) for _, d in events)
        assert [d.event.message.split(".")[0] for _, d in events] == [
            "dry run: would annotate",
            "dry run: would throttle",
            "dry run: would evict",
        ]
        assert pods[0].annotations == {} and pods[0].containers[0].cpu_limit == "4"
        assert not pods[0].terminating
        (v,) = budgets[0].status.violations
        assert v.step == "Evict" and v.step_time == at(600)  # the ladder is tracked in status
    status = budgets[0].status
    expected_mode = "Enforce" if mode == "Enforce" and policy.mode == "Enforce" else "DryRun"
    assert status.effective_mode == expected_mode


def test_dry_run_steps_fire_once():
    b = budget(per_pod={"vram": "40Gi"}, mode="DryRun")
    events, _, _ = simulate([b], [pod("w0")], TIMELINE + [(t, {"w0": vram(41)}) for t in range(960, 2000, 60)])
    assert len(events) == 3


def test_switching_to_dry_run_keeps_a_throttled_pod_until_recovery():
    b = budget(
        per_pod={"vram": "40Gi"}, ladder=[{"action": "Throttle", "after": "0s"}, {"action": "Evict", "after": "1m"}]
    )
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    assert pods[0].containers[0].cpu_limit == "100m"
    dry = [
        budgets[0].model_copy(
            update={
                "spec": budgets[0].spec.model_copy(
                    update={"enforcement": budgets[0].spec.enforcement.model_copy(update={"mode": "DryRun"})}
                )
            }
        )
    ]
    events, dry, pods = simulate(dry, pods, [(60, {"w0": vram(41)}), (120, {"w0": vram(10)})])
    assert steps(events) == [(60, "Evict", "w0"), (120, "Recover", "w0")]
    assert isinstance(events[0][1], DryRunStep)
    assert pods[0].containers[0].cpu_limit == "4" and pods[0].annotations == {}


SWITCHES = [
    # id, budget mode before, policy before (then: budget Enforce, default policy)
    ("budget-dry-run-to-enforce", "DryRun", EffectivePolicy()),
    ("policy-dry-run-to-enforce", "Enforce", EffectivePolicy(mode="DryRun")),
    ("exempt-to-not-exempt", "Enforce", EffectivePolicy(exempt_namespaces=frozenset({"ml"}))),
]


@pytest.mark.parametrize(("mode", "policy"), [s[1:] for s in SWITCHES], ids=[s[0] for s in SWITCHES])
def test_steps_that_only_would_have_fired_fire_once_the_budget_enforces(mode, policy):
    events, budgets, pods = simulate(
        [budget(per_pod={"vram": "40Gi"}, mode=mode)], [pod("w0")], TIMELINE, policy=policy
    )
    assert all(isinstance(d, DryRunStep) for _, d in events)
    (v,) = budgets[0].status.violations
    assert (v.step, v.dry_run) == ("Evict", True)  # reported as a step that only would have fired
    enforcing = [budgets[0].model_copy(update={"spec": budget(per_pod={"vram": "40Gi"}).spec})]
    later = [(t, {"w0": vram(41)}) for t in range(960, 1201, 60)]
    events, budgets, pods = simulate(enforcing, pods, later)
    # the due steps fire for real, one per evaluation
    assert steps(events) == [(960, "Annotate", "w0"), (1020, "Throttle", "w0"), (1080, "Evict", "w0")]
    assert not any(isinstance(d, DryRunStep) for _, d in events)
    assert pods[0].terminating and pods[0].containers[0].cpu_limit == "100m"
    (v,) = budgets[0].status.violations
    assert (v.step, v.dry_run) == ("Evict", None)


def test_real_steps_survive_a_dry_run_interlude():
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, pods = simulate([b], [pod("w0")], TIMELINE[:5])  # Annotate for real at 0
    dry = EffectivePolicy(mode="DryRun")
    events, budgets, pods = simulate(budgets, pods, TIMELINE[5:7], policy=dry)  # would throttle at 300
    assert steps(events) == [(300, "Throttle", "w0")] and isinstance(events[0][1], DryRunStep)
    events, budgets, pods = simulate(budgets, pods, TIMELINE[7:9])
    # Annotate is not repeated; Throttle, which only would have fired, fires now
    assert steps(events) == [(420, "Throttle", "w0")] and not isinstance(events[0][1], DryRunStep)
