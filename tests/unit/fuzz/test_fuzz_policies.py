"""Hostile GPUMemoryPolicies next to a canary (issue 17, item 7). No exception
escapes. A policy is cluster-scoped: one that applies to the canary's
namespace (its selector matches, or it lists the namespace as exempt) changes
the canary legitimately, and one that does not parse holds every namespace in
DryRun by design (it may be the policy that keeps a namespace from
enforcement: docs/policy.md); both are counted apart. Every other policy
leaves the canary exactly as when alone."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_api.policy import GPUMemoryPolicy
from vramguard_operator.engine.types import EngineConfig
from vramguard_operator.plan.entries import policy_entry
from vramguard_operator.policy.merge import policy_applies

from .harness import CANARY_NS, canary_part, canary_snapshot, fuzz_settings, run, tally
from .strategies import DELETE, JUNK, fraction, mostly, mutated_from, quantity, selector

pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("ignore::UserWarning")]
ALONE = canary_part(run(canary_snapshot(), EngineConfig()))

often_valid = st.one_of(st.sampled_from(["20Gi", "1Mi", "8Pi", "512Mi"]), quantity())
memory = st.fixed_dictionaries({}, optional={"vram": often_valid, "ram": often_valid})
TEMPLATE = {
    "namespaceSelector": {"matchLabels": {"team": "hostile"}},
    "mode": "Enforce",
    "exemptNamespaces": ["kube-system"],
    "defaults": {"perPod": {"vram": "20Gi"}},
    "ceilings": {"perPod": {"vram": "60Gi"}},
    "evictionRateLimit": {"perMinute": 2, "burst": 2},
}
LEAVES = {
    "namespaceSelector": st.one_of(selector(), st.just(DELETE), st.just({"matchLabels": {"team": "canary"}}),
                                   st.just({"matchExpressions": [{"key": "team", "operator": "NotIn",
                                                                  "values": ["canary"]}]})),
    "mode": st.sampled_from(["Enforce", "DryRun", "Off"]),
    "exemptNamespaces": st.one_of(st.lists(st.sampled_from(["h1", "kube-system", CANARY_NS, "", "x" * 70]),
                                           max_size=3), JUNK),
    "defaults.perPod": memory,
    "defaults.perDevice": st.one_of(st.just({"fraction": 0.5}), st.fixed_dictionaries(
        {}, optional={"vram": often_valid, "fraction": fraction()})),
    "defaults.shareFromNode": st.one_of(st.booleans(), JUNK),
    "ceilings.perPod": memory,
    "ceilings.total": memory,
    "evictionRateLimit.perMinute": st.one_of(st.integers(-1, 10**6), JUNK),
    "evictionRateLimit.burst": st.one_of(st.integers(-1, 10**6), JUNK),
}
TEMPLATES = [
    TEMPLATE,
    {**TEMPLATE, "mode": "DryRun"},
    {**TEMPLATE, "exemptNamespaces": ["h1", "h2"]},
    {**TEMPLATE, "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In",
                                                              "values": ["hostile", "other"]}]}},
    {k: v for k, v in TEMPLATE.items() if k != "namespaceSelector"},  # every namespace: the canary's too
    {**TEMPLATE, "namespaceSelector": {"matchLabels": {"team": "canary"}}, "mode": "DryRun"},
]
# well-formed policies as they are, with one field changed, or with up to three
spec = st.one_of(
    st.sampled_from(TEMPLATES),
    mutated_from(TEMPLATES, LEAVES, most=1),
    mutated_from(TEMPLATES, LEAVES, most=3),
)


@given(st.lists(mostly(spec, JUNK), min_size=1, max_size=2, unique_by=str))
@fuzz_settings()
def test_policies(specs: list[Any]) -> None:
    snap = canary_snapshot()
    applies_to_canary, broken = False, False
    for i, s in enumerate(specs):
        body = {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryPolicy",
                "metadata": {"name": f"p{i}", "uid": f"uid-p{i}", "resourceVersion": "1"}, "spec": s}
        entry = policy_entry(body)
        snap.policies[f"p{i}"] = entry
        if isinstance(entry.value, GPUMemoryPolicy):
            p = entry.value
            try:
                applies_to_canary |= (CANARY_NS in p.spec.exempt_namespaces
                                      or policy_applies(p, CANARY_NS, snap.namespaces[CANARY_NS]))
            except ValueError:
                broken = True  # a selector the engine cannot evaluate: held like a broken policy
        else:
            broken = True
    try:
        outs = run(snap, EngineConfig())
    except Exception:
        tally("policies", "escaped exceptions")
        raise
    tally("policies", "inputs")
    if broken:
        tally("policies", "a policy that cannot be evaluated (every namespace held in DryRun, by design)")
    elif applies_to_canary:
        tally("policies", "a policy applying to the canary's namespace")
    elif canary_part(outs) != ALONE:
        tally("policies", "canary differences")
        raise AssertionError("a policy that does not apply to the canary's namespace changed it")
    else:
        tally("policies", "the canary as alone")
