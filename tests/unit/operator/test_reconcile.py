"""The reconcile loop's pure parts: policies per namespace, status notes,
invalid budgets, settings (what is evaluated together: test_incremental.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_operator.controller.indexes import budget_entry
from vramguard_operator.controller.planning import invalid_status, namespace_policies, note_resize_errors
from vramguard_operator.controller.settings import OperatorConfig

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
