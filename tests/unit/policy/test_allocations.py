"""Grants (DRA claims, sharers' annotations) entering the implicit budgets:
per-device limits by UUID, strictest wins, pods a real budget selects, shared
claims, problems as Events, and the engine acting on a device's own limit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import Annotate, EngineInput, PodFacts, Warn
from vramguard_operator.policy.claim_budgets import CLAIM_LABEL_PREFIX
from vramguard_operator.policy.grants import EVENT_ALLOCATED_DEVICE_MISSING, EVENT_MALFORMED_ALLOCATION
from vramguard_operator.policy.implicit import ANNOTATION_LIMITS, IMPLICIT_LABEL, read_limits
from vramguard_operator.policy.inputs import Allocations, PolicyMemory, PolicyView, prepare
from vramguard_operator.policy.merge import MergedPolicy, merge

from .builders import GI, NOW, device, node, pod, policy
from .dra_builders import claim, claim_pod, gpu, resource_slice, result

N = "gpu-h100-ts"
U0, U1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
TS = node(N, [device(U0, 81559, 529), device(U1, 81559, 529)])
SLICES = [resource_slice(N, [gpu("gpu-0", U0), gpu("gpu-1", U1)])]


def allocations(*claims: dict[str, Any]) -> Allocations:
    return Allocations(claims={(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}, slices=SLICES)


def view_of(
    raw: list[dict[str, Any]],
    alloc: Allocations,
    merged: MergedPolicy | None = None,
    budgets: Sequence[GPUMemoryBudget] = (),
    previous: dict[str, GPUMemoryBudgetStatus] | None = None,
) -> PolicyView:
    facts = [PodFacts.from_api(p) for p in raw]
    return prepare(list(budgets), facts, raw, {N: TS}, {"ml": merged or MergedPolicy("ml")}, previous, alloc)


def report(usage: dict[str, dict[str, float]]) -> NodeGPUUsage:
    """A report of N: GiB used per pod name and device UUID."""
    pods = []
    for name, devices in usage.items():
        used = {u: int(g * GI) for u, g in devices.items()}
        pods.append(
            {
                "uid": f"uid-{name}",
                "namespace": "ml",
                "name": name,
                "vramBytes": sum(used.values()),
                "devices": [{"uuid": u, "usedBytes": b} for u, b in used.items()],
            }
        )
    return NodeGPUUsage.model_validate(
        {
            "metadata": {"name": N},
            "spec": {"nodeName": N},
            "status": {"sampleTime": NOW.isoformat(), "devices": [device(U0, 81559, 529), device(U1, 81559, 529)], "pods": pods},
        }
    )


def run(view: PolicyView, usage: dict[str, dict[str, float]]) -> list[Any]:
    out = evaluate(
        EngineInput(budgets=view.budgets, pods=view.pods, reports={N: report(usage)}, now=NOW, device_limits=view.device_limits)
    )
    return list(out.decisions)


def acted(decisions: list[Any]) -> dict[str, set[tuple[str, str | None]]]:
    out: dict[str, set[tuple[str, str | None]]] = {}
    for d in decisions:
        if isinstance(d, Annotate | Warn) and d.pod is not None:
            out.setdefault(d.pod.name, set()).add((type(d).__name__, d.violation.device))
    return out


def test_dra_claim_is_a_per_device_limit_named_dra_claim() -> None:
    view = view_of([claim_pod("a", ["a-gpu"])], allocations(claim("a-gpu", [result("gpu-0", N, "20Gi")])))
    (imp,) = view.implicit
    assert imp.budget.metadata.name == "default:a"
    assert imp.budget.spec.limits.per_device is None  # no limit on any other device
    assert imp.device_limits == {U0: 20 * GI}
    assert view.device_limits == {"implicit:uid-a": {U0: 20 * GI}}
    assert imp.sources == {f"perDevice[{U0}]": "dra/a-gpu"}
    ann = read_limits({ANNOTATION_LIMITS: view_limits(view)["a"]})
    assert ann[f"perDevice[{U0}]"]["source"] == "dra/a-gpu" and ann[f"perDevice[{U0}]"]["limit"] == "20Gi"


def view_limits(view: PolicyView) -> dict[str, str]:
    memory = PolicyMemory()
    return {ref.name: patch[ANNOTATION_LIMITS] or "" for ref, patch in memory.pending_limits(view)}


def test_pod_over_its_claim_is_warned_and_annotated_its_neighbour_within_its_claim_is_not() -> None:
    claims = [claim("a-gpu", [result("gpu-0", N, "20Gi")]), claim("b-gpu", [result("gpu-0", N, "40Gi")])]
    view = view_of([claim_pod("a", ["a-gpu"]), claim_pod("b", ["b-gpu"])], allocations(*claims))
    # a uses 30Gi of its 20Gi; b uses 30Gi of its 40Gi (above a's limit, within its own)
    decisions = run(view, {"a": {U0: 30}, "b": {U0: 30}})
    assert acted(decisions) == {"a": {("Annotate", U0)}}
    ann = next(d for d in decisions if isinstance(d, Annotate))
    assert ann.limit_bytes == 20 * GI and ann.budget.name == "default:a"


def test_two_claims_on_two_devices_each_has_its_own_limit() -> None:
    claims = [claim("small", [result("gpu-0", N, "10Gi")]), claim("big", [result("gpu-1", N, "30Gi")])]
    view = view_of([claim_pod("a", ["small", "big"])], allocations(*claims))
    assert view.implicit[0].device_limits == {U0: 10 * GI, U1: 30 * GI}
    # 20Gi on each: over the small claim's device only
    assert acted(run(view, {"a": {U0: 20, U1: 20}})) == {"a": {("Annotate", U0)}}
    assert acted(run(view, {"a": {U0: 5, U1: 25}})) == {}


def test_a_device_the_pod_holds_whole_is_not_limited() -> None:
    claims = [claim("part", [result("gpu-0", N, "10Gi")]), claim("whole", [result("gpu-1", N)])]
    view = view_of([claim_pod("a", ["part", "whole"])], allocations(*claims))
    assert view.implicit[0].device_limits == {U0: 10 * GI}
    assert acted(run(view, {"a": {U0: 5, U1: 70}})) == {}


def test_a_policy_default_does_not_override_the_claim_but_a_ceiling_lowers_it() -> None:
    c = claim("a-gpu", [result("gpu-0", N, "20Gi")])
    merged = merge([policy("team", defaults={"perDevice": {"vram": "8Gi"}})], "ml", {})
    (imp,) = view_of([claim_pod("a", ["a-gpu"])], allocations(c), merged).implicit
    assert imp.device_limits == {U0: 20 * GI}
    merged = merge([policy("team", ceilings={"perDevice": {"vram": "16Gi"}})], "ml", {})
    (imp,) = view_of([claim_pod("a", ["a-gpu"])], allocations(c), merged).implicit
    assert imp.device_limits == {U0: 16 * GI} and imp.sources[f"perDevice[{U0}]"] == "policy/team/ceiling"


def test_strictest_of_a_claim_and_a_sharer_grant() -> None:
    p = claim_pod("a", ["a-gpu"])
    p["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": f"{U0},NVIDIA,10240,0:;"}
    (imp,) = view_of([p], allocations(claim("a-gpu", [result("gpu-0", N, "20Gi")]))).implicit
    assert imp.device_limits == {U0: 10 * GI} and imp.sources[f"perDevice[{U0}]"] == "hami/hami.io/vgpu-devices-allocated"


def test_a_pod_a_real_budget_selects_gets_an_allocation_budget_and_the_stricter_acts() -> None:
    p = claim_pod("a", ["a-gpu"])
    p["metadata"]["labels"] = {"app": "train"}
    real = GPUMemoryBudget.model_validate(
        {
            "metadata": {"name": "train", "namespace": "ml", "uid": "u-train"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}, "limits": {"perDevice": {"vram": "60Gi"}}},
        }
    )
    merged = merge([policy("team", defaults={"perDevice": {"vram": "8Gi"}})], "ml", {})
    view = view_of([p], allocations(claim("a-gpu", [result("gpu-0", N, "20Gi")])), merged, [real])
    (imp,) = view.implicit
    assert imp.budget.metadata.name == "allocation:a"
    assert imp.limits.keys() == {f"perDevice[{U0}]"}  # the policy's default is not for selected pods
    decisions = run(view, {"a": {U0: 30}})  # within the budget's 60Gi, over the claim's 20Gi
    assert {d.budget.name for d in decisions if isinstance(d, Annotate)} == {"allocation:a"}


def test_shared_claim_limits_each_pod_and_their_sum() -> None:
    c = claim("shared", [result("gpu-0", N, "20Gi")], reserved_for=["a", "b"])
    view = view_of([claim_pod("a", ["shared"]), claim_pod("b", ["shared"])], allocations(c))
    (cb,) = view.claims
    assert cb.budget.metadata.name == "dra:shared" and cb.budget.metadata.uid == "implicit:claim:claim-uid-shared"
    assert cb.budget.spec.limits.total is not None and cb.budget.spec.limits.total.vram_bytes() == 20 * GI
    label = CLAIM_LABEL_PREFIX + "claim-uid-shared"
    assert all(p.labels.get(label) == "true" and p.labels.get(IMPLICIT_LABEL) == p.uid for p in view.pods)
    assert all(i.device_limits == {U0: 20 * GI} for i in view.implicit)
    # 12 + 12 = 24Gi: each within the claim, their sum over it
    decisions = run(view, {"a": {U0: 12}, "b": {U0: 12}})
    totals = [d for d in decisions if isinstance(d, Annotate)]
    assert {d.budget.name for d in totals} == {"dra:shared"} and {d.pod.name for d in totals if d.pod} == {"a", "b"}
    assert all(d.violation.kind == "TotalVRAM" and d.limit_bytes == 20 * GI for d in totals)
    assert not [d for d in run(view, {"a": {U0: 8}, "b": {U0: 8}}) if isinstance(d, Annotate)]


def test_no_sum_budget_for_a_pod_with_gpus_from_elsewhere() -> None:
    c = claim("shared", [result("gpu-0", N, "20Gi")], reserved_for=["a", "b"])
    other = claim("own", [result("gpu-1", N)])
    view = view_of([claim_pod("a", ["shared", "own"]), claim_pod("b", ["shared"])], allocations(c, other))
    assert view.claims == ()
    assert all(i.device_limits == {U0: 20 * GI} for i in view.implicit)


def test_problems_become_one_event_each_and_set_no_limit() -> None:
    bad = claim("bad", [result("gpu-0", N, "lots")])
    gone = claim("gone", [result("gpu-7", N, "20Gi")])
    p = claim_pod("a", ["bad", "gone"])
    p["metadata"]["annotations"] = {"gpu-fraction": "1.5"}
    view = view_of([p], allocations(bad, gone))
    assert view.implicit == ()
    memory = PolicyMemory()
    pending = memory.pending_problems(view)
    assert sorted(pr.reason for _, pr in pending) == sorted(
        [EVENT_MALFORMED_ALLOCATION, EVENT_ALLOCATED_DEVICE_MISSING, EVENT_MALFORMED_ALLOCATION]
    )
    assert {ref.name for ref, _ in pending} == {"a"}
    for ref, pr in pending:
        memory.reported_problem(ref, pr)
    assert memory.pending_problems(view) == []
    memory.forget(set())
    assert memory.problems_reported == {}


def test_memory_keeps_a_claim_budgets_status_while_it_is_evaluated() -> None:
    c = claim("shared", [result("gpu-0", N, "20Gi")], reserved_for=["a", "b"])
    raw = [claim_pod("a", ["shared"]), claim_pod("b", ["shared"])]
    view = view_of(raw, allocations(c))
    out = evaluate(EngineInput(budgets=view.budgets, pods=view.pods, reports={N: report({})}, now=NOW, device_limits=view.device_limits))
    memory = PolicyMemory()
    memory.finish(out.statuses, view)
    assert "implicit:claim:claim-uid-shared" in memory.implicit_status
    memory.forget({"uid-a", "uid-b"})
    assert "implicit:claim:claim-uid-shared" in memory.implicit_status
    again = view_of(raw, allocations(c), previous=memory.implicit_status)
    assert again.claims[0].budget.status is not None
    memory.forget({"uid-a", "uid-b"})  # not evaluated since: gone
    assert "implicit:claim:claim-uid-shared" not in memory.implicit_status


def test_nvfractions_pod_without_gpu_resources_gets_a_budget() -> None:
    p = pod("f", node_name=N, annotations={"nvidia.com/container.main.gpu-memory.limit": "4Gi"})
    (imp,) = view_of([p], Allocations()).implicit
    assert imp.budget.spec.limits.per_device is not None and imp.budget.spec.limits.per_device.bytes_for(None) == 4 * GI
    assert imp.sources == {"perDevice": "nvfractions/nvidia.com/container.main.gpu-memory.limit"}
    assert imp.device_limits == {}  # on each device, none named


def test_a_whole_device_claim_makes_a_gpu_pod_that_policy_defaults_limit() -> None:
    c = claim("whole", [result("gpu-0", N)])
    (imp,) = view_of([claim_pod("a", ["whole"])], allocations(c), merge([policy("team", defaults={"perDevice": {"vram": "8Gi"}})], "ml", {})).implicit
    assert imp.device_limits == {} and imp.sources == {"perDevice": "policy/team"}
    assert view_of([claim_pod("a", ["whole"])], allocations(c)).implicit == ()  # no policy: nothing limits it
