"""The policy side of device pressure: policies merged (the most protective
threshold wins), each namespace's rule, the node's share of each device, and
implicit budgets for pods no budget selects under a pressure rule."""

from __future__ import annotations

from vramguard_operator.engine.types import PodFacts, PressureRule
from vramguard_operator.policy.inputs import prepare
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.pressure import device_shares, namespace_rule

from .builders import GI, MI, device, node, pod, policy

TS = node("gpu-h100-ts", [device("GPU-a", 81559, 579), device("GPU-b", 81559, 579)])


def test_no_rule_without_a_policy_that_sets_one() -> None:
    assert namespace_rule(merge([policy("p", defaults={})], "ml", {})) is None


def test_the_largest_percentage_and_quantity_win() -> None:
    merged = merge(
        [
            policy("a", devicePressure={"minFree": "5%"}),
            policy("b", devicePressure={"minFree": "8%"}),
            policy("c", devicePressure={"minFree": "2Gi"}),
            policy("d", devicePressure={"minFree": "1Gi"}),
        ],
        "ml",
        {},
    )
    rule = namespace_rule(merged)
    assert rule == PressureRule(0.08, 2 * GI, "Evict", "policy/b")
    assert rule.min_free(80 * GI) == int(80 * GI * 0.08)
    assert rule.min_free(10 * GI) == 2 * GI


def test_shares_are_protected_when_any_policy_asks() -> None:
    off = policy("a", devicePressure={"protectShares": False})
    assert not namespace_rule(merge([off], "ml", {})).protect_shares  # type: ignore[union-attr]
    assert namespace_rule(merge([off, policy("b", devicePressure={})], "ml", {})).protect_shares  # type: ignore[union-attr]


def test_a_policy_that_does_not_apply_sets_nothing() -> None:
    p = policy("gpu", devicePressure={}, namespaceSelector={"matchLabels": {"gpu": "yes"}})
    assert namespace_rule(merge([p], "ml", {})) is None
    assert namespace_rule(merge([p], "ml", {"gpu": "yes"})) == PressureRule(0.05, None, "Evict", "policy/gpu")


def test_exempt_namespaces_have_no_rule() -> None:
    p = policy("p", devicePressure={}, exemptNamespaces=["sys"])
    assert namespace_rule(merge([p], "sys", {})) is None


def test_a_pressure_rule_without_defaults_gives_the_nodes_share() -> None:
    assert merge([policy("p", devicePressure={})], "ml", {}).share_from_node is not None
    assert merge([policy("p")], "ml", {}).share_from_node is None
    # an explicit perDevice default replaces the share, as without the rule
    explicit = policy("p", devicePressure={}, defaults={"perDevice": {"vram": "10Gi"}})
    assert merge([explicit], "ml", {}).share_from_node is None


def test_implicit_budgets_under_a_pressure_rule_alone() -> None:
    raw = [pod("chat", node_name="gpu-h100-ts", resources={"nvidia.com/gpu": "1"})]
    pods = [PodFacts.from_api(p) for p in raw]
    merged = {"ml": merge([policy("p", devicePressure={"minFree": "5%"})], "ml", {})}
    view = prepare([], pods, raw, {"gpu-h100-ts": TS}, merged)
    [implicit] = view.budgets
    assert implicit.metadata.name == "default:chat"
    assert implicit.spec.limits.per_device is not None
    assert implicit.spec.limits.per_device.bytes_for(None) == (81559 - 579) * MI // 4
    assert view.pressure_rules == {"ml": PressureRule(0.05, None, "Evict", "policy/p")}
    assert view.device_shares == {"GPU-a": (81559 - 579) * MI // 4, "GPU-b": (81559 - 579) * MI // 4}


def test_device_shares_of_mig_and_vgpu_devices() -> None:
    mig = node(
        "gpu-a100-mig",
        [device("GPU-p", 40960, 570), device("MIG-1", 19968, 0, mig_profile="3g.20gb")],
    )
    vgpu = node("gpu-a10-vgpu", [device("GPU-v", 23028, 1536, virtualization="VGPU")])
    shares = device_shares({"m": mig, "v": vgpu})
    assert shares["MIG-1"] == 19968 * MI
    assert shares["GPU-v"] == (23028 - 1536) * MI
