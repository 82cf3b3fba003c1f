from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy

ROOT = Path(__file__).resolve().parents[3]

BUDGET = {
    "metadata": {"name": "b", "namespace": "ns"},
    "spec": {
        "selector": {"matchLabels": {"job": "x"}},
        "limits": {"perPod": {"vram": "20Gi"}, "total": {"vram": "80Gi"}},
        "enforcement": {"escalation": [{"action": "Evict", "after": "10m"}, {"action": "Annotate"}]},
    },
}


def budget_with(path: str, value):
    obj = copy.deepcopy(BUDGET)
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return obj


def test_ladder_sorted_and_defaults():
    b = GPUMemoryBudget.model_validate(BUDGET)
    assert [s.action for s in b.spec.enforcement.escalation] == ["Annotate", "Evict"]
    assert b.spec.warning_threshold == 0.85
    assert b.spec.limits.per_pod.vram_bytes() == 20 * 2**30


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.limits.total", {"vram": "10Gi"}, "perPod.vram (20Gi) must not be above total.vram (10Gi)"),
        ("spec.limits.perDevice", {"fraction": 0}, "spec.limits.perDevice.fraction\n  Input should be greater than 0"),
        (
            "spec.limits.perDevice",
            {"fraction": 1.5},
            "spec.limits.perDevice.fraction\n  Input should be less than or equal to 1",
        ),
        (
            "spec.limits.perDevice",
            {"fraction": float("nan")},
            "spec.limits.perDevice.fraction\n  Input should be a finite number",
        ),
        ("spec.warningThreshold", float("nan"), "spec.warningThreshold\n  Input should be a finite number"),
        ("spec.warningThreshold", 0, "spec.warningThreshold\n  Input should be greater than 0"),
        ("spec.limits.perDevice", {"vram": "1Gi", "fraction": 0.5}, "exactly one of vram or fraction"),
        ("spec.limits.perPod", {}, "at least one of vram or ram"),
        ("spec.limits.perPod", {"vram": "-1Gi"}, "perPod.vram"),
        (
            "spec.enforcement.escalation",
            [{"action": "Annotate", "after": "5m"}, {"action": "Evict", "after": "1m"}],
            "escalation delays must increase",
        ),
        (
            "spec.enforcement.escalation",
            [{"action": "Evict", "after": "5m"}, {"action": "Cap", "after": "10m"}],
            "escalation delays must increase along Annotate, Throttle, Cap, Evict",
        ),
        (
            "spec.enforcement.escalation",
            [{"action": "Evict", "after": "5m", "hardLimit": {"vram": "10Gi"}}],
            "hardLimit is only valid on a Cap step",
        ),
        ("spec.enforcement.softLimits", "Always", "spec.enforcement.softLimits"),
        ("spec.tolerance", {"duration": "soon"}, "tolerance.duration"),
        ("spec.warningThreshold", 1.5, "warningThreshold"),
        ("spec.limits.perPod", {"vram": "1Gi", "vramm": "1Gi"}, "vramm"),
    ],
)
def test_invalid_budget_names_field(path, value, message):
    with pytest.raises(ValidationError) as err:
        GPUMemoryBudget.model_validate(budget_with(path, value))
    assert message in str(err.value)


def test_examples_validate_against_models():
    kinds = {"GPUMemoryBudget": GPUMemoryBudget, "GPUMemoryPolicy": GPUMemoryPolicy}
    seen = set()
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] in kinds:
                kinds[doc["kind"]].model_validate(doc)
                seen.add(doc["kind"])
    assert seen == set(kinds)


def test_a_cap_sorts_between_throttle_and_evict():
    ladder = [{"action": "Evict", "after": "15m"}, {"action": "Cap", "after": "10m", "hardLimit": {"fraction": 0.3}},
              {"action": "Throttle", "after": "5m"}]
    b = GPUMemoryBudget.model_validate(budget_with("spec.enforcement.escalation", ladder))
    assert [s.action for s in b.spec.enforcement.escalation] == ["Throttle", "Cap", "Evict"]
    assert b.spec.enforcement.escalation[1].hard_limit.bytes_for(80 * 2**30) == int(0.3 * 80 * 2**30)


def test_device_limit_bytes_for_fraction():
    b = GPUMemoryBudget.model_validate(budget_with("spec.limits.perDevice", {"fraction": 0.25}))
    assert b.spec.limits.per_device.bytes_for(80 * 2**30) == 20 * 2**30
    assert b.spec.limits.per_device.bytes_for(None) is None


def test_leak_detection_watches_vram_by_default_ram_on_request_and_each_memory_once():
    from vramguard_api.budget import LeakDetection

    assert LeakDetection().memories == ["VRAM"]
    assert LeakDetection.model_validate({"memories": ["RAM", "VRAM"]}).memories == ["RAM", "VRAM"]
    for bad, words in ((["RAM", "RAM"], "duplicate memory"), ([], "at least 1"), (["Swap"], "'VRAM' or 'RAM'")):
        with pytest.raises(ValueError, match=words):
            LeakDetection.model_validate({"memories": bad})
    # one instance's list is not another's
    a = LeakDetection()
    a.memories.append("RAM")
    assert LeakDetection().memories == ["VRAM"]
