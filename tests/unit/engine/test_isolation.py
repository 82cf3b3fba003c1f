"""One budget that cannot be evaluated holds only itself (issue 17, item 2): it is
Ready=False naming the field and the value (or the error), its escalation state
is kept as it is, it is reported as an ObjectProblem, and every other budget,
namespace and pod is evaluated exactly as if it were absent."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard_api.budget import EscalationStep, GPUMemoryBudget
from vramguard_api.limits import DeviceLimit, MemoryLimit
from vramguard_operator.engine import evaluate as evaluate_module
from vramguard_operator.engine.types import (
    ANNOTATION_ORIGINAL_CPU,
    EngineInput,
    EngineOutput,
    HeldBudget,
    Recover,
)

from .builders import at, budget, pod, report, run, simulate, vram

CANARY_NS = "canary"


def canary() -> GPUMemoryBudget:
    return budget(name="canary", ns=CANARY_NS, uid="uid-canary", per_pod={"vram": "10Gi"})


def canary_pod() -> Any:
    return pod("c0", ns=CANARY_NS, node="node-c")


def canary_report(t: float) -> Any:
    return report("node-c", at(t), {"c0": vram(12)}, ns=CANARY_NS)


def of_canary(out: EngineOutput) -> tuple[Any, ...]:
    """The canary's part of an output: its decisions, pod patches and status."""
    return (
        [d for d in out.decisions if d.budget.namespace == CANARY_NS],
        [p for p in out.pod_patches if p.pod.namespace == CANARY_NS],
        [s for s in out.statuses if s.budget.namespace == CANARY_NS],
    )


def hostile(name: str, **spec: Any) -> GPUMemoryBudget:
    """A budget of namespace ml whose spec holds what the API no longer admits
    (stored under an older CRD), built without validation."""
    b = budget(name=name, uid=f"uid-{name}", per_pod={"vram": "40Gi"})
    for path, value in spec.items():
        target: Any = b.spec
        *parents, last = path.split(".")
        for p in parents:
            target = getattr(target, p)
        setattr(target, last, value)
    return b


HOSTILE = [
    ("huge-vram", {"limits.per_pod": MemoryLimit.model_construct(vram="1e400", ram=None)},
     "spec.limits.perPod.vram: 1e400 is above the maximum of 8Pi"),
    ("tiny-vram", {"limits.per_pod": MemoryLimit.model_construct(vram="10m", ram=None)},
     "spec.limits.perPod.vram: 10m is below the minimum of 1Mi"),
    ("huge-device", {"limits.per_device": DeviceLimit.model_construct(vram="2e308", fraction=None)},
     "spec.limits.perDevice.vram: 2e308 is above"),
    ("nan-fraction", {"limits.per_device": DeviceLimit.model_construct(vram=None, fraction=float("nan"))},
     "spec.limits.perDevice.fraction: nan is not a fraction"),
    ("long-step", {"enforcement.escalation": [EscalationStep.model_construct(
        action="Annotate", after="99999999999999h", cpu_limit=None)]},
     "spec.enforcement.escalation[0].after: 99999999999999h is above the maximum of 720h"),
    ("zero-cpu", {"enforcement.escalation": [EscalationStep.model_construct(
        action="Throttle", after="0s", cpu_limit="0")]},
     "spec.enforcement.escalation[0].cpuLimit: 0 is below the minimum of 1m"),
    ("zero-threshold", {"warning_threshold": 0.0}, "spec.warningThreshold: 0.0 is not a fraction"),
]


@pytest.mark.parametrize(("name", "spec", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_spec_beyond_the_bounds_holds_its_budget_only(name, spec, message):
    bad = hostile(name, **spec)
    good = budget(name="zz-good", uid="uid-good", per_pod={"vram": "40Gi"})  # same namespace, after it
    pods = [pod("w0"), canary_pod()]
    reports = [report("node-a", at(0), {"w0": vram(41)}), canary_report(0)]
    out = run([bad, good, canary()], pods, reports, at(0))
    alone = run([good, canary()], pods, reports, at(0))
    assert of_canary(out) == of_canary(alone)
    assert [d for d in out.decisions if d.budget.name == "zz-good"] == [
        d for d in alone.decisions if d.budget.name == "zz-good"]
    st = {s.budget.name: s.status for s in out.statuses}[name]
    ready = {c.type: c for c in st.conditions or ()}["Ready"]
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert ready.message.startswith(message), ready.message
    (problem,) = [p for p in out.object_problems if p.name == name]
    assert (problem.kind, problem.reason, problem.uid) == ("GPUMemoryBudget", "InvalidSpec", f"uid-{name}")


def test_a_budget_whose_evaluation_raises_is_held_and_the_others_go_on(monkeypatch):
    real = evaluate_module.evaluate_budget

    def buggy(b: GPUMemoryBudget, *args: Any, **kw: Any) -> Any:
        if b.metadata.name == "bug":
            raise OverflowError("int too large to convert to float")
        return real(b, *args, **kw)

    monkeypatch.setattr(evaluate_module, "evaluate_budget", buggy)
    bug = budget(name="bug", uid="uid-bug", per_pod={"vram": "40Gi"})
    pods = [pod("w0"), canary_pod()]
    reports = [report("node-a", at(0), {"w0": vram(41)}), canary_report(0)]
    out = run([bug, canary()], pods, reports, at(0))
    alone = run([canary()], pods, reports, at(0))
    assert of_canary(out) == of_canary(alone) and of_canary(out)[0]
    assert not [d for d in out.decisions if d.budget.name == "bug"]
    st = {s.budget.name: s.status for s in out.statuses}["bug"]
    ready = st.conditions[0]
    assert (ready.status, ready.reason) == ("False", "EvaluationFailed")
    assert "OverflowError: int too large" in ready.message
    assert [p.reason for p in out.object_problems] == ["EvaluationFailed"]


def throttled_state() -> tuple[list[GPUMemoryBudget], list[Any]]:
    """Budget train has throttled w0 (its record and original CPU on the pod)."""
    b = budget(per_pod={"vram": "40Gi"})
    _, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)}), (300, {"w0": vram(41)})])
    assert ANNOTATION_ORIGINAL_CPU in pods[0].annotations
    return budgets, pods


def test_a_held_budget_keeps_its_state_as_it_is():
    budgets, pods = throttled_state()
    held = {("ml", "train"): HeldBudget("uid-train", "EvaluationTimeout", "took too long")}
    for given in (budgets, []):  # in the input (a timeout), or not (its spec does not parse)
        out = evaluate_module.evaluate(EngineInput(
            budgets=tuple(given), pods=tuple(pods), reports={"node-a": report("node-a", at(600), {"w0": vram(1)})},
            now=at(600), held=held))
        # usage is back under the limit, but nothing is decided for a held budget:
        # no Recover, no restore, no Evict; the pod's annotations stay as they are
        assert out.decisions == () and out.pod_patches == ()
        assert [(p.reason, p.name) for p in out.object_problems] == [("EvaluationTimeout", "train")]
    st = evaluate_module.evaluate(EngineInput(
        budgets=tuple(budgets), pods=tuple(pods), reports={}, now=at(600), held=held)).statuses[0].status
    ready = {c.type: c for c in st.conditions or ()}
    assert (ready["Ready"].status, ready["Ready"].reason, ready["Ready"].message) == (
        "False", "EvaluationTimeout", "took too long")
    assert "Violating" in ready  # the other conditions and the violations are kept
    assert st.violations == budgets[0].status.violations


def test_without_the_hold_a_vanished_budget_is_closed():
    """The contrast: a budget that is absent (deleted) closes its records and restores."""
    budgets, pods = throttled_state()
    out = run([], pods, [report("node-a", at(600), {"w0": vram(41)})], at(600))
    (rec,) = out.decisions
    assert isinstance(rec, Recover) and rec.cause == "BudgetDeleted" and rec.restore
