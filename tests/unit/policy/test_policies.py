"""Which policies apply to a namespace, and the strictest-wins merge."""

from __future__ import annotations

import pytest

from vramguard_operator.policy.merge import (
    MergedPolicy,
    exempt_by,
    merge,
    overridden_fields,
    policy_applies,
    policy_status,
)

from .builders import GI, NOW, policy, stale_policy

TEAM = {"team": "ml"}


@pytest.mark.parametrize(
    ("spec", "ns", "labels", "applies"),
    [
        ({}, "anything", {}, True),
        ({}, "kube-system", {}, False),  # exempt by default
        ({"exemptNamespaces": []}, "kube-system", {}, True),
        ({"namespaceSelector": {"matchLabels": TEAM}}, "a", TEAM, True),
        ({"namespaceSelector": {"matchLabels": TEAM}}, "a", {"team": "web"}, False),
        ({"namespaceSelector": {"matchLabels": TEAM}, "exemptNamespaces": ["a"]}, "a", TEAM, False),
        # the API server's own name label is assumed even when the caller omits it
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["b"]}]
                }
            },
            "b",
            {},
            True,
        ),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}},
            "c",
            {},
            True,
        ),
    ],
)
def test_policy_applies(spec: dict, ns: str, labels: dict, applies: bool) -> None:
    assert policy_applies(policy("p", **spec), ns, labels) is applies


def test_malformed_selector_names_the_policy() -> None:
    bad = stale_policy("broken", {"key": "k", "operator": "In"})
    with pytest.raises(ValueError, match="GPUMemoryPolicy broken: spec.namespaceSelector"):
        policy_applies(bad, "a", {})
    # merge skips it instead of failing for the other policies, and holds the
    # namespace in DryRun: where it applies cannot be known (fail safe)
    merged = merge([bad, policy("ok")], "a", {})
    assert merged.policies == ("ok",)
    assert merged.effective_mode == "DryRun" and merged.mode is not None
    assert merged.mode.policy == "broken"
    assert merged.invalid == ("GPUMemoryPolicy broken: spec.namespaceSelector.matchExpressions[0]: "
                              "operator In needs values (key 'k')",)


def test_a_broken_dry_run_policy_holds_every_namespace_in_dry_run() -> None:
    # The audit policy meant for team=x has a selector with an empty In list; the
    # namespaces it cannot be matched against must not fall back to Enforce.
    audit = stale_policy("audit", {"key": "team", "operator": "In", "values": []}, mode="DryRun")
    enforce = policy("all", mode="Enforce")
    for ns, labels in (("ml", {"team": "x"}), ("web", {})):
        assert merge([audit, enforce], ns, labels).effective_mode == "DryRun"
    # A policy whose spec does not parse at all counts the same way.
    merged = merge([enforce], "ml", {}, invalid={"typo": "GPUMemoryPolicy typo: spec.mode: bad"})
    assert merged.effective_mode == "DryRun" and merged.invalid == ("GPUMemoryPolicy typo: spec.mode: bad",)
    assert merge([enforce], "ml", {}).effective_mode == "Enforce" and merge([enforce], "ml", {}).invalid == ()


def test_exemption_is_a_union_over_every_policy() -> None:
    # "sandbox" is exempt by policy a even though a's selector does not select it
    a = policy("a", namespaceSelector={"matchLabels": TEAM}, exemptNamespaces=["sandbox"])
    b = policy("b")
    assert exempt_by([a, b], "sandbox") == "a"
    assert merge([a, b], "sandbox", {}).exempt
    assert not merge([a, b], "other", {}).exempt
    assert exempt_by([], "kube-system") == "default"
    assert exempt_by([], "ml") is None


CEIL = {
    "a": policy("a", ceilings={"perPod": {"vram": "40Gi", "ram": "64Gi"}, "total": {"vram": "160Gi"}}),
    "b": policy("b", ceilings={"perPod": {"vram": "30Gi"}, "total": {"vram": "200Gi", "ram": "1Ti"}}),
    "c": policy("c", ceilings={"perPod": {"vram": "30Gi"}}, namespaceSelector={"matchLabels": {"x": "y"}}),
}


@pytest.mark.parametrize(
    ("field", "value", "winner"),
    [
        ("ceiling_pod_vram", 30 * GI, "b"),  # smallest wins
        ("ceiling_pod_ram", 64 * GI, "a"),  # only a sets it
        ("ceiling_total_vram", 160 * GI, "a"),
        ("ceiling_total_ram", 1024 * GI, "b"),
        ("ceiling_device_vram", None, None),
    ],
)
def test_ceilings_smallest_wins_per_field(field: str, value: int | None, winner: str | None) -> None:
    merged = merge(list(CEIL.values()), "ml", {})
    got = getattr(merged, field)
    assert ((got.value, got.policy) if got else (None, None)) == (value, winner)
    assert merged.policies == ("a", "b")  # c's selector does not match


def test_ties_go_to_the_first_name() -> None:
    merged = merge(
        [policy("z", ceilings={"perPod": {"vram": "8Gi"}}), policy("m", ceilings={"perPod": {"vram": "8Gi"}})], "ml", {}
    )
    assert merged.ceiling_pod_vram is not None and merged.ceiling_pod_vram.policy == "m"


@pytest.mark.parametrize(
    ("modes", "mode", "winner"),
    [
        ({"a": "Enforce", "b": "Enforce"}, "Enforce", "a"),
        ({"a": "Enforce", "b": "DryRun"}, "DryRun", "b"),
        ({"a": "DryRun", "b": "DryRun"}, "DryRun", "a"),
        ({}, "Enforce", None),
    ],
)
def test_dry_run_wins(modes: dict[str, str], mode: str, winner: str | None) -> None:
    merged = merge([policy(n, mode=m) for n, m in modes.items()], "ml", {})
    assert merged.effective_mode == mode
    assert (merged.mode.policy if merged.mode else None) == winner


def test_defaults_and_share_from_node() -> None:
    a = policy("a", defaults={"perDevice": {"vram": "20Gi"}, "perPod": {"vram": "60Gi"}})
    b = policy("b", defaults={"perDevice": {"fraction": 0.5}})
    c = policy("c", defaults={"shareFromNode": True})
    d = policy("d", defaults={"shareFromNode": False})
    e = policy("e")  # no defaults at all: contributes none
    merged = merge([a, b, c, d, e], "ml", {})
    assert merged.default_device_vram is not None and merged.default_device_vram.value == 20 * GI
    assert merged.default_device_fraction is not None and merged.default_device_fraction.policy == "b"
    # a and b set perDevice, which replaces their own node share; c asks for it
    assert merged.share_from_node is not None and merged.share_from_node.policy == "c"
    assert merged.default_pod_vram is not None and merged.default_pod_vram.value == 60 * GI
    assert merged.has_defaults
    assert not merge([d, e], "ml", {}).has_defaults


def test_eviction_rate_limit_and_caps() -> None:
    a = policy("a", evictionRateLimit={"perMinute": 10, "burst": 1}, injectFrameworkCaps=False)
    b = policy("b", evictionRateLimit={"perMinute": 3, "burst": 5}, injectFrameworkCaps=True)
    merged = merge([a, b], "ml", {})
    assert (merged.eviction_per_minute.value, merged.eviction_per_minute.policy) == (3, "b")  # type: ignore[union-attr]
    assert (merged.eviction_burst.value, merged.eviction_burst.policy) == (1, "a")  # type: ignore[union-attr]
    assert merged.inject_framework_caps is not None and merged.inject_framework_caps.policy == "b"
    assert merge([a], "ml", {}).inject_framework_caps is None


def test_merged_ceilings_map_and_empty_policy() -> None:
    merged = merge([policy("a", ceilings={"perDevice": {"fraction": 0.5}})], "ml", {})
    assert set(merged.ceilings()) == {"perDevice.fraction"}
    assert MergedPolicy("ml").effective_mode == "Enforce" and not MergedPolicy("ml").exempt


def test_overridden_fields_name_the_winner() -> None:
    a = policy("a", mode="DryRun", ceilings={"perPod": {"vram": "30Gi"}})
    b = policy("b", ceilings={"perPod": {"vram": "40Gi"}, "total": {"vram": "1Ti"}})
    merged = merge([a, b], "ml", {})
    assert overridden_fields(b, merged) == ["mode: policy/a", "ceilings.perPod.vram: policy/a"]
    assert overridden_fields(a, merged) == []


def test_policy_status_lists_namespaces_and_overrides() -> None:
    a = policy("a", ceilings={"perPod": {"vram": "30Gi"}})
    b = policy("b", namespaceSelector={"matchLabels": TEAM}, ceilings={"perPod": {"vram": "40Gi"}})
    namespaces = {"ml": TEAM, "web": {}, "kube-system": {}}
    st_b = policy_status(b, [a, b], namespaces, NOW)
    assert st_b.matched_namespaces == 1 and st_b.namespaces == ["ml"]
    assert st_b.overridden == ["ceilings.perPod.vram in ml: policy/a"]
    assert st_b.conditions and st_b.conditions[0].status == "True"
    st_a = policy_status(a, [a, b], namespaces, NOW)
    assert st_a.namespaces == ["ml", "web"] and st_a.overridden is None


def test_policy_status_invalid_selector() -> None:
    bad = stale_policy("bad", {"key": "k", "operator": "Exists", "values": ["v"]})
    st = policy_status(bad, [bad], {"ml": {}}, NOW)
    assert st.conditions and st.conditions[0].reason == "InvalidSpec"
    assert "takes no values" in st.conditions[0].message
    assert "spec.namespaceSelector.matchExpressions[0]" in st.conditions[0].message
    assert "held in DryRun" in st.conditions[0].message
    # with no namespace to match (or only ones it exempts) it is still reported
    for namespaces in ({}, {"ml": {}}):
        lone = stale_policy("bad", {"key": "k", "operator": "In", "values": []}, exemptNamespaces=["ml"])
        st = policy_status(lone, [lone], namespaces, NOW)
        assert st.conditions and (st.conditions[0].status, st.conditions[0].reason) == ("False", "InvalidSpec")


def test_soft_limits_share_wins_when_any_applying_policy_asks() -> None:
    off = policy("a", softLimits="Off")
    share = policy("b", softLimits="Share", namespaceSelector={"matchLabels": {"team": "ml"}})
    assert merge([off, share], "ml", {"team": "ml"}).soft_limits is not None
    assert merge([off, share], "ml", {"team": "ml"}).soft_limits.policy == "b"  # type: ignore[union-attr]
    assert merge([off, share], "web", {}).soft_limits is None  # b does not select web
    assert merge([off], "ml", {}).soft_limits is None
