"""Budgets against ceilings: admission checks and the effective limits of
existing budgets."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from vramguard_api.budget import GPUMemoryBudget
from vramguard_operator.policy.ceilings import check_ceilings, effective_budget
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.validation import (
    check_budget,
    format_errors,
    throttled_jobs,
    validate_budget,
    validate_pod,
)

from .builders import GI, pod, policy

CEILINGS = policy(
    "team-ceilings",
    ceilings={
        "perPod": {"vram": "80Gi", "ram": "128Gi"},
        "perDevice": {"vram": "40Gi"},
        "total": {"vram": "320Gi"},
    },
)


def budget(
    limits: dict[str, Any], ns: str = "ml", status: dict[str, Any] | None = None, **spec: Any
) -> GPUMemoryBudget:
    body: dict[str, Any] = {
        "metadata": {"name": "b", "namespace": ns, "uid": "u"},
        "spec": {"selector": {"matchLabels": {"job": "j"}}, "limits": limits, **spec},
    }
    if status is not None:
        body["status"] = status
    return GPUMemoryBudget.model_validate(body)


@pytest.mark.parametrize(
    ("limits", "paths"),
    [
        ({"perPod": {"vram": "80Gi"}}, []),  # at the ceiling is allowed
        ({"perPod": {"vram": "100Gi"}}, ["spec.limits.perPod.vram"]),
        ({"perPod": {"vram": "40Gi", "ram": "256Gi"}}, ["spec.limits.perPod.ram"]),
        ({"perDevice": {"vram": "41Gi"}}, ["spec.limits.perDevice.vram"]),
        (
            {"total": {"vram": "400Gi"}, "perPod": {"vram": "90Gi"}},
            ["spec.limits.perPod.vram", "spec.limits.total.vram"],
        ),
        ({"total": {"ram": "10Ti"}}, []),  # no total.ram ceiling
    ],
)
def test_check_ceilings_paths(limits: dict[str, Any], paths: list[str]) -> None:
    result = check_ceilings(budget(limits), merge([CEILINGS], "ml", {}))
    assert sorted(e.path for e in result.errors) == sorted(paths)


def test_message_names_the_ceiling_and_the_policy() -> None:
    errors = validate_budget(budget({"perPod": {"vram": "100Gi"}}).to_api(), [CEILINGS], {})
    assert len(errors) == 1
    assert errors[0].value == "100Gi"
    assert errors[0].message == "100Gi is above the ceiling perPod.vram 80Gi of GPUMemoryPolicy team-ceilings"
    text = format_errors("GPUMemoryBudget", "b", errors)
    assert text.startswith('GPUMemoryBudget "b" is invalid: spec.limits.perPod.vram: 100Gi is above')


def test_the_strictest_policy_is_named() -> None:
    strict = policy("strict", ceilings={"perPod": {"vram": "20Gi"}})
    errors = validate_budget(budget({"perPod": {"vram": "30Gi"}}), [CEILINGS, strict], {})
    assert [e.message for e in errors] == ["30Gi is above the ceiling perPod.vram 20Gi of GPUMemoryPolicy strict"]


def test_policies_that_do_not_apply_are_ignored() -> None:
    other = policy("other", namespaceSelector={"matchLabels": {"team": "web"}}, ceilings={"perPod": {"vram": "1Gi"}})
    assert validate_budget(budget({"perPod": {"vram": "30Gi"}}), [other], {"team": "ml"}) == []
    assert len(validate_budget(budget({"perPod": {"vram": "30Gi"}}), [other], {"team": "web"})) == 1


def test_fractions_compare_with_fractions_and_warn_across_units() -> None:
    frac = policy("frac", ceilings={"perDevice": {"fraction": 0.5}})
    assert [
        e.path for e in check_ceilings(budget({"perDevice": {"fraction": 0.75}}), merge([frac], "ml", {})).errors
    ] == ["spec.limits.perDevice.fraction"]
    mixed = check_ceilings(budget({"perDevice": {"vram": "60Gi"}}), merge([frac], "ml", {}))
    assert mixed.errors == () and "cannot be compared" in mixed.warnings[0]
    mixed2 = check_ceilings(budget({"perDevice": {"fraction": 0.9}}), merge([CEILINGS], "ml", {}))
    assert mixed2.errors == ()
    assert any("perDevice.fraction 0.9 cannot be compared" in w for w in mixed2.warnings)


def test_unset_levels_warn_that_the_ceiling_applies() -> None:
    result = check_budget(budget({"total": {"vram": "100Gi"}}), [CEILINGS], {})
    assert result.errors == ()
    joined = " | ".join(result.warnings)
    assert "spec.limits.perPod.vram is unset" in joined and "spec.limits.perDevice is unset" in joined


def test_schema_problems_are_field_errors() -> None:
    bad = budget({"perPod": {"vram": "1Gi"}}).to_api()
    bad["spec"]["limits"] = {"perPod": {"vram": "lots"}}
    errors = validate_budget(bad, [CEILINGS], {})
    assert errors and errors[0].path.startswith("spec.limits.perPod.vram")


# --- effective limits -------------------------------------------------------------


def test_effective_budget_lowers_and_adds_ceilings_consistently() -> None:
    b = budget({"perPod": {"vram": "100Gi"}, "perDevice": {"vram": "60Gi"}, "total": {"vram": "400Gi"}})
    eff, sources = effective_budget(b, merge([CEILINGS], "ml", {}))
    lim = eff.spec.limits
    assert lim.per_pod is not None and lim.per_pod.vram_bytes() == 80 * GI
    assert lim.per_pod.ram_bytes() == 128 * GI  # added: the budget left it unset
    assert lim.per_device is not None and lim.per_device.bytes_for(None) == 40 * GI
    assert lim.total is not None and lim.total.vram_bytes() == 320 * GI
    assert sources == {
        "total.vram": "policy/team-ceilings/ceiling",
        "perPod.vram": "policy/team-ceilings/ceiling",
        "perPod.ram": "policy/team-ceilings/ceiling",
        "perDevice": "policy/team-ceilings/ceiling",
    }
    assert b.spec.limits.per_pod is not None and b.spec.limits.per_pod.vram == "100Gi"  # input untouched


def test_effective_budget_keeps_what_is_below() -> None:
    b = budget({"perPod": {"vram": "10Gi"}, "perDevice": {"fraction": 0.25}})
    eff, sources = effective_budget(b, merge([policy("p", ceilings={"perDevice": {"fraction": 0.5}})], "ml", {}))
    assert eff.spec.limits.per_device is not None and eff.spec.limits.per_device.fraction == 0.25
    assert sources == {"perPod.vram": "budget", "perDevice": "budget"}


def test_lowered_total_pulls_per_pod_and_device_down() -> None:
    b = budget({"perPod": {"vram": "60Gi"}, "perDevice": {"vram": "50Gi"}, "total": {"vram": "100Gi"}})
    eff, sources = effective_budget(b, merge([policy("p", ceilings={"total": {"vram": "30Gi"}})], "ml", {}))
    lim = eff.spec.limits
    assert lim.per_pod is not None and lim.per_pod.vram_bytes() == 30 * GI
    assert lim.per_device is not None and lim.per_device.bytes_for(None) == 30 * GI
    assert sources["perPod.vram"] == sources["perDevice"] == "policy/p/ceiling"


def test_no_ceilings_means_the_budget_as_it_is() -> None:
    b = budget({"perPod": {"vram": "60Gi"}}, enforcement={"mode": "DryRun"})
    eff, sources = effective_budget(b, merge([], "ml", {}))
    assert eff.spec == b.spec and sources == {"perPod.vram": "budget"}


# --- throttled jobs and new pods ---------------------------------------------------

T = datetime(2024, 5, 1, 10, 0, tzinfo=UTC).isoformat()


def violation(kind: str, step: str | None) -> dict[str, Any]:
    v: dict[str, Any] = {"kind": kind, "observedBytes": 41 * GI, "limitBytes": 40 * GI, "since": T, "openedAt": T}
    if step:
        v["step"], v["stepTime"] = step, T
    return v


@pytest.mark.parametrize(
    ("mode", "kind", "step", "ns", "blocked"),
    [
        ("Enforce", "TotalVRAM", "Throttle", "ml", True),
        ("Enforce", "TotalRAM", "Evict", "ml", True),
        ("Enforce", "TotalVRAM", "Annotate", "ml", False),  # not throttled yet
        ("Enforce", "PodVRAM", "Throttle", "ml", False),  # one pod, not the job's total
        ("DryRun", "TotalVRAM", "Throttle", "ml", False),  # DryRun changes nothing
        ("Enforce", "TotalVRAM", "Throttle", "kube-system", False),  # exempt
    ],
)
def test_throttled_jobs(mode: str, kind: str, step: str, ns: str, blocked: bool) -> None:
    b = budget(
        {"total": {"vram": "40Gi"}},
        ns=ns,
        status={"effectiveMode": mode, "violations": [violation(kind, step)]},
    )
    jobs = throttled_jobs([b], exempt_namespaces={"kube-system"})
    assert bool(jobs) is blocked


@pytest.mark.parametrize(("stale", "blocked"), [("True", False), ("False", True), (None, True)])
def test_throttled_jobs_skip_budgets_whose_data_is_stale(stale: str | None, blocked: bool) -> None:
    # No enforcement on stale data: new pods of the job are admitted while the
    # usage behind the throttle is not known to be current.
    status: dict[str, Any] = {"effectiveMode": "Enforce", "violations": [violation("TotalVRAM", "Throttle")]}
    if stale is not None:
        status["conditions"] = [{"type": "DataStale", "status": stale, "reason": "ReportStale",
                                 "lastTransitionTime": T}]
    b = budget({"total": {"vram": "40Gi"}}, status=status)
    assert bool(throttled_jobs([b])) is blocked


def test_throttled_jobs_ignore_steps_that_only_would_have_fired() -> None:
    # A step recorded in DryRun (then the budget turned Enforce) never fired: the job is not throttled.
    would = {**violation("TotalVRAM", "Throttle"), "dryRun": True}
    b = budget({"total": {"vram": "40Gi"}}, status={"effectiveMode": "Enforce", "violations": [would]})
    assert throttled_jobs([b]) == []


def test_validate_pod_rejects_only_the_jobs_pods() -> None:
    b = budget(
        {"total": {"vram": "40Gi"}},
        status={"effectiveMode": "Enforce", "violations": [violation("TotalVRAM", "Throttle")]},
    )
    jobs = throttled_jobs([b])
    msg = validate_pod(pod("w3", labels={"job": "j"}), jobs)
    assert msg is not None
    assert "GPUMemoryBudget ml/b" in msg and "total VRAM 41Gi is above its limit 40Gi" in msg
    assert validate_pod(pod("other", labels={"job": "k"}), jobs) is None
    assert validate_pod(pod("w3", ns="web", labels={"job": "j"}), jobs) is None
    assert validate_pod(pod("w3", labels={"job": "j"}), []) is None
