"""The bounds on every quantity and duration of the API: the models refuse what
the API server's CEL rules refuse, with the same message naming the field, the
value and the bound; the generated CRDs carry a rule for each (the regular
expressions inside those rules are tested in test_cel_guards.py)."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from vramguard_api import crdgen
from vramguard_api.bounds import (
    GROWTH_PER_HOUR,
    MEMORY_LIMIT,
    MIN_LIMIT_BYTES,
    THROTTLE_CPU,
    clamp_limit_bytes,
)
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.trend import TrendFeatures
from vramguard_api.units import (
    DURATION_PATTERN,
    MAX_BYTES,
    QUANTITY_PATTERN,
    quantity_decimal,
)
from vramguard_api.usage import NodeGPUUsageStatus

HOSTILE_QUANTITIES = ["1e9999999", "2e308", "1E400", "1e400", "9e999999999999999999", "1.0000000000000000001e9999999"]
MALFORMED_QUANTITIES = ["NaN", "Infinity", "-1Gi", "1_000", " 1Gi", "1e5Ki", "1" * 65]

BUDGET: dict[str, Any] = {
    "metadata": {"name": "b", "namespace": "ns"},
    "spec": {
        "selector": {"matchLabels": {"job": "x"}},
        "limits": {
            "perPod": {"vram": "20Gi", "ram": "64Gi"},
            "perDevice": {"vram": "10Gi"},
            "total": {"vram": "80Gi", "ram": "256Gi"},
        },
        "tolerance": {"duration": "2m"},
        "leakDetection": {"enabled": True, "minGrowthPerHour": "200Mi", "minWindow": "30m", "evictBefore": "10m"},
        "enforcement": {
            "escalation": [
                {"action": "Annotate", "after": "0s"},
                {"action": "Throttle", "after": "5m", "cpuLimit": "500m"},
                {"action": "Evict", "after": "15m"},
            ]
        },
    },
}
POLICY: dict[str, Any] = {
    "metadata": {"name": "p"},
    "spec": {
        "defaults": {"perPod": {"vram": "20Gi", "ram": "64Gi"}, "perDevice": {"vram": "10Gi"}},
        "ceilings": {
            "perPod": {"vram": "40Gi", "ram": "128Gi"},
            "perDevice": {"vram": "40Gi"},
            "total": {"vram": "1Ti"},
        },
    },
}

# (model, document, dotted path, the bound that applies)
QUANTITY_FIELDS = [
    (GPUMemoryBudget, BUDGET, "spec.limits.perPod.vram", MEMORY_LIMIT),
    (GPUMemoryBudget, BUDGET, "spec.limits.perPod.ram", MEMORY_LIMIT),
    (GPUMemoryBudget, BUDGET, "spec.limits.perDevice.vram", MEMORY_LIMIT),
    (GPUMemoryBudget, BUDGET, "spec.limits.total.vram", MEMORY_LIMIT),
    (GPUMemoryBudget, BUDGET, "spec.limits.total.ram", MEMORY_LIMIT),
    (GPUMemoryBudget, BUDGET, "spec.leakDetection.minGrowthPerHour", GROWTH_PER_HOUR),
    (GPUMemoryBudget, BUDGET, "spec.enforcement.escalation.1.cpuLimit", THROTTLE_CPU),
    (GPUMemoryPolicy, POLICY, "spec.defaults.perPod.vram", MEMORY_LIMIT),
    (GPUMemoryPolicy, POLICY, "spec.defaults.perPod.ram", MEMORY_LIMIT),
    (GPUMemoryPolicy, POLICY, "spec.defaults.perDevice.vram", MEMORY_LIMIT),
    (GPUMemoryPolicy, POLICY, "spec.ceilings.perPod.vram", MEMORY_LIMIT),
    (GPUMemoryPolicy, POLICY, "spec.ceilings.perPod.ram", MEMORY_LIMIT),
    (GPUMemoryPolicy, POLICY, "spec.ceilings.perDevice.vram", MEMORY_LIMIT),
    (GPUMemoryPolicy, POLICY, "spec.ceilings.total.vram", MEMORY_LIMIT),
]
DURATION_FIELDS = [
    "spec.tolerance.duration",
    "spec.leakDetection.minWindow",
    "spec.leakDetection.evictBefore",
    "spec.enforcement.escalation.0.after",
]


def with_value(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return obj


def errors(model: Any, doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(dotted location, message) of each validation error; [] when valid."""
    try:
        model.model_validate(doc)
    except ValidationError as err:
        return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in err.errors()]
    return []


def test_the_documents_are_valid():
    assert errors(GPUMemoryBudget, BUDGET) == [] and errors(GPUMemoryPolicy, POLICY) == []


# --- quantities through the models --------------------------------------------------


@pytest.mark.parametrize(("model", "doc", "path", "bound"), QUANTITY_FIELDS, ids=[f[2] for f in QUANTITY_FIELDS])
def test_every_quantity_field_refuses_hostile_values_naming_field_value_and_bound(model, doc, path, bound):
    for value in HOSTILE_QUANTITIES:
        found = errors(model, with_value(doc, path, value))
        assert found == [(path, f"Value error, {value} is above the maximum of {bound.high}")], value
    for value in MALFORMED_QUANTITIES:
        ((loc, _msg),) = errors(model, with_value(doc, path, value))
        assert loc == path, value


@pytest.mark.parametrize(("model", "doc", "path", "bound"), QUANTITY_FIELDS, ids=[f[2] for f in QUANTITY_FIELDS])
def test_every_quantity_field_takes_its_bounds_and_refuses_just_beyond(model, doc, path, bound):
    # a field that must stay below another (perDevice <= perPod <= total) is checked on its own here
    standalone = {k: v for k, v in doc.items()}
    if model is GPUMemoryBudget and path.startswith("spec.limits."):
        kind = path.split(".")[2]
        standalone = with_value(doc, "spec.limits", {kind: dict(doc["spec"]["limits"][kind])})
    for value in (bound.minimum, bound.maximum):
        assert errors(model, with_value(standalone, path, value)) == [], value
    low, high = quantity_decimal(bound.minimum), quantity_decimal(bound.maximum)
    below, above = f"{low - Decimal('1e-9'):f}", f"{high + Decimal('1e-9'):f}"
    assert errors(model, with_value(standalone, path, below)) == [
        (path, f"Value error, {below} is below the minimum of {bound.low}")
    ]
    assert errors(model, with_value(standalone, path, above)) == [
        (path, f"Value error, {above} is above the maximum of {bound.high}")
    ]


def test_a_limit_under_one_mebibyte_is_called_a_probable_typo():
    ((loc, msg),) = errors(GPUMemoryBudget, with_value(BUDGET, "spec.limits.perPod.vram", "10m"))
    assert loc == "spec.limits.perPod.vram"
    assert "10m is below the minimum of 1Mi" in msg and "probable typo" in msg and "10Mi" in msg
    # a value that apimachinery rounds up to 1Mi (more than 9 decimals) is 1Mi
    assert errors(GPUMemoryBudget, with_value(BUDGET, "spec.limits.perDevice.vram", "1048575.9999999999")) == []


def test_the_throttle_cpu_bounds():
    for value, fine in (("1m", True), ("0.001", True), ("1024", True), ("0", False), ("0.9m", False), ("1025", False)):
        found = errors(GPUMemoryBudget, with_value(BUDGET, "spec.enforcement.escalation.1.cpuLimit", value))
        assert (found == []) is fine, (value, found)


# --- durations ----------------------------------------------------------------------


@pytest.mark.parametrize("path", DURATION_FIELDS)
def test_every_duration_field_is_at_most_30_days(path):
    doc = with_value(BUDGET, "spec.enforcement.escalation", [{"action": "Evict", "after": "1s"}])
    for value in ("720h", "43200m", "2592000s", "719h59m59.999999999s"):
        assert errors(GPUMemoryBudget, with_value(doc, path, value)) == [], value
    for value in ("720h0.000000001s", "721h", "2592001s", "99999999999999h", "2562048h", "9" * 63 + "h"):
        assert errors(GPUMemoryBudget, with_value(doc, path, value)) == [
            (path, f"Value error, {value} is above the maximum of 720h (30 days)")
        ], value


@pytest.mark.parametrize("step", [0, 1, 2])
def test_every_step_of_a_full_ladder_is_bounded(step):
    path = f"spec.enforcement.escalation.{step}.after"
    assert errors(GPUMemoryBudget, with_value(BUDGET, path, "99999999999999h")) == [
        (path, "Value error, 99999999999999h is above the maximum of 720h (30 days)")
    ]


@pytest.mark.parametrize("action", ["Annotate", "Throttle", "Evict"])
def test_a_one_step_ladder_is_bounded_too(action):
    doc = with_value(BUDGET, "spec.enforcement.escalation", [{"action": action, "after": "99999999999999h"}])
    assert errors(GPUMemoryBudget, doc) == [
        ("spec.enforcement.escalation.0.after", "Value error, 99999999999999h is above the maximum of 720h (30 days)")
    ]


# --- NodeGPUUsage and generated schemas -----------------------------------------------


def _walk(node: dict[str, Any], path: str = ""):
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{path}[]")


def _schemas():
    for res in crdgen.RESOURCES:
        yield res.kind, crdgen.crd(res)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_every_quantity_and_duration_in_the_crds_has_its_bound_rules():
    seen = {"quantity": 0, "duration": 0}
    for kind, schema in _schemas():
        for path, node in _walk(schema):
            rules = " ".join(r["rule"] for r in node.get("x-kubernetes-validations", []))
            if node.get("pattern") == QUANTITY_PATTERN:
                seen["quantity"] += 1
                assert "quantity(self).compareTo" in rules and rules.count("compareTo") == 2, f"{kind}{path}"
                assert node["maxLength"] == 64
            if node.get("pattern") == DURATION_PATTERN:
                seen["duration"] += 1
                assert 'duration(self) <= duration("720h")' in rules, f"{kind}{path}"
            if path.endswith("Bytes") and node.get("type") == "integer" and kind == "NodeGPUUsage":
                assert node["maximum"] == MAX_BYTES, f"{kind}{path}"
            if "Seconds" in path.rsplit(".", 1)[-1] and kind == "NodeGPUUsage":
                assert node["maximum"] <= 2**63 / 1e9, f"{kind}{path}"
    # budgets: 5 limits, minGrowthPerHour, cpuLimit, the Cap step's hardLimit; policies: 3 defaults, 5 ceilings,
    # diagnosis.minSwap; durations: a step's after, tolerance.duration, leakDetection.minWindow, .minEvidence,
    # .evictBefore, the policy's diagnosis.idleFor
    assert seen == {"quantity": 8 + 9, "duration": 6}


def test_the_descriptions_state_the_bounds():
    for _kind, schema in _schemas():
        for path, node in _walk(schema):
            if node.get("pattern") == QUANTITY_PATTERN:
                assert "at most" in node["description"], path
            if node.get("pattern") == DURATION_PATTERN:
                assert "At most 720h (30 days)" in node["description"], path


# --- NodeGPUUsage reports -------------------------------------------------------------

REPORT: dict[str, Any] = {
    "sampleTime": "2024-05-01T10:00:00Z",
    "agent": {"version": "1", "backend": "sim", "sampleIntervalSeconds": 10},
    "devices": [{"uuid": "GPU-a", "index": 0, "memory": {"totalBytes": 2**53, "usableBytes": 2**53, "usedBytes": 0}}],
    "pods": [
        {
            "uid": "u",
            "vramBytes": 2**53,
            "ramWorkingSetBytes": 0,
            "devices": [{"uuid": "GPU-a", "usedBytes": 2**53}],
            "trend": {"windowSeconds": 7200, "samples": 120, "growthBytesPerHour": -(2**53)},
        }
    ],
}


def test_a_report_at_the_bounds_is_valid():
    assert errors(NodeGPUUsageStatus, REPORT) == []


@pytest.mark.parametrize(
    "path",
    [
        "devices.0.memory.totalBytes",
        "devices.0.memory.usableBytes",
        "devices.0.memory.usedBytes",
        "pods.0.vramBytes",
        "pods.0.ramWorkingSetBytes",
        "pods.0.devices.0.usedBytes",
    ],
)
def test_report_bytes_above_2_to_the_53_are_refused(path):
    for value in (2**53 + 1, 2**63 - 1, 10**30):
        ((loc, msg),) = errors(NodeGPUUsageStatus, with_value(REPORT, path, value))
        assert loc == path and msg == "Input should be less than or equal to 9007199254740992"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("pods.0.trend.growthBytesPerHour", 1e17),
        ("pods.0.trend.floorRiseBytes", -1e300),
        ("pods.0.trend.windowSeconds", 1e10),
        ("pods.0.trend.windowSeconds", float("nan")),
        ("agent.sampleIntervalSeconds", float("inf")),
        ("agent.sampleIntervalSeconds", 0),
    ],
)
def test_report_figures_out_of_range_are_refused(path, value):
    ((loc, _msg),) = errors(NodeGPUUsageStatus, with_value(REPORT, path, value))
    assert loc == path


def test_a_nan_trend_figure_is_unknown_as_on_the_wire():
    trend = TrendFeatures(windowSeconds=60, samples=3, growthLowBytesPerHour=float("nan"), riseSeconds=float("inf"))
    assert trend.growth_low_bytes_per_hour is None and trend.rise_seconds is None
    assert "growthLowBytesPerHour" not in trend.to_api()


def test_the_smallest_limit_constant_is_the_bound():
    assert quantity_decimal(MEMORY_LIMIT.minimum) == MIN_LIMIT_BYTES
    assert clamp_limit_bytes(0) == MIN_LIMIT_BYTES and clamp_limit_bytes(10**30) == MAX_BYTES
    assert clamp_limit_bytes(3 * 2**30) == 3 * 2**30
