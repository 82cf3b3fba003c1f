"""The generated CRDs on a real API server: installed and Established, every
example applies, invalid budgets are rejected with a message naming the field,
printer columns and kubectl explain work."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def valid_budget(namespace: str, name: str = "b") -> dict[str, Any]:
    return {
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GPUMemoryBudget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"job-name": "train"}},
            "limits": {"perPod": {"vram": "20Gi"}, "perDevice": {"fraction": 0.25}, "total": {"vram": "80Gi"}},
            "enforcement": {
                "escalation": [
                    {"action": "Annotate", "after": "0s"},
                    {"action": "Throttle", "after": "5m", "cpuLimit": "500m"},
                    {"action": "Evict", "after": "15m"},
                ]
            },
        },
    }


def mutate(namespace: str, path: str, value: Any) -> dict[str, Any]:
    """A valid budget with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    obj = copy.deepcopy(valid_budget(namespace))
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    if value is ...:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return obj


# (case, path to change, new value, text the API server's message must contain)
INVALID = [
    ("per-pod above total", "spec.limits.total.vram", "10Gi", "perPod.vram must not be above total.vram"),
    (
        "delays not increasing",
        "spec.enforcement.escalation.2.after",
        "1m",
        "escalation delays must increase along Annotate, Throttle, Evict",
    ),
    ("fraction zero", "spec.limits.perDevice.fraction", 0, "spec.limits.perDevice.fraction: Invalid value"),
    ("fraction above one", "spec.limits.perDevice.fraction", 1.5, "fraction must be in (0, 1]"),
    ("no limit set", "spec.limits", {}, "at least one of perPod, perDevice or total must be set"),
    ("empty per-pod limit", "spec.limits.perPod", {}, "spec.limits.perPod: Invalid value"),
    ("device vram and fraction", "spec.limits.perDevice.vram", "10Gi", "exactly one of vram or fraction must be set"),
    ("negative quantity", "spec.limits.perPod.vram", "-1Gi", "spec.limits.perPod.vram"),
    ("malformed quantity", "spec.limits.total.vram", "80GB", "spec.limits.total.vram"),
    ("wrong type", "spec.tolerance", {"overshootPercent": "ten"}, "spec.tolerance.overshootPercent"),
    ("unknown field", "spec.limits.perPod.vramm", "1Gi", 'unknown field "spec.limits.perPod.vramm"'),
    (
        "malformed selector",
        "spec.selector",
        {"matchExpressions": [{"key": "a", "operator": "Like"}]},
        "spec.selector.matchExpressions[0].operator",
    ),
    ("malformed duration", "spec.tolerance", {"duration": "5 minutes"}, "spec.tolerance.duration"),
    (
        "cpuLimit on annotate",
        "spec.enforcement.escalation.0.cpuLimit",
        "1",
        "cpuLimit is only valid on a Throttle step",
    ),
    ("warning threshold zero", "spec.warningThreshold", 0, "warningThreshold must be in (0, 1]"),
    ("unknown mode", "spec.enforcement.mode", "Audit", "spec.enforcement.mode: Unsupported value"),
    ("evictBefore without enabled", "spec.leakDetection", {"evictBefore": "10m"}, "evictBefore requires enabled: true"),
    ("missing selector", "spec.selector", ..., "spec.selector: Required value"),
]


def test_crds_established(cluster):
    out = json.loads(cluster.kubectl("get", "crd", "-o", "json").stdout)
    ours = {c["metadata"]["name"]: c for c in out["items"] if c["spec"]["group"] == "vramguard.io"}
    assert set(ours) == {
        "gpumemorybudgets.vramguard.io",
        "gpumemorypolicies.vramguard.io",
        "nodegpuusages.vramguard.io",
    }
    for crd in ours.values():
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds["Established"] == "True" and conds.get("NonStructuralSchema") is None


def test_examples_apply(cluster):
    out = cluster.kubectl("apply", "-f", str(ROOT / "crds"), "-f", str(ROOT / "examples"))
    assert "gpumemorybudget.vramguard.io/llama-finetune" in out.stdout
    assert "gpumemorypolicy.vramguard.io/cluster-default" in out.stdout
    got = json.loads(cluster.kubectl("get", "gmb", "-n", "ml-training", "llama-finetune", "-o", "json").stdout)
    # the API server applied the schema's defaults
    assert got["spec"]["warningThreshold"] == 0.85
    assert got["spec"]["tolerance"] == {"overshootPercent": 10, "duration": "2m"}


def test_valid_budget_accepted(cluster, namespace):
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(valid_budget(namespace)))


@pytest.mark.parametrize(("case", "path", "value", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_budget_rejected(cluster, namespace, case, path, value, expected):
    obj = mutate(namespace, path, value)
    obj["metadata"]["name"] = "bad"
    out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert out.returncode != 0, f"{case}: accepted"
    assert expected in out.stderr, out.stderr
    assert cluster.kubectl("get", "gmb", "-n", namespace, "bad", check=False).returncode != 0


def test_printer_columns(cluster, namespace):
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(valid_budget(namespace, "cols")))
    header = cluster.kubectl("get", "gmb", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "MODE", "PODS", "VRAM", "VIOLATIONS", "AGE"]
    row = cluster.kubectl("get", "gmb", "-n", namespace, "cols").stdout.splitlines()[1].split()
    assert row[:2] == ["cols", "Enforce"]
    categories = cluster.kubectl("get", "vramguard", "-A").stdout
    assert "gpumemorybudget.vramguard.io/cols" in categories


def test_explain_shows_descriptions(cluster):
    out = cluster.kubectl("explain", "gpumemorybudget.spec").stdout
    assert "The desired budget" in out
    assert "limits" in out and "VRAM and RAM limits per pod, per device and in total" in out
    deep = cluster.kubectl("explain", "gmb.spec.limits.perDevice.fraction").stdout
    assert "usable memory (total minus reserved)" in deep
