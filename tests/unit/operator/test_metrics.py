"""The operator's Prometheus metrics, read back from a registry of their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_operator.controller.metrics import Metrics

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def status(*violations: tuple[str, bool]) -> GPUMemoryBudgetStatus:
    return GPUMemoryBudgetStatus.model_validate(
        {
            "violations": [
                {
                    "kind": kind,
                    "pod": f"p{i}",
                    "observedBytes": 2,
                    "limitBytes": 1,
                    "since": T0.isoformat(),
                    **({"openedAt": T0.isoformat()} if opened else {}),
                }
                for i, (kind, opened) in enumerate(violations)
            ]
        }
    )


def test_actions_are_counted_by_action_result_and_namespace():
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.action("Evict", "blocked", "ml")
    m.action("Evict", "blocked", "ml")
    m.action("Evict", "success", "ml")
    get = reg.get_sample_value
    assert get("vramguard_actions_total", {"action": "Evict", "result": "blocked", "namespace": "ml"}) == 2
    assert get("vramguard_actions_total", {"action": "Evict", "result": "success", "namespace": "ml"}) == 1


def test_violation_gauges_follow_the_status_and_vanish_with_the_budget():
    reg = CollectorRegistry()
    m = Metrics(reg)
    get = reg.get_sample_value
    labels = {"namespace": "ml", "budget": "train"}
    m.set_budget_violations("ml", "train", status(("PodVRAM", True), ("PodVRAM", True), ("TotalRAM", True),
                                                  ("PodRAM", False)))
    assert get("vramguard_budget_violations", {"kind": "PodVRAM", **labels}) == 2
    assert get("vramguard_budget_violations", {"kind": "TotalRAM", **labels}) == 1
    assert get("vramguard_budget_violations", {"kind": "PodRAM", **labels}) is None  # pending: not open
    m.set_budget_violations("ml", "train", status(("PodVRAM", True)))
    assert get("vramguard_budget_violations", {"kind": "TotalRAM", **labels}) is None
    assert get("vramguard_budget_violations", {"kind": "PodVRAM", **labels}) == 1
    m.forget_budgets(keep=[], namespaces=["other"])  # another namespace: kept
    assert get("vramguard_budget_violations", {"kind": "PodVRAM", **labels}) == 1
    m.forget_budgets(keep=[], namespaces=["ml"])
    assert b"vramguard_budget_violations{" not in generate_latest(reg)


def test_report_ages_are_set_per_node_and_dropped_with_the_report():
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.set_report_ages({"n1": T0, "n2": T0 - timedelta(seconds=30), "n3": None}, T0 + timedelta(seconds=5))
    assert reg.get_sample_value("vramguard_node_report_age_seconds", {"node": "n1"}) == 5
    assert reg.get_sample_value("vramguard_node_report_age_seconds", {"node": "n2"}) == 35
    assert reg.get_sample_value("vramguard_node_report_age_seconds", {"node": "n3"}) is None
    m.set_report_ages({"n1": T0}, T0)
    assert reg.get_sample_value("vramguard_node_report_age_seconds", {"node": "n2"}) is None


def test_decision_latency_is_a_histogram_in_seconds():
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.observe_latency(0.03)
    m.observe_latency(-1)  # clock skew: clamped
    assert reg.get_sample_value("vramguard_decision_latency_seconds_count") == 2
    assert reg.get_sample_value("vramguard_decision_latency_seconds_bucket", {"le": "0.05"}) == 2
    assert reg.get_sample_value("vramguard_decision_latency_seconds_bucket", {"le": "0.025"}) == 1


def test_usage_ratio_and_leak_series_follow_warnings_and_violations():
    reg = CollectorRegistry()
    m = Metrics(reg)
    get = reg.get_sample_value
    st = GPUMemoryBudgetStatus.model_validate(
        {
            "warnings": [{"kind": "PodVRAM", "pod": "a", "observedBytes": 90, "limitBytes": 100, "since": T0.isoformat()}],
            "violations": [
                {"kind": "TotalVRAM", "observedBytes": 300, "limitBytes": 200, "since": T0.isoformat(), "openedAt": T0.isoformat()},
                {"kind": "Leak", "pod": "b", "observedBytes": 10, "limitBytes": 1, "since": T0.isoformat(), "openedAt": T0.isoformat()},
                {"kind": "RAMLeak", "pod": "c", "observedBytes": 10, "limitBytes": 1, "since": T0.isoformat(), "openedAt": T0.isoformat()},
            ],
        }
    )
    m.set_budget_violations("ml", "train", st)
    ratio = {"namespace": "ml", "budget": "train"}
    assert get("vramguard_budget_usage_ratio", {**ratio, "pod": "a", "resource": "PodVRAM"}) == 0.9
    assert get("vramguard_budget_usage_ratio", {**ratio, "pod": "", "resource": "TotalVRAM"}) == 1.5
    assert get("vramguard_budget_usage_ratio", {**ratio, "pod": "b", "resource": "Leak"}) is None  # not a ratio
    assert get("vramguard_leak_suspected", {**ratio, "pod": "b", "memory": "VRAM"}) == 1
    assert get("vramguard_leak_suspected", {**ratio, "pod": "c", "memory": "RAM"}) == 1
    assert get("vramguard_leak_suspected", {**ratio, "pod": "c", "memory": "VRAM"}) is None
    m.forget_budgets(keep=[], namespaces=["ml"])
    assert b"vramguard_budget_usage_ratio{" not in generate_latest(reg)
    assert b"vramguard_leak_suspected{" not in generate_latest(reg)


def test_memory_limit_gauges_count_pods_per_namespace_and_kind():
    from vramguard_api.memlimits import DeviceMemoryLimit
    from vramguard_operator.engine.types import PodMemoryLimits, PodRef

    reg = CollectorRegistry()
    m = Metrics(reg)
    capped = PodMemoryLimits(PodRef("ml", "a", "u-a"), {"GPU-0": DeviceMemoryLimit(0, 40 << 30)}, ("GPU-0",))
    shared = PodMemoryLimits(PodRef("ml", "b", "u-b"), {"GPU-0": DeviceMemoryLimit(20 << 30, None)})
    both = PodMemoryLimits(PodRef("ml", "c", "u-c"), {"GPU-1": DeviceMemoryLimit(20 << 30, 30 << 30)})
    m.set_memory_limits(["ml", "other"], [capped, shared, both])
    get = reg.get_sample_value
    assert get("vramguard_pod_memory_limits", {"namespace": "ml", "limit": "hard"}) == 2
    assert get("vramguard_pod_memory_limits", {"namespace": "ml", "limit": "soft"}) == 2
    assert get("vramguard_pod_memory_limits_not_held", {"namespace": "ml"}) == 1
    assert get("vramguard_pod_memory_limits", {"namespace": "other", "limit": "hard"}) is None
    m.set_memory_limits(["other"], [])  # another group's namespaces: ml's series stay
    assert get("vramguard_pod_memory_limits", {"namespace": "ml", "limit": "hard"}) == 2
    m.set_memory_limits(["ml"], [shared])
    assert get("vramguard_pod_memory_limits", {"namespace": "ml", "limit": "hard"}) is None
    assert get("vramguard_pod_memory_limits_not_held", {"namespace": "ml"}) is None
    assert get("vramguard_pod_memory_limits", {"namespace": "ml", "limit": "soft"}) == 1
