"""The reconcile loop's pure parts: policies per namespace, status notes,
invalid budgets, settings; the full pass (``full_pass``, the reference for
incremental evaluation: test_incremental_equivalence.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_operator.controller.settings import OperatorConfig
from vramguard_operator.engine.types import EngineConfig
from vramguard_operator.plan.entries import Versioned, budget_entry
from vramguard_operator.plan.full_pass import Snapshot, plan, scope_of
from vramguard_operator.plan.status_notes import invalid_status, note_resize_errors
from vramguard_operator.policy.groups import namespace_policies

from ..engine.builders import budget, pod, report, vram
from ..policy.builders import stale_policy
from .test_indexes import budget_body

NOW = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def policy(name: str, **spec) -> GPUMemoryPolicy:
    return GPUMemoryPolicy.model_validate({"metadata": {"name": name}, "spec": spec})


def test_without_policies_kube_system_is_exempt_and_mode_is_enforce():
    pols = namespace_policies({}, {}, ["ml"])
    assert pols["ml"].effective.mode == "Enforce"
    assert pols["ml"].effective.exempt_namespaces == frozenset()
    assert pols["ml"].scopes == ("",)
    system = namespace_policies({}, {}, ["kube-system"])["kube-system"]
    assert system.effective.exempt_namespaces == frozenset({"kube-system"})


def test_a_dry_run_policy_applies_only_where_its_selector_matches():
    pols = namespace_policies(
        {
            "audit": policy("audit", mode="DryRun", namespaceSelector={"matchLabels": {"audit": "on"}},
                            exemptNamespaces=["gpu-operator"]),
            "all": policy("all", exemptNamespaces=["batch"]),
        },
        {"ml": {"audit": "on"}, "web": {}, "batch": {"audit": "on"}},
        ["ml", "web", "batch"],
    )
    assert pols["ml"].effective.mode == "DryRun"
    assert pols["web"].effective.mode == "Enforce"
    # an exemption holds whichever policy selects the namespace (the safe side)
    assert pols["web"].effective.exempt_namespaces == frozenset()
    assert pols["batch"].effective.exempt_namespaces == frozenset({"batch"})
    assert pols["ml"].scopes == ("all", "audit")
    assert pols["web"].scopes == ("all",)


def test_an_unknown_namespace_matches_only_selector_free_policies():
    pols = namespace_policies(
        {"sel": policy("sel", mode="DryRun", namespaceSelector={"matchLabels": {"a": "b"}})}, {}, ["x"]
    )
    assert pols["x"].effective.mode == "Enforce" and pols["x"].scopes == ("",)


def test_a_policy_that_cannot_be_evaluated_holds_every_namespace_in_dry_run_and_exempt():
    audit = stale_policy("audit", {"key": "audit", "operator": "In", "values": []}, mode="DryRun")
    pols = namespace_policies({"audit": audit, "all": policy("all")}, {"ml": {"audit": "on"}}, ["ml", "web"])
    for ns in ("ml", "web"):
        assert pols[ns].effective.mode == "DryRun"
        assert pols[ns].effective.exempt_namespaces == frozenset({ns})
    # a policy whose spec does not parse (pydantic) likewise
    pols = namespace_policies({"all": policy("all")}, {}, ["ml"], invalid={"typo": "spec.mode: bad"})
    assert pols["ml"].effective.mode == "DryRun"
    assert pols["ml"].effective.exempt_namespaces == frozenset({"ml"})
    # fixed: enforcement resumes
    assert namespace_policies({"all": policy("all")}, {}, ["ml"])["ml"].effective.mode == "Enforce"


def test_plan_holds_every_group_in_dry_run_while_a_policy_does_not_parse():
    from vramguard_operator.plan.entries import policy_entry

    snap = Snapshot()
    snap.budgets["a"] = [entry(budget(ns="a", per_pod={"vram": "10Gi"}))]
    snap.pods["a"] = [pod_entry_of(pod("w0", ns="a"))]
    bad = policy_entry({"metadata": {"name": "typo", "uid": "u"},
                        "spec": {"evictionRateLimit": {"perMinute": -1}}})
    assert isinstance(bad.value, str)
    snap.policies["typo"] = bad
    assert snap.invalid_policies() == {"typo": bad.value}
    work = plan(snap, NOW, EngineConfig())
    (group,) = work.groups
    assert group.policy.mode == "DryRun" and group.policy.exempt_namespaces == frozenset({"a"})
    snap.policies.clear()
    (group,) = plan(snap, NOW, EngineConfig()).groups
    assert group.policy.mode == "Enforce"


def entry(b):
    return Versioned(b.metadata.uid or "", "1", budget_entry(b.to_api()).value)


def pod_entry_of(p):
    return Versioned(p.uid, "1", p)


def test_scope_is_namespaces_with_budgets_or_vramguard_state():
    from dataclasses import replace

    snap = Snapshot()
    snap.budgets["ml"] = [entry(budget(per_pod={"vram": "10Gi"}))]
    snap.pods["ml"] = [pod_entry_of(pod("w0"))]
    snap.pods["web"] = [pod_entry_of(pod("x", ns="web"))]
    snap.pods["old"] = [pod_entry_of(replace(pod("y", ns="old"), annotations={"vramguard.io/original-cpu": "{}"}))]
    assert scope_of(snap) == ["ml", "old"]


def test_plan_groups_namespaces_by_effective_policy_and_holds_invalid_budgets():
    # issue 17 (item 2): an invalid budget is held on its own; its namespace is
    # evaluated (it used to be left out of every group)
    snap = Snapshot()
    snap.budgets["a"] = [entry(budget(ns="a", per_pod={"vram": "10Gi"}))]
    snap.budgets["b"] = [entry(budget(ns="b", per_pod={"vram": "10Gi"}))]
    snap.budgets["c"] = [entry(budget(ns="c", per_pod={"vram": "10Gi"}))]
    body = budget_body(limits={"perPod": {"vram": "20Gi"}, "total": {"vram": "10Gi"}})
    body["metadata"]["namespace"] = "d"
    bad = budget_entry(body)
    snap.budgets["d"] = [bad]
    for ns in "abcd":
        snap.pods[ns] = [pod_entry_of(pod("w0", ns=ns))]
    rep = report("node-a", NOW, {"w0": vram(12)}, ns="a")
    snap.reports["node-a"] = Versioned("r", "1", rep)
    snap.policies["audit"] = Versioned("p", "1", policy(
        "audit", mode="DryRun", namespaceSelector={"matchLabels": {"audit": "on"}}))
    snap.namespaces.update({"b": {"audit": "on"}})
    work = plan(snap, NOW, EngineConfig())
    groups = {g.policy.mode: g for g in work.groups}
    assert sorted(groups["Enforce"].namespaces) == ["a", "c", "d"]
    assert groups["DryRun"].namespaces == ["b"]
    assert [p.namespace for p in groups["DryRun"].input.pods] == ["b"]
    assert groups["Enforce"].input.reports["node-a"] is rep
    assert [e.value.name for e in work.invalid] == ["train"]
    enforce = groups["Enforce"].input
    assert [(b.metadata.namespace, b.metadata.name) for b in enforce.budgets] == [("a", "train"), ("c", "train")]
    held = enforce.held[("d", "train")]
    assert (held.uid, held.reason) == (bad.uid, "InvalidSpec") and "total.vram" in held.message
    assert work.policies["b"].scopes == ("audit",)


def test_resize_errors_are_noted_on_throttled_violations_once():
    st = GPUMemoryBudgetStatus.model_validate({"violations": [
        {"kind": "PodVRAM", "pod": "w0", "observedBytes": 2, "limitBytes": 1, "since": NOW.isoformat(),
         "openedAt": NOW.isoformat(), "step": "Throttle", "message": "VRAM 2 > 1"},
        {"kind": "PodVRAM", "pod": "w1", "observedBytes": 2, "limitBytes": 1, "since": NOW.isoformat(),
         "openedAt": NOW.isoformat(), "step": "Annotate", "message": "VRAM 2 > 1"},
    ]})
    errs = {"w0": "resize refused: HTTP 422 Invalid: no", "w1": "resize refused: other"}
    noted = note_resize_errors(st, errs)
    assert noted.violations[0].message == "VRAM 2 > 1; resize refused: HTTP 422 Invalid: no"
    assert noted.violations[1].message == "VRAM 2 > 1"  # not throttled: nothing to say
    assert note_resize_errors(noted, errs) == noted


def test_invalid_status_says_why_and_keeps_the_escalation_state():
    e = budget_entry(budget_body(
        limits={"perPod": {"vram": "20Gi"}, "total": {"vram": "10Gi"}},
        status={"openViolations": 1, "conditions": [
            {"type": "Violating", "status": "True", "reason": "LimitExceeded",
             "lastTransitionTime": "2024-05-01T09:00:00Z"}]},
    )).value
    st = invalid_status(e, NOW)
    ready = next(c for c in st.conditions or () if c.type == "Ready")
    assert (ready.status, ready.reason, ready.observed_generation) == ("False", "InvalidSpec", 3)
    assert "perPod.vram" in ready.message
    assert st.open_violations == 1
    assert [c.type for c in st.conditions or ()] == ["Ready", "Violating"]


def test_config_from_env_reads_durations_and_names_bad_values():
    cfg = OperatorConfig.from_env({"VRAMGUARD_EVALUATION_PERIOD": "1s", "VRAMGUARD_FRESHNESS": "2m",
                                   "VRAMGUARD_EVICTION_BURST": "7"})
    assert (cfg.evaluation_period, cfg.freshness, cfg.default_rate_limit.burst) == (1.0, 120.0, 7)
    assert cfg.engine().freshness_seconds == 120.0
    with pytest.raises(ValueError, match="VRAMGUARD_DEBOUNCE"):
        OperatorConfig.from_env({"VRAMGUARD_DEBOUNCE": "soon"})
    with pytest.raises(ValueError, match="VRAMGUARD_EVICTION_BURST"):
        OperatorConfig.from_env({"VRAMGUARD_EVICTION_BURST": "-1"})


def test_soft_limits_of_a_policy_reach_the_engine_and_split_the_groups():
    pols = namespace_policies(
        {"guard": policy("guard", softLimits="Share", namespaceSelector={"matchLabels": {"guard": "on"}})},
        {"ml": {"guard": "on"}, "web": {}},
        ["ml", "web"],
    )
    assert pols["ml"].effective.soft_limits and not pols["web"].effective.soft_limits
    assert pols["ml"].effective != pols["web"].effective  # evaluated in separate groups
