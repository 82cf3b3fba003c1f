"""The generated CRDs on a real API server: installed and Established, every
example applies, invalid budgets are rejected with a message naming the field,
printer columns and kubectl explain work. The bounds of issue 17 ("Bounds at the
door"): each hostile value is refused by the API server itself, with a message
naming the field, the value and the bound, and the models refuse the same."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy

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
    ("per-pod above total", "spec.limits.total.vram", "10Gi", "perPod.vram (20Gi) must not be above total.vram (10Gi)"),
    (
        "delays not increasing",
        "spec.enforcement.escalation.2.after",
        "1m",
        "escalation delays must increase along Annotate, Throttle, Cap, Evict",
    ),
    (
        "cap after evict",
        "spec.enforcement.escalation",
        [{"action": "Annotate"}, {"action": "Evict", "after": "15m"}, {"action": "Cap", "after": "20m"}],
        "escalation delays must increase along Annotate, Throttle, Cap, Evict",
    ),
    ("fraction zero", "spec.limits.perDevice.fraction", 0, "spec.limits.perDevice.fraction: Invalid value: 0"),
    (
        "fraction above one",
        "spec.limits.perDevice.fraction",
        1.5,
        "spec.limits.perDevice.fraction: Invalid value: 1.5: spec.limits.perDevice.fraction in body should be less "
        "than or equal to 1",
    ),
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
    (
        "hardLimit on throttle",
        "spec.enforcement.escalation.1.hardLimit",
        {"vram": "10Gi"},
        "hardLimit is only valid on a Cap step",
    ),
    ("unknown softLimits", "spec.enforcement.softLimits", "Always", "spec.enforcement.softLimits: Unsupported value"),
    ("warning threshold zero", "spec.warningThreshold", 0, "spec.warningThreshold in body should be greater than 0"),
    ("unknown mode", "spec.enforcement.mode", "Audit", "spec.enforcement.mode: Unsupported value"),
    ("evictBefore without enabled", "spec.leakDetection", {"evictBefore": "10m"}, "evictBefore requires enabled: true"),
    ("missing selector", "spec.selector", ..., "spec.selector: Required value"),
]

_ABOVE_BYTES = "is above the maximum of 8Pi (2^53 bytes"
_DAYS = "is above the maximum of 720h (30 days)"


def _bound(path: str, value: str, text: str) -> tuple[str, str, str, str]:
    """A case whose message names the field, the value and the bound."""
    return (f"{path.rsplit('.', 1)[-1]}={value}", path, value, f'{path}: Invalid value: "{value}": {value} {text}')


# Issue 17's hostile values, each refused by the API server.
BOUNDS = [
    _bound("spec.limits.perPod.vram", "1e400", _ABOVE_BYTES),
    _bound("spec.limits.perPod.vram", "2e308", _ABOVE_BYTES),
    _bound("spec.limits.perPod.vram", "1E400", _ABOVE_BYTES),
    _bound("spec.limits.perPod.vram", "1e9999999", _ABOVE_BYTES),
    _bound("spec.limits.perPod.vram", "1e99999999999", _ABOVE_BYTES),  # beyond int64: apimachinery would wrap it
    _bound("spec.limits.perPod.vram", "1.0000000000000000001e9999999", _ABOVE_BYTES),
    _bound("spec.limits.perPod.vram", "9007199254740993", _ABOVE_BYTES),
    _bound("spec.limits.perDevice.vram", "1e400", _ABOVE_BYTES),
    _bound("spec.limits.total.vram", "1e400", _ABOVE_BYTES),
    _bound("spec.limits.perPod.ram", "1e400", _ABOVE_BYTES),
    _bound(
        "spec.limits.perPod.vram",
        "10m",
        "is below the minimum of 1Mi: a VRAM or RAM limit under 1Mi is rejected as a probable typo",
    ),
    _bound("spec.limits.perPod.vram", "0", "is below the minimum of 1Mi"),
    _bound("spec.limits.perPod.vram", "0e400", "is below the minimum of 1Mi"),
    _bound("spec.limits.perPod.vram", "1e-400", "is below the minimum of 1Mi"),
    _bound("spec.limits.perPod.vram", "1048575", "is below the minimum of 1Mi"),
    _bound("spec.leakDetection.minGrowthPerHour", "1e400", _ABOVE_BYTES),
    _bound("spec.leakDetection.minGrowthPerHour", "200m", "is below the minimum of 1Mi per hour"),
    _bound("spec.enforcement.escalation[1].cpuLimit", "0", "is below the minimum of 1m"),
    _bound("spec.enforcement.escalation[1].cpuLimit", "1e400", "is above the maximum of 1024 CPUs"),
    _bound("spec.enforcement.escalation[1].cpuLimit", "1025", "is above the maximum of 1024 CPUs"),
    _bound("spec.enforcement.escalation[2].after", "99999999999999h", _DAYS),
    _bound("spec.enforcement.escalation[2].after", "2562048h", _DAYS),
    _bound("spec.enforcement.escalation[2].after", "720h0.000000001s", _DAYS),
    _bound("spec.tolerance.duration", "721h", _DAYS),
    _bound("spec.leakDetection.minWindow", "2592001s", _DAYS),
    _bound("spec.leakDetection.evictBefore", "9" * 63 + "h", _DAYS),
]

# Selectors, validated as the core API validates them.
SELECTORS = [
    (
        "key with a space",
        {"matchLabels": {"a b": "x"}},
        'spec.selector.matchLabels: Invalid value: label key "a b" is not a valid label key',
    ),
    (
        "value with a slash",
        {"matchLabels": {"a": "x/y"}},
        'spec.selector.matchLabels[a]: Invalid value: "x/y": label value "x/y" is not a valid label value',
    ),
    (
        "expression key",
        {"matchExpressions": [{"key": "-a", "operator": "Exists"}]},
        'spec.selector.matchExpressions[0].key: Invalid value: "-a": label key "-a" is not a valid label key',
    ),
    (
        "In without values",
        {"matchExpressions": [{"key": "a", "operator": "In"}]},
        "spec.selector.matchExpressions[0].values: Invalid value: values must be specified when operator is In (key a)",
    ),
    (
        "Exists with values",
        {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
        "spec.selector.matchExpressions[0].values: Invalid value: values may not be specified when operator is Exists",
    ),
    (
        "expression value",
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "not ok"]}]},
        'spec.selector.matchExpressions[0].values[1]: Invalid value: "not ok"',
    ),
    (
        "huge key",
        {"matchLabels": {"k" * 100_000: "v"}},
        "spec.selector.matchLabels: Invalid value: every key must be a valid label key",
    ),
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


def _refused(cluster: Any, obj: dict[str, Any], expected: str) -> None:
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)
    assert out.returncode != 0, "accepted"
    assert expected in out.stderr, out.stderr


def _models_refuse(model: Any, obj: dict[str, Any], field: str) -> None:
    """The pydantic models refuse the same object, at the same field."""
    with pytest.raises(ValidationError) as err:
        model.model_validate(obj)
    locs = [".".join(str(p) for p in e["loc"]) for e in err.value.errors()]
    assert any(loc.startswith(field) for loc in locs), locs


@pytest.mark.parametrize(("case", "path", "value", "expected"), BOUNDS, ids=[c[0] for c in BOUNDS])
def test_bounds_are_enforced_by_the_api_server(cluster, namespace, case, path, value, expected):
    dotted = path.replace("[", ".").replace("]", "")
    obj = mutate(namespace, dotted, value)
    obj["metadata"]["name"] = "bad"
    if dotted.startswith("spec.leakDetection"):
        obj["spec"]["leakDetection"] = {"enabled": True, **obj["spec"].get("leakDetection", {})}
    _refused(cluster, obj, expected)
    _models_refuse(GPUMemoryBudget, obj, dotted.replace("[", "."))


def test_a_one_step_ladder_is_bounded(cluster, namespace):
    obj = valid_budget(namespace, "bad")
    obj["spec"]["enforcement"]["escalation"] = [{"action": "Evict", "after": "99999999999999h"}]
    _refused(
        cluster, obj, f'spec.enforcement.escalation[0].after: Invalid value: "99999999999999h": 99999999999999h {_DAYS}'
    )


def test_a_ladder_with_a_cap_and_soft_limits_is_accepted(cluster, namespace):
    obj = valid_budget(namespace, "capped")
    obj["spec"]["enforcement"]["softLimits"] = "Share"
    obj["spec"]["enforcement"]["escalation"].insert(2, {"action": "Cap", "after": "10m", "hardLimit": {"vram": "24Gi"}})
    GPUMemoryBudget.model_validate(obj)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    got = json.loads(cluster.kubectl("get", "gmb", "capped", "-n", namespace, "-o", "json").stdout)
    assert [s["action"] for s in got["spec"]["enforcement"]["escalation"]] == ["Annotate", "Throttle", "Cap", "Evict"]


def test_values_at_the_bounds_are_accepted(cluster, namespace):
    obj = valid_budget(namespace, "edges")
    obj["spec"]["limits"] = {"perPod": {"vram": "1Mi"}, "total": {"vram": "8Pi", "ram": "9007199254740992"}}
    obj["spec"]["tolerance"] = {"duration": "720h"}
    obj["spec"]["leakDetection"] = {"enabled": True, "minGrowthPerHour": "1Mi", "minWindow": "2592000s"}
    obj["spec"]["enforcement"]["escalation"] = [
        {"action": "Throttle", "after": "0s", "cpuLimit": "1m"},
        {"action": "Evict", "after": "719h59m59.999999999s"},
    ]
    GPUMemoryBudget.model_validate(obj)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    obj["spec"]["enforcement"]["escalation"][0]["cpuLimit"] = "1024"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


@pytest.mark.parametrize(("case", "selector", "expected"), SELECTORS, ids=[c[0] for c in SELECTORS])
def test_selectors_are_validated_as_the_core_api_does(cluster, namespace, case, selector, expected):
    obj = valid_budget(namespace, "bad")
    obj["spec"]["selector"] = selector
    _refused(cluster, obj, expected)
    _models_refuse(GPUMemoryBudget, obj, "spec.selector")


def test_policy_bounds(cluster):
    policy = {
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GPUMemoryPolicy",
        "metadata": {"name": "bounds-e2e"},
        "spec": {
            "ceilings": {"perPod": {"vram": "1e400"}, "total": {"ram": "10m"}},
            "defaults": {"perDevice": {"fraction": 1.5}},
            "namespaceSelector": {"matchLabels": {"team": "a b"}},
        },
    }
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(policy), check=False)
    assert out.returncode != 0
    for expected in (
        f'spec.ceilings.perPod.vram: Invalid value: "1e400": 1e400 {_ABOVE_BYTES}',
        'spec.ceilings.total.ram: Invalid value: "10m": 10m is below the minimum of 1Mi',
        "spec.defaults.perDevice.fraction: Invalid value: 1.5",
        'spec.namespaceSelector.matchLabels[team]: Invalid value: "a b"',
    ):
        assert expected in out.stderr, out.stderr
    with pytest.raises(ValidationError) as err:
        GPUMemoryPolicy.model_validate(policy)
    assert len(err.value.errors()) == 4


def test_report_bounds(cluster):
    name = "bounds-e2e-node"
    cluster.kubectl("delete", "ngu", name, "--ignore-not-found")
    body = {
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "NodeGPUUsage",
        "metadata": {"name": name},
        "spec": {"nodeName": name},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    status = {
        "sampleTime": "2024-05-01T10:00:00Z",
        "pods": [
            {
                "uid": "u",
                "vramBytes": 2**63 - 1,
                "trend": {"windowSeconds": 60, "samples": 3, "growthBytesPerHour": 1e300},
            }
        ],
    }
    out = cluster.kubectl(
        "patch", "ngu", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}), check=False
    )
    assert out.returncode != 0
    assert "status.pods[0].vramBytes: Invalid value: 9223372036854775807: " in out.stderr
    assert "should be less than or equal to 9007199254740992" in out.stderr
    assert "status.pods[0].trend.growthBytesPerHour: Invalid value: 1e+300" in out.stderr, out.stderr
    status["pods"][0]["vramBytes"] = 2**53
    status["pods"][0]["trend"]["growthBytesPerHour"] = -(2**53)
    cluster.kubectl("patch", "ngu", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))
    cluster.kubectl("delete", "ngu", name)


def test_printer_columns(cluster, namespace):
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(valid_budget(namespace, "cols")))
    header = cluster.kubectl("get", "gmb", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "MODE", "PODS", "VRAM", "VIOLATIONS", "AGE"]
    # MODE is the mode in force (status.effectiveMode, written by the operator): here a
    # policy's DryRun over the spec's Enforce, which -o wide shows beside where it came from.
    cluster.kubectl("patch", "gmb", "-n", namespace, "cols", "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"effectiveMode": "DryRun", "modeSource": "policy/audit"}}))
    row = cluster.kubectl("get", "gmb", "-n", namespace, "cols").stdout.splitlines()[1].split()
    assert row[:2] == ["cols", "DryRun"]
    wide = cluster.kubectl("get", "gmb", "-n", namespace, "cols", "-o", "wide").stdout.splitlines()
    starts = [(m.group(), m.start()) for m in re.finditer(r"\S+", wide[0])]  # empty cells are blank: cut by header
    columns = {name: wide[1][at:(starts[i + 1][1] if i + 1 < len(starts) else None)].strip()
               for i, (name, at) in enumerate(starts)}
    assert (columns["MODE-SOURCE"], columns["SPEC-MODE"]) == ("policy/audit", "Enforce"), wide
    categories = cluster.kubectl("get", "vramguard", "-A").stdout
    assert "gpumemorybudget.vramguard.io/cols" in categories


def test_explain_shows_descriptions(cluster):
    out = cluster.kubectl("explain", "gpumemorybudget.spec").stdout
    assert "The desired budget" in out
    assert "limits" in out and "VRAM and RAM limits per pod, per device and in total" in out
    deep = cluster.kubectl("explain", "gmb.spec.limits.perDevice.fraction").stdout
    assert "usable memory (total minus reserved)" in deep
    # the bounds are in the descriptions (kubectl wraps lines)
    def explain(field: str) -> str:
        return " ".join(cluster.kubectl("explain", field).stdout.split())

    assert "at most 8Pi" in explain("gmb.spec.limits.perPod.vram")
    assert "At least 1Mi" in explain("gmp.spec.ceilings.total.ram")
    assert "At most 720h (30 days)" in explain("gmb.spec.enforcement.escalation.after")
    assert "At least 1m and at most 1024 CPUs" in explain("gmb.spec.enforcement.escalation.cpuLimit")
    assert "at most 2^53" in explain("ngu.status.pods.vramBytes")
