"""The per-object rules kept between evaluations (``RuleCache``): the same
objects the uncached functions build, rebuilt exactly when an input they are
made of changes."""

from __future__ import annotations

from vramguard_operator.policy.ceilings import effective_budget
from vramguard_operator.policy.implicit import implicit_budget
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.rules import RuleCache

from ..engine.builders import budget
from .builders import device, node, pod, policy

TS = node("gpu-h100-ts", [device("GPU-a", 81559, 529)])
DEFAULTS = merge([policy("cluster-default", defaults={})], "ml", {})
CEILING = merge([policy("ceil", ceilings={"perPod": {"vram": "8Gi"}})], "ml", {})


def gpu_pod(name: str = "p") -> dict:
    return pod(name, node_name="gpu-h100-ts", resources={"nvidia.com/gpu": "1"})


def test_an_implicit_budget_is_built_once_per_pod_and_equals_a_fresh_one() -> None:
    rules, p = RuleCache(), gpu_pod()
    first = rules.implicit(p, TS, DEFAULTS)
    assert first == implicit_budget(p, TS, DEFAULTS)
    assert rules.implicit(p, TS, DEFAULTS) is first and (rules.hits, rules.misses) == (1, 1)
    # the memory in use moves with every report: not an input of the rule
    busy = node("gpu-h100-ts", [{**device("GPU-a", 81559, 529), "processBytes": 7 << 30}])
    assert rules.implicit(p, busy, DEFAULTS) is first
    # what shares read of the node, the pod, the policy: each rebuilds it
    smaller = node("gpu-h100-ts", [device("GPU-a", 40960, 529)])
    assert rules.implicit(p, smaller, DEFAULTS) == implicit_budget(p, smaller, DEFAULTS) != first
    relabelled = node("gpu-h100-ts", [device("GPU-a", 81559, 529)], labels={"nvidia.com/gpu.replicas": "2"})
    assert rules.implicit(p, relabelled, DEFAULTS) == implicit_budget(p, relabelled, DEFAULTS)
    dry = merge([policy("audit", mode="DryRun", defaults={})], "ml", {})
    assert rules.implicit(p, TS, dry) == implicit_budget(p, TS, dry)
    other = {**p, "spec": {**p["spec"], "containers": [{"name": "main", "resources": {"limits": {
        "nvidia.com/gpu": "2"}}}]}}
    assert rules.implicit(other, TS, DEFAULTS) == implicit_budget(other, TS, DEFAULTS)
    assert rules.misses == 5


def test_a_budget_under_ceilings_is_kept_per_generation_with_its_own_status() -> None:
    rules = RuleCache()
    b = budget(per_pod={"vram": "10Gi"})
    eff, sources = rules.effective(b, CEILING)
    assert (eff, sources) == effective_budget(b, CEILING)
    from vramguard_api.budget import GPUMemoryBudgetStatus

    with_status = b.model_copy(update={"status": GPUMemoryBudgetStatus(matchedPods=3)})
    again, _ = rules.effective(with_status, CEILING)
    assert again.status == with_status.status and again.spec == eff.spec and rules.hits == 1
    newer = budget(per_pod={"vram": "6Gi"}, generation=2)
    assert rules.effective(newer, CEILING) == effective_budget(newer, CEILING)
    assert rules.effective(newer, DEFAULTS) == effective_budget(newer, DEFAULTS)
    assert rules.misses == 3
    rules.forget([], [])
    rules.effective(newer, DEFAULTS)
    assert rules.misses == 4
