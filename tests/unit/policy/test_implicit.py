"""Implicit budgets for GPU pods that no GPUMemoryBudget selects, and the
engine evaluating them like any other budget."""

from __future__ import annotations

import json

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import ANNOTATION_MESSAGE, Annotate, EngineInput, PodFacts
from vramguard_operator.policy.implicit import (
    ANNOTATION_LIMITS,
    IMPLICIT_LABEL,
    build_implicit,
    implicit_budget,
    is_implicit,
    label_pods,
    limits_patches,
    read_limits,
)
from vramguard_operator.policy.merge import MergedPolicy, merge

from .builders import GI, MI, NOW, device, node, pod, policy

TS = node("gpu-h100-ts", [device("GPU-a", 81559, 529)])
SHARE = (81559 - 529) * MI // 4
DEFAULTS = merge([policy("cluster-default", defaults={})], "ml", {})


def gpu_pod(name: str = "p", **kw):
    kw.setdefault("resources", {"nvidia.com/gpu": "1"})
    return pod(name, node_name="gpu-h100-ts", **kw)


def test_time_sliced_pod_gets_the_node_share() -> None:
    found = implicit_budget(gpu_pod(), TS, DEFAULTS)
    assert found is not None
    b = found.budget
    assert b.metadata.name == "default:p" and is_implicit(b.metadata.uid)
    assert b.spec.selector.match_labels == {IMPLICIT_LABEL: "uid-p"}
    assert b.spec.limits.per_device is not None and b.spec.limits.per_device.bytes_for(None) == SHARE
    assert [s.action for s in b.spec.enforcement.escalation] == ["Annotate"]
    assert found.sources == {"perDevice": "node/time-slicing:4"}


def test_mode_follows_the_namespace() -> None:
    dry = merge([policy("audit", mode="DryRun", defaults={})], "ml", {})
    found = implicit_budget(gpu_pod(), TS, dry)
    assert found is not None and found.budget.spec.enforcement.mode == "DryRun"


def test_per_pod_default_caps_the_device_limit() -> None:
    merged = merge([policy("p", defaults={"perPod": {"vram": "8Gi", "ram": "32Gi"}})], "ml", {})
    found = implicit_budget(gpu_pod(), TS, merged)
    assert found is not None
    lim = found.budget.spec.limits
    assert lim.per_pod is not None and (lim.per_pod.vram_bytes(), lim.per_pod.ram_bytes()) == (8 * GI, 32 * GI)
    assert lim.per_device is not None and lim.per_device.bytes_for(None) == 8 * GI
    assert found.sources == {"perDevice": "policy/p", "perPod.vram": "policy/p", "perPod.ram": "policy/p"}


def test_declared_budget_without_any_policy() -> None:
    p = gpu_pod(resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
    found = implicit_budget(p, TS, MergedPolicy("ml"))
    assert found is not None and found.limits["perDevice"].bytes == 3000 * MI
    assert found.sources == {"perDevice": "hami/nvidia.com/gpumem"}


def test_a_declared_grant_beyond_the_api_bounds_still_gives_a_valid_budget() -> None:
    for declared, limit in (("1e12", 2**53), ("9223372036854775807", 2**53), ("3000", 3000 * MI)):
        p = gpu_pod(resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem": declared})
        found = implicit_budget(p, TS, MergedPolicy("ml"))
        assert found is not None and found.budget.spec.limits.per_device is not None
        assert found.budget.spec.limits.per_device.bytes_for(None) == limit, declared


def test_no_implicit_budget_when_nothing_limits() -> None:
    assert implicit_budget(gpu_pod(), TS, MergedPolicy("ml")) is None  # no policy, nothing declared
    assert implicit_budget(gpu_pod(resources={"cpu": "1"}), TS, DEFAULTS) is None  # no GPU
    exempt = merge([policy("p", defaults={}, exemptNamespaces=["ml"])], "ml", {})
    assert implicit_budget(gpu_pod(), TS, exempt) is None


def test_build_skips_selected_unscheduled_and_finished_pods() -> None:
    selected = gpu_pod("sel", labels={"app": "train"})
    free = gpu_pod("free")
    pending = pod("pending", resources={"nvidia.com/gpu": "1"})
    done = gpu_pod("done", phase="Succeeded")
    real = GPUMemoryBudget.model_validate(
        {
            "metadata": {"name": "train", "namespace": "ml", "uid": "u"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}, "limits": {"perPod": {"vram": "1Gi"}}},
        }
    )
    # a budget in another namespace selects nothing here
    elsewhere = real.model_copy(update={"metadata": real.metadata.model_copy(update={"namespace": "web"})})
    out = build_implicit([selected, free, pending, done], [real], {"gpu-h100-ts": TS}, {"ml": DEFAULTS})
    assert [i.pod_name for i in out] == ["free"]
    out2 = build_implicit([selected, free], [elsewhere], {"gpu-h100-ts": TS}, {"ml": DEFAULTS})
    assert [i.pod_name for i in out2] == ["sel", "free"]


def test_label_pods_only_touches_pods_with_an_implicit_budget() -> None:
    a = PodFacts("ml", "a", "uid-a", labels={"x": "1"})
    b = PodFacts("ml", "b", "uid-b")
    found = implicit_budget(gpu_pod("a"), TS, DEFAULTS)
    assert found is not None
    la, lb = label_pods([a, b], [found])
    assert la.labels == {"x": "1", IMPLICIT_LABEL: "uid-a"} and lb is b
    assert a.labels == {"x": "1"}


def test_limits_annotation_patches() -> None:
    found = implicit_budget(gpu_pod("a"), TS, DEFAULTS)
    assert found is not None
    fresh = gpu_pod("a")
    gone = gpu_pod("b", annotations={ANNOTATION_LIMITS: "{}"})
    untouched = gpu_pod("c")
    patches = limits_patches([fresh, gone, untouched], [found])
    assert set(patches) == {("ml", "a"), ("ml", "b")}
    assert patches[("ml", "b")] == {ANNOTATION_LIMITS: None}
    value = patches[("ml", "a")][ANNOTATION_LIMITS]
    assert value is not None
    data = read_limits({ANNOTATION_LIMITS: value})
    assert data["perDevice"]["source"] == "node/time-slicing:4" and data["perDevice"]["bytes"] == SHARE
    # up to date: no patch
    current = gpu_pod("a", annotations={ANNOTATION_LIMITS: value})
    assert limits_patches([current], [found]) == {}
    assert read_limits({ANNOTATION_LIMITS: "not json"}) == {}


def usage_report(used_gib: float) -> NodeGPUUsage:
    used = int(used_gib * GI)
    return NodeGPUUsage.model_validate(
        {
            "metadata": {"name": "gpu-h100-ts"},
            "spec": {"nodeName": "gpu-h100-ts"},
            "status": {
                "sampleTime": NOW.isoformat(),
                "devices": [device("GPU-a", 81559, 529)],
                "pods": [
                    {
                        "uid": "uid-p",
                        "namespace": "ml",
                        "name": "p",
                        "vramBytes": used,
                        "devices": [{"uuid": "GPU-a", "usedBytes": used}],
                    }
                ],
            },
        }
    )


def test_engine_annotates_a_pod_over_its_share() -> None:
    found = implicit_budget(gpu_pod(), TS, DEFAULTS)
    assert found is not None
    facts = label_pods([PodFacts.from_api(gpu_pod())], [found])

    def run(used_gib: float):
        return evaluate(
            EngineInput(
                budgets=(found.budget,),
                pods=facts,
                reports={"gpu-h100-ts": usage_report(used_gib)},
                now=NOW,
            )
        )

    under = run(10)
    assert not [d for d in under.decisions if isinstance(d, Annotate)]
    over = run(30)  # 30Gi on a device whose share is ~19.8Gi
    annotate = [d for d in over.decisions if isinstance(d, Annotate)]
    assert len(annotate) == 1
    assert annotate[0].pod is not None and annotate[0].pod.name == "p"
    assert annotate[0].limit_bytes == SHARE and annotate[0].violation.kind == "DeviceVRAM"
    patch = next(p for p in over.pod_patches if p.pod.name == "p")
    assert "default:p" in (patch.annotations.get(ANNOTATION_MESSAGE) or "")
    assert json.loads(patch.annotations["vramguard.io/violations"] or "[]")
