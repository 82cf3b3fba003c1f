"""Guarantees: soft limits at each pod's share (``softLimits: Share``, from the
budget or the policy), written in ``vramguard.io/memory-limits`` for pods
within their limits too, never above a hard limit, never in DryRun or exempt
namespaces, only where the device can hold them, kept on unknown data."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard_api.memlimits import parse_memory_limits
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import (
    ANNOTATION_MEMORY_LIMITS,
    SIDE_EFFECT_DECISIONS,
    EffectivePolicy,
    EngineInput,
)

from .builders import GI, NS, apply, at, budget, pod, run, vram
from .test_caps import LADDER, device, limits_of, node_report


def share_budget(soft: str | None = "Share", **kw: Any):
    b = budget(per_device={"vram": "20Gi"}, **kw)
    if soft is None:
        return b
    spec = b.spec.model_copy(update={"enforcement": b.spec.enforcement.model_copy(update={"soft_limits": soft})})
    return b.model_copy(update={"spec": spec})


def once(budgets, pods, usage, *, t: float = 0, devices=None, policy=None, **status):
    out = run(budgets, pods, [node_report(t, usage, devices, **status)], at(t), policy=policy)
    return out, apply(out, budgets, pods)[1]


def test_a_pod_within_its_share_gets_its_soft_limit_and_nothing_else():
    out, pods = once([share_budget()], [pod("w0")], {"w0": vram(5)})
    assert limits_of(pods[0]) == {"GPU-0": {"softLimit": 20 * GI}}
    assert not [d for d in out.decisions if isinstance(d, SIDE_EFFECT_DECISIONS)]
    # settled: the next evaluation writes nothing
    again, _ = once([share_budget()], pods, {"w0": vram(6)}, t=30)
    assert again.pod_patches == ()


@pytest.mark.parametrize(
    ("own", "policy_share", "written"),
    [("Share", False, True), (None, True, True), ("Off", True, False), (None, False, False)],
    ids=["budget", "policy", "budget-off-overrides-policy", "neither"],
)
def test_the_budget_decides_else_the_policy(own, policy_share, written):
    policy = EffectivePolicy(soft_limits=policy_share)
    _, pods = once([share_budget(own)], [pod("w0")], {"w0": vram(5)}, policy=policy)
    assert bool(limits_of(pods[0])) == written


@pytest.mark.parametrize(
    "policy",
    [EffectivePolicy(mode="DryRun", soft_limits=True), EffectivePolicy(exempt_namespaces=frozenset({NS}))],
    ids=["dry-run", "exempt"],
)
def test_no_soft_limit_where_vramguard_does_not_act(policy):
    _, pods = once([share_budget()], [pod("w0")], {"w0": vram(5)})
    out, after = once([share_budget()], pods, {"w0": vram(5)}, t=30, policy=policy)
    assert [p.annotations[ANNOTATION_MEMORY_LIMITS] for p in out.pod_patches] == [None]
    assert limits_of(after[0]) == {}


def test_only_devices_that_can_hold_limits_get_them():
    devices = [device(support="Unsupported", reason="NotSupported"), device("GPU-1", 1)]
    usage = {"vramBytes": 10 * GI, "devices": [{"uuid": "GPU-0", "usedBytes": 5 * GI},
                                               {"uuid": "GPU-1", "usedBytes": 5 * GI}]}
    _, pods = once([share_budget()], [pod("w0")], {"w0": usage}, devices=devices)
    assert limits_of(pods[0]) == {"GPU-1": {"softLimit": 20 * GI}}
    agent = {"version": "1", "backend": "sim", "sampleIntervalSeconds": 5, "enforceCaps": False}
    _, pods = once([share_budget()], [pod("w0")], {"w0": vram(5)}, agent=agent)
    assert limits_of(pods[0]) == {}


def test_unknown_data_keeps_the_soft_limits():
    _, pods = once([share_budget()], [pod("w0")], {"w0": vram(5)})
    out = run([share_budget()], pods, [node_report(0, {"w0": vram(5)})], at(600))  # stale report
    assert out.pod_patches == () and [dict(m.limits) for m in out.memory_limits] == [
        parse_memory_limits(pods[0].annotations[ANNOTATION_MEMORY_LIMITS])
    ]


def test_the_share_is_a_grant_on_a_named_device():
    b = share_budget()
    inp = EngineInput(
        budgets=(b,),
        pods=(pod("w0"),),
        reports={"node-a": node_report(0, {"w0": vram(5)})},
        now=at(0),
        device_limits={b.metadata.uid or "": {"GPU-0": 12 * GI}},
    )
    (patch,) = evaluate(inp).pod_patches
    assert parse_memory_limits(patch.annotations[ANNOTATION_MEMORY_LIMITS])["GPU-0"].soft_limit == 12 * GI


def test_a_per_pod_limit_is_the_share_of_a_pod_on_one_device_only():
    b = budget(per_pod={"vram": "30Gi"})
    b = b.model_copy(update={"spec": b.spec.model_copy(update={"enforcement": b.spec.enforcement.model_copy(
        update={"soft_limits": "Share"})})})
    _, pods = once([b], [pod("w0")], {"w0": vram(5)})
    assert limits_of(pods[0]) == {"GPU-0": {"softLimit": 30 * GI}}
    two = {"vramBytes": 10 * GI, "devices": [{"uuid": "GPU-0", "usedBytes": 5 * GI},
                                             {"uuid": "GPU-1", "usedBytes": 5 * GI}]}
    _, pods = once([b], [pod("w1")], {"w1": two}, devices=[device(), device("GPU-1", 1)])
    assert limits_of(pods[0]) == {}


def test_the_soft_limit_never_exceeds_the_hard_limit():
    loose = share_budget(name="share", uid="uid-share")
    loose = loose.model_copy(update={"spec": loose.spec.model_copy(
        update={"limits": loose.spec.limits.model_copy(update={"per_device": loose.spec.limits.per_device.model_copy(
            update={"vram": "60Gi"})})})})
    tight = budget(name="tight", uid="uid-tight", per_pod={"vram": "40Gi"}, ladder=LADDER)
    budgets, pods = [loose, tight], [pod("w0")]
    for t, n in ((0, 45), (120, 45), (180, 43)):
        out = run(budgets, pods, [node_report(t, {"w0": vram(n)})], at(t))
        budgets, pods = apply(out, budgets, pods)
    assert limits_of(pods[0]) == {"GPU-0": {"hardLimit": 43 * GI, "softLimit": 43 * GI}}
