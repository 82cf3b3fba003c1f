"""The device-pressure rule through ``evaluate``: what it decides, writes in
status and reports, with budgets, implicit-style budgets, DryRun, exempt
namespaces, stale and incomplete data, and over several evaluations."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.unit.engine.builders import GI, at, budget, pod
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.cli.replay_run import apply_output
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import (
    DryRunStep,
    EffectivePolicy,
    EngineInput,
    EngineOutput,
    Evict,
    HeldBudget,
    PodFacts,
    PressureRule,
)

USABLE = 80 * GI
FIVE = PressureRule(min_free_fraction=0.05, source="policy/fleet", protect_shares=False)  # minFree alone
GUARD = PressureRule(min_free_fraction=0.05, source="policy/fleet")  # and the room of pods within their shares


def shares(**kw: Any) -> GPUMemoryBudget:
    """A budget giving every pod of ``ml`` a 20Gi share per device, Annotate only."""
    return budget(
        name="shares",
        uid="uid-shares",
        selector={},
        per_device={"vram": "20Gi"},
        ladder=[{"action": "Annotate", "after": "0s"}],
        **kw,
    )


def gpu_report(t: float, used: dict[str, float], free: float, **device: Any) -> NodeGPUUsage:
    """node-a's report: GPU-0 (80Gi usable) with ``free`` GiB free, the pods' GiB on it."""
    pods = [
        {
            "uid": f"uid-{n}",
            "namespace": device.pop(f"ns_{n}", "ml"),
            "name": n,
            "vramBytes": int(g * GI),
            "devices": [{"uuid": "GPU-0", "usedBytes": int(g * GI)}],
            **device.pop(f"extra_{n}", {}),
        }
        for n, g in used.items()
    ]
    status: dict[str, Any] = {
        "sampleTime": at(t).isoformat(),
        "devices": [
            {
                "uuid": "GPU-0",
                "index": 0,
                "memory": {
                    "totalBytes": USABLE,
                    "reservedBytes": 0,
                    "usedBytes": USABLE - int(free * GI),
                    "usableBytes": USABLE,
                },
                **device.pop("fields", {}),
            }
        ],
        "pods": pods,
        **device,
    }
    return NodeGPUUsage.model_validate({"metadata": {"name": "node-a"}, "spec": {"nodeName": "node-a"}, "status": status})


def run(
    budgets: list[GPUMemoryBudget],
    pods: list[PodFacts],
    rep: NodeGPUUsage,
    t: float,
    *,
    rules: dict[str, PressureRule] | None = None,
    policy: EffectivePolicy | None = None,
    shares_by_device: dict[str, int] | None = None,
    held: dict[tuple[str, str], HeldBudget] | None = None,
) -> EngineOutput:
    return evaluate(
        EngineInput(
            budgets=tuple(budgets),
            pods=tuple(pods),
            reports={"node-a": rep},
            now=at(t),
            policy=policy or EffectivePolicy(),
            pressure_rules={"ml": FIVE} if rules is None else rules,
            device_shares=shares_by_device or {},
            held=held or {},
        )
    )


def pressure_decisions(out: EngineOutput) -> list[Any]:
    return [d for d in out.decisions if d.violation.kind == "DevicePressure"]


PODS = [pod("finetune-0"), pod("chat"), pod("embedder")]
SQUEEZED = {"finetune-0": 56.6, "chat": 15, "embedder": 5}


def test_evicts_the_pod_most_above_its_share() -> None:
    out = run([shares()], PODS, gpu_report(0, SQUEEZED, free=3.1), 0)
    [d] = pressure_decisions(out)
    assert isinstance(d, Evict) and d.pod is not None and d.pod.name == "finetune-0"
    assert d.reason == "DevicePressure" and d.budget.name == "shares"
    assert (d.observed_bytes, d.limit_bytes) == (int(56.6 * GI), 20 * GI)
    assert d.alternatives == ()
    msg = d.event.message
    assert "device GPU-0 on node-a has 3.1Gi free (under 5%: 4Gi)" in msg
    assert "evicting pod finetune-0, 36.6Gi above its share of 20Gi" in msg
    assert "to protect 2 pods within their shares" in msg
    assert d.exhausted is not None and d.exhausted.reason == "DeviceWillRunOut"
    [status] = [u.status for u in out.statuses if u.budget.name == "shares"]
    entry = status.violations[0]
    assert (entry.kind, entry.pod, entry.device, entry.step, entry.dry_run) == (
        "DevicePressure", "finetune-0", "GPU-0", "Evict", None
    )
    violating = next(c for c in status.conditions if c.type == "Violating")
    assert violating.status == "True"
    [dev] = out.devices
    assert (dev.state, dev.free_bytes, dev.min_free_bytes, dev.protected) == (
        "Act", USABLE - (USABLE - int(3.1 * GI)), 4 * GI, 2
    )


def test_nothing_with_enough_free_memory() -> None:
    out = run([shares()], PODS, gpu_report(0, SQUEEZED, free=4.5), 0)
    assert pressure_decisions(out) == []
    assert out.devices[0].state == "Clear"


def test_the_room_a_neighbour_needs_to_reach_its_share() -> None:
    """With protectShares, 4.5Gi free is not enough while embedder (5Gi of its
    20Gi share) may still need 15Gi; 15Gi free is."""
    out = run([shares()], PODS, gpu_report(0, SQUEEZED, free=4.5), 0, rules={"ml": GUARD})
    [d] = pressure_decisions(out)
    assert d.pod.name == "finetune-0"
    assert "has 4.5Gi free, less than the 15Gi pod embedder needs to reach its share of 20Gi" in d.event.message
    assert out.devices[0].min_free_bytes == 15 * GI
    assert pressure_decisions(run([shares()], PODS, gpu_report(0, SQUEEZED, free=15), 0, rules={"ml": GUARD})) == []


def test_no_rule_no_report() -> None:
    out = run([shares()], PODS, gpu_report(0, SQUEEZED, free=1), 0, rules={})
    assert pressure_decisions(out) == [] and out.devices == ()


def test_fallbacks_in_rank_order() -> None:
    used = {"finetune-0": 40, "chat": 30, "embedder": 8}
    [d] = pressure_decisions(run([shares()], PODS, gpu_report(0, used, free=2), 0))
    assert d.pod.name == "finetune-0"
    assert [a.pod.name for a in d.alternatives] == ["chat"]
    assert all(a.violation.kind == "DevicePressure" for a in d.alternatives)


def test_one_pod_per_device_until_it_is_gone() -> None:
    budgets, pods = [shares()], list(PODS)
    used = {"finetune-0": 40, "chat": 30, "embedder": 8}
    out = run(budgets, pods, gpu_report(0, used, free=2), 0)
    assert [d.pod.name for d in pressure_decisions(out)] == ["finetune-0"]
    budgets, pods = apply_output(out, budgets, pods)
    assert next(p for p in pods if p.name == "finetune-0").terminating
    # still under the threshold while finetune-0 terminates: nobody else
    for t in (5, 10, 30):
        out = run(budgets, pods, gpu_report(t, used, free=2), t)
        assert pressure_decisions(out) == []
        assert out.devices[0].state == "Waiting"
        budgets, pods = apply_output(out, budgets, pods)
        [st] = [u.status for u in out.statuses if u.budget.name == "shares"]
        assert [v.pod for v in st.violations or () if v.kind == "DevicePressure"] == ["finetune-0"]
    # finetune-0 gone, free memory still short: the next one
    pods = [p for p in pods if p.name != "finetune-0"]
    out = run(budgets, pods, gpu_report(40, {"chat": 30, "embedder": 8}, free=2), 40)
    assert [d.pod.name for d in pressure_decisions(out)] == ["chat"]


def test_never_a_pod_within_its_share() -> None:
    used = {"finetune-0": 20, "chat": 19, "embedder": 20}
    out = run([shares()], PODS, gpu_report(0, used, free=1), 0)
    assert pressure_decisions(out) == []
    assert out.devices[0].state == "NoCandidate"


def test_a_larger_budget_limit_is_the_pods_share() -> None:
    big = budget(name="big", uid="uid-big", selector={"matchLabels": {"app": "big"}}, per_device={"vram": "60Gi"})
    pods = [pod("finetune-0", labels={"app": "big"}), pod("chat", labels={})]
    out = run([big], pods, gpu_report(0, {"finetune-0": 56, "chat": 15}, free=1), 0, shares_by_device={"GPU-0": 20 * GI})
    assert pressure_decisions(out) == []  # 56Gi is within its 60Gi; chat within the node's 20Gi


def test_a_held_budget_leaves_its_namespaces_shares_unknown() -> None:
    """While a budget is held (here the 60Gi one that made finetune-0's 46Gi
    fine), which pods it selects is unknown: no pod of its namespace is chosen
    on the node's share; a pod of another namespace still is."""
    big = budget(name="big", uid="uid-big", selector={"matchLabels": {"app": "big"}}, per_device={"vram": "60Gi"})
    pods = [pod("finetune-0", labels={"app": "big"}), pod("chat", labels={}), pod("batch", ns="web", labels={})]
    used = {"finetune-0": 46, "chat": 10, "batch": 22}
    rep = gpu_report(0, used, free=1, ns_batch="web")
    rules, node_share = {"ml": FIVE, "web": FIVE}, {"GPU-0": 20 * GI}
    hold = {("ml", "big"): HeldBudget("uid-big", "InvalidSpec", "spec.limits.perDevice.vram: bad")}
    for budgets in ([big], []):  # held with its object, or its spec did not parse at all
        out = run(budgets, pods, rep, 0, rules=rules, shares_by_device=node_share, held=hold)
        [d] = pressure_decisions(out)
        assert d.pod.name == "batch" and d.limit_bytes == 20 * GI
    # without the hold, finetune-0 stands 26Gi above the node's share and goes first
    out = run([], pods, rep, 0, rules=rules, shares_by_device=node_share)
    assert [d.pod.name for d in pressure_decisions(out)] == ["finetune-0"]


def test_the_strictest_limit_is_the_share() -> None:
    big = budget(name="big", uid="uid-big", selector={}, per_device={"vram": "60Gi"})
    out = run([big, shares()], PODS, gpu_report(0, SQUEEZED, free=1), 0)
    [d] = pressure_decisions(out)
    assert d.limit_bytes == 20 * GI and d.budget.name == "shares"


def test_a_pod_no_budget_selects_has_the_nodes_share() -> None:
    pods = [pod("finetune-0", labels={}), pod("chat", labels={})]
    used = {"finetune-0": 56, "chat": 15}
    out = run([], pods, gpu_report(0, used, free=1), 0, shares_by_device={"GPU-0": 20 * GI})
    [d] = pressure_decisions(out)
    assert d.pod.name == "finetune-0" and d.limit_bytes == 20 * GI and d.budget.name == ""
    assert not d.event.message.startswith("budget")
    # without a share for the device, nobody is known to be above it
    assert pressure_decisions(run([], pods, gpu_report(0, used, free=1), 0)) == []


def test_dry_run_announces_once() -> None:
    budgets, pods = [shares(mode="DryRun")], list(PODS)
    out = run(budgets, pods, gpu_report(0, SQUEEZED, free=2), 0)
    [d] = pressure_decisions(out)
    assert isinstance(d, DryRunStep) and d.would == "Evict" and d.pod.name == "finetune-0"
    assert d.event.message.startswith("dry run: would evict.")
    assert not any(isinstance(x, Evict) for x in out.decisions)
    for t in (5, 10):
        budgets, pods = apply_output(out, budgets, pods)
        out = run(budgets, pods, gpu_report(t, SQUEEZED, free=1.5), t)
        assert pressure_decisions(out) == []
        [st] = [u.status for u in out.statuses]
        [entry] = [v for v in st.violations or () if v.kind == "DevicePressure"]
        assert entry.dry_run and entry.step_time == at(0)
    # enforcing again: evicted for real
    budgets = [b.model_copy(update={"spec": shares().spec}) for b in budgets]
    out = run(budgets, pods, gpu_report(20, SQUEEZED, free=1.5), 20)
    assert [type(d) for d in pressure_decisions(out)] == [Evict]


def test_cluster_dry_run() -> None:
    out = run([shares()], PODS, gpu_report(0, SQUEEZED, free=2), 0, policy=EffectivePolicy(mode="DryRun"))
    assert [type(d) for d in pressure_decisions(out)] == [DryRunStep]


def test_exempt_namespace_is_never_acted_on() -> None:
    out = run(
        [shares()], PODS, gpu_report(0, SQUEEZED, free=1), 0, policy=EffectivePolicy(exempt_namespaces=frozenset({"ml"}))
    )
    assert pressure_decisions(out) == [] and out.devices == ()


def test_stale_report_never_acts() -> None:
    out = run([shares()], PODS, gpu_report(-120, SQUEEZED, free=1), 0)
    assert pressure_decisions(out) == []


def test_incomplete_data_never_acts() -> None:
    cases = [
        {"fields": {"processesComplete": False}},
        {"fields": {"health": "Lost"}},
        {"truncated": True},
        {"unattributed": [{"pid": 7, "device": "GPU-0", "usedBytes": GI, "reason": "no pod"}]},
        {"extra_chat": {"attribution": "Unknown"}},
    ]
    for extra in cases:
        out = run([shares()], PODS, gpu_report(0, SQUEEZED, free=1, **extra), 0)
        assert pressure_decisions(out) == [], extra
        assert out.devices[0].state == "Unknown" and out.devices[0].reason


def test_a_budgets_override_is_more_protective() -> None:
    strict = shares().model_copy(deep=True)
    strict.spec.device_pressure = type(strict.spec).model_validate(
        {**strict.spec.model_dump(by_alias=True), "devicePressure": {"minFree": "10%", "protectShares": False}}
    ).device_pressure
    out = run([strict], PODS, gpu_report(0, SQUEEZED, free=6), 0)
    [d] = pressure_decisions(out)
    assert "under 10%: 8Gi" in d.event.message
    assert pressure_decisions(run([shares()], PODS, gpu_report(0, SQUEEZED, free=6), 0)) == []


def test_waits_for_a_pod_the_ladder_evicts_in_the_same_evaluation() -> None:
    ladder = budget(
        name="ladder",
        uid="uid-ladder",
        selector={"matchLabels": {"app": "emb"}},
        per_pod={"vram": "4Gi"},
        ladder=[{"action": "Evict", "after": "0s"}],
    )
    pods = [pod("finetune-0"), pod("chat"), pod("embedder", labels={"app": "emb"})]
    out = run([ladder, shares()], pods, gpu_report(0, SQUEEZED, free=1), 0)
    evicts = [d for d in out.decisions if isinstance(d, Evict)]
    assert [(d.pod.name, d.violation.kind) for d in evicts] == [("embedder", "PodVRAM")]
    assert out.devices[0].state == "Waiting"


def test_a_terminating_pod_holding_memory_blocks_a_second() -> None:
    pods = [replace(PODS[0], terminating=True), *PODS[1:]]
    used = {"finetune-0": 40, "chat": 30, "embedder": 8}
    assert pressure_decisions(run([shares()], pods, gpu_report(0, used, free=1), 0)) == []
