"""Policies applied to one evaluation: clamped budgets, implicit budgets,
finished statuses; and the policy handlers' pure entries."""

from __future__ import annotations

from typing import Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_operator.controller.kubeapi import merge_patch
from vramguard_operator.engine.types import BudgetRef, BudgetStatusUpdate, PodFacts
from vramguard_operator.plan.entries import gpu_pod_entry
from vramguard_operator.policy.implicit import ANNOTATION_LIMITS, IMPLICIT_LABEL
from vramguard_operator.policy.inputs import finish, limit_patches, prepare
from vramguard_operator.policy.merge import merge

from .builders import GI, device, node, pod, policy

TS = node("gpu-h100-ts", [device("GPU-a", 81559, 529)])


def budget(name: str, limits: dict[str, Any], mode: str = "Enforce") -> GPUMemoryBudget:
    return GPUMemoryBudget.model_validate(
        {
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "limits": limits,
                "enforcement": {"mode": mode},
            },
        }
    )


def setup(*policies: Any) -> tuple[list[GPUMemoryBudget], list[PodFacts], list[dict[str, Any]], dict[str, Any]]:
    budgets = [budget("train", {"perPod": {"vram": "100Gi"}})]
    raw = [
        pod("t", labels={"app": "train"}, node_name="gpu-h100-ts", resources={"nvidia.com/gpu": "1"}),
        pod("free", node_name="gpu-h100-ts", resources={"nvidia.com/gpu": "1"}),
    ]
    merged = {"ml": merge(list(policies), "ml", {})}
    return budgets, [PodFacts.from_api(p) for p in raw], raw, merged


def test_prepare_clamps_budgets_and_adds_implicit_ones() -> None:
    budgets, pods, raw, merged = setup(policy("team", defaults={}, ceilings={"perPod": {"vram": "40Gi"}}))
    view = prepare(budgets, pods, raw, {"gpu-h100-ts": TS}, merged)
    real, implicit = view.budgets
    assert real.spec.limits.per_pod is not None and real.spec.limits.per_pod.vram_bytes() == 40 * GI
    assert view.sources[("ml", "train")] == ({"perPod.vram": "policy/team/ceiling"}, "budget")
    assert implicit.metadata.name == "default:free"
    assert [p.labels.get(IMPLICIT_LABEL) for p in view.pods] == [None, "uid-free"]
    assert budgets[0].spec.limits.per_pod is not None and budgets[0].spec.limits.per_pod.vram == "100Gi"


def test_dry_run_policy_is_the_mode_source() -> None:
    budgets, pods, raw, merged = setup(policy("audit", mode="DryRun"))
    view = prepare(budgets, pods, raw, {}, merged)
    assert view.sources[("ml", "train")] == ({"perPod.vram": "budget"}, "policy/audit")
    assert len(view.budgets) == 1  # no defaults, nothing declared: no implicit budget


def test_finish_splits_real_and_implicit_statuses() -> None:
    budgets, pods, raw, merged = setup(policy("team", defaults={}, ceilings={"perPod": {"vram": "40Gi"}}))
    view = prepare(budgets, pods, raw, {"gpu-h100-ts": TS}, merged)
    st = GPUMemoryBudgetStatus(matchedPods=1)
    updates = [
        BudgetStatusUpdate(BudgetRef("ml", "train", "uid-train"), st),
        BudgetStatusUpdate(BudgetRef("ml", "default:free", "implicit:uid-free"), st),
    ]
    real, kept = finish(updates, view)
    assert [u.budget.name for u in real] == ["train"]
    assert real[0].status.limit_sources == {"perPod.vram": "policy/team/ceiling"}
    assert real[0].status.mode_source == "budget"
    assert list(kept) == ["implicit:uid-free"]
    # the kept status goes back in with the next evaluation
    again = prepare(budgets, pods, raw, {"gpu-h100-ts": TS}, merged, previous=kept)
    assert again.budgets[1].status == st


def test_limit_patches_for_implicit_pods_only() -> None:
    budgets, pods, raw, merged = setup(policy("team", defaults={}))
    view = prepare(budgets, pods, raw, {"gpu-h100-ts": TS}, merged)
    patches = limit_patches(view)
    assert list(patches) == [("ml", "free")]
    assert "node/time-slicing:4" in (patches[("ml", "free")][ANNOTATION_LIMITS] or "")


def test_memory_writes_each_limits_value_once_and_forgets_gone_pods() -> None:
    from vramguard_operator.policy.inputs import PolicyMemory

    budgets, pods, raw, merged = setup(policy("team", defaults={}))
    view = prepare(budgets, pods, raw, {"gpu-h100-ts": TS}, merged)
    memory = PolicyMemory()
    ((ref, patch),) = memory.pending_limits(view)
    assert (ref.name, ref.uid) == ("free", "uid-free")
    memory.wrote_limits(ref, patch)
    assert memory.pending_limits(view) == []  # the watch has not caught up: no second write
    memory.implicit_status["implicit:uid-free"] = GPUMemoryBudgetStatus()
    memory.forget({"uid-t"})
    assert memory.limits_written == {} and memory.implicit_status == {}
    assert memory.pending_limits(None) == [] and memory.finish([], None) == []


def test_gpu_pod_entry_trims() -> None:
    p = pod(
        "p",
        node_name="n",
        resources={"nvidia.com/gpu": "1"},
        annotations={"gpu-fraction": "0.5", "big": "x" * 1000, ANNOTATION_LIMITS: "{}"},
    )
    entry = gpu_pod_entry(p)
    assert entry is not None
    assert entry["metadata"]["annotations"] == {"gpu-fraction": "0.5", ANNOTATION_LIMITS: "{}"}
    assert entry["spec"] == {
        "nodeName": "n",
        "resourceClaims": [],
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    assert gpu_pod_entry(pod("c", resources={"cpu": "1"})) is None
    assert gpu_pod_entry(pod("k", annotations={"gpu-memory": "2000"})) is not None  # KAI, no resources


def test_gpu_pod_entry_keeps_what_grants_read() -> None:
    from .dra_builders import claim_pod

    # a pod with claims only: indexed, with its claims' names
    entry = gpu_pod_entry(claim_pod("d", ["direct"], templates={"gpu": "d-gpu-x7k"}))
    assert entry is not None
    assert [c["name"] for c in entry["spec"]["resourceClaims"]] == ["c0", "gpu"]
    assert entry["status"]["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": "d-gpu-x7k"}]
    # a fractional pod without GPU resources, and a KAI reservation pod's UUID
    ann = {
        "nvidia.com/container.t.gpu-memory.limit": "4Gi",
        "nvidia.com/container.t.gpus.devices": "GPU-x",
        "hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1,0:;",
        "run.ai/reserve_for_gpu_index": "GPU-x",
        "unrelated": "y",
    }
    entry = gpu_pod_entry(pod("f", annotations=ann))
    assert entry is not None and entry["metadata"]["annotations"] == {k: v for k, v in ann.items() if k != "unrelated"}


def test_status_patch() -> None:
    """The policy status writer uses the shared merge-patch builder."""
    assert merge_patch({"a": 1, "b": 2}, {"a": 1, "b": 2}) == {}
    assert merge_patch({"a": 1, "b": 2}, {"a": 3}) == {"a": 3, "b": None}
    assert merge_patch(None, {"a": 1}) == {"a": 1}
    # a key gone from a nested object is removed (the former top-level builder kept it)
    assert merge_patch({"c": {"x": 1, "y": 2}}, {"c": {"x": 1}}) == {"c": {"y": None}}


def test_desired_statuses_only_where_they_differ() -> None:
    from vramguard_operator.controller.policy_handlers import desired_statuses, policy_body

    from .builders import NOW

    a = policy_body(policy("a", ceilings={"perPod": {"vram": "30Gi"}}).to_api())
    b = policy_body(policy("b", namespaceSelector={"matchLabels": {"t": "x"}}).to_api())
    broken = {"metadata": {"name": "broken"}, "spec": {"mode": "Sometimes"}}
    first = desired_statuses([a, b, broken], {"ml": {"t": "x"}, "web": {}}, NOW)
    assert set(first) == {"a", "b", "broken"}
    # a policy that does not parse is reported on itself, naming the field
    (ready,) = first["broken"]["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert "spec.mode" in ready["message"] and "DryRun" in ready["message"]
    assert first["broken"]["matchedNamespaces"] == 0
    assert first["a"]["namespaces"] == ["ml", "web"] and first["b"]["namespaces"] == ["ml"]
    # once written, nothing more to write
    a["status"], b["status"] = first["a"], first["b"]
    assert desired_statuses([a, b], {"ml": {"t": "x"}, "web": {}}, NOW) == {}
    # a new namespace changes a's status only
    again = desired_statuses([a, b], {"ml": {"t": "x"}, "web": {}, "new": {}}, NOW)
    assert list(again) == ["a"] and again["a"]["matchedNamespaces"] == 3
