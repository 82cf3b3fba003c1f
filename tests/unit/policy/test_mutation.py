"""Framework memory caps injected by the mutating webhook."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest

from vramguard_operator.policy.grants import EffectiveLimit
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.mutation import (
    ANNOTATION_INJECTED,
    DeviceFacts,
    admission_limit,
    mps_limit,
    mutate_pod,
    xla_fraction,
)
from vramguard_operator.policy.request import PodGPURequest

from .builders import GI, MI, device, node, pod, policy

LIMIT = EffectiveLimit(20 * GI, "node/time-slicing:4")
H100 = DeviceFacts(total_bytes=81559 * MI)


def applied(p: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.apply_patch(copy.deepcopy(p), ops)


def env(p: dict[str, Any], i: int = 0) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in p["spec"]["containers"][i].get("env") or ()}


@pytest.mark.parametrize(
    ("limit", "total", "expected"),
    [
        (20 * GI, 80 * GI, "0.243"),  # (20Gi - 512Mi) / 80Gi = 0.24375, rounded down
        (40 * GI, 80 * GI, "0.493"),
        (80 * GI, 80 * GI, None),  # the whole device: nothing to cap
        (20 * GI, None, None),  # total unknown
        (512 * MI, 80 * GI, "0.003"),  # small limit: half of it, never zero
    ],
)
def test_xla_fraction(limit: int, total: int | None, expected: str | None) -> None:
    assert xla_fraction(limit, total) == expected


def test_xla_fraction_keeps_the_process_under_the_limit() -> None:
    total = 81559 * MI
    for limit_gib in (1, 5, 10, 19, 20, 39, 60):
        frac = xla_fraction(limit_gib * GI, total)
        assert frac is not None
        assert float(frac) * total <= limit_gib * GI


@pytest.mark.parametrize(
    ("limit", "devices", "expected"),
    [(4096 * MI, 1, "0=4096M"), (4096 * MI + 5, 2, "0=4096M,1=4096M"), (100, 1, "0=1M"), (GI, 0, "0=1024M")],
)
def test_mps_limit_format(limit: int, devices: int, expected: str) -> None:
    assert mps_limit(limit, devices) == expected


def test_injects_into_a_container_without_env() -> None:
    p = pod(resources={"nvidia.com/gpu": "1"})
    ops, record = mutate_pod(p, LIMIT, H100)
    out = applied(p, ops)
    assert env(out) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": xla_fraction(20 * GI, 81559 * MI),
    }
    note = json.loads(out["metadata"]["annotations"][ANNOTATION_INJECTED])
    assert note == record
    assert note["source"] == "node/time-slicing:4" and note["limit"] == "20Gi"
    assert set(note["set"]["main"]) == set(env(out))


def test_never_overwrites_what_the_pod_sets() -> None:
    container = {
        "name": "main",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "env": [
            {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.9"},
            {"name": "PYTORCH_ALLOC_CONF", "value": "max_split_size_mb:128"},
            {"name": "OTHER", "value": "1"},
        ],
    }
    p = pod(containers=[container], annotations={"keep": "me"})
    ops, record = mutate_pod(p, LIMIT, H100)
    out = applied(p, ops)
    assert env(out) == {
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
        "PYTORCH_ALLOC_CONF": "max_split_size_mb:128",
        "OTHER": "1",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    assert record is not None
    assert record["kept"]["main"] == ["PYTORCH_CUDA_ALLOC_CONF", "XLA_PYTHON_CLIENT_MEM_FRACTION"]
    assert out["metadata"]["annotations"]["keep"] == "me"  # other annotations stay


def test_value_from_counts_as_set() -> None:
    container = {
        "name": "main",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "env": [{"name": "TF_FORCE_GPU_ALLOW_GROWTH", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
    }
    out = applied(p := pod(containers=[container]), mutate_pod(p, LIMIT, H100)[0])
    assert "value" not in out["spec"]["containers"][0]["env"][0]
    assert [e["name"] for e in out["spec"]["containers"][0]["env"]].count("TF_FORCE_GPU_ALLOW_GROWTH") == 1


def test_only_gpu_containers_and_never_env_from() -> None:
    containers: list[dict[str, Any]] = [
        {"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        {"name": "sidecar", "resources": {"limits": {"cpu": "1"}}},
        {"name": "cfg", "resources": {"limits": {"nvidia.com/gpu": "1"}}, "envFrom": [{"configMapRef": {"name": "x"}}]},
    ]
    p = pod(containers=containers)
    req = PodGPURequest.from_api(p)
    ops, record = mutate_pod(p, LIMIT, DeviceFacts(81559 * MI, mps=True), req.gpu_containers)
    out = applied(p, ops)
    assert env(out, 0)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M,1=20480M"
    assert "env" not in out["spec"]["containers"][1]
    assert "env" not in out["spec"]["containers"][2]
    assert record is not None and record["skipped"] == {"cfg": "envFrom may set these variables"}


def test_no_limit_still_sets_the_limit_free_caps() -> None:
    p = pod(resources={"nvidia.com/gpu": "1"})
    out = applied(p, mutate_pod(p, None, DeviceFacts(None, mps=True))[0])
    assert set(env(out)) == {"PYTORCH_CUDA_ALLOC_CONF", "TF_FORCE_GPU_ALLOW_GROWTH"}


def test_already_injected_pod_is_left_alone() -> None:
    p = pod(resources={"nvidia.com/gpu": "1"}, annotations={ANNOTATION_INJECTED: "{}"})
    assert mutate_pod(p, LIMIT, H100) == ([], None)


def test_nothing_to_do_means_no_patch() -> None:
    container: dict[str, Any] = {
        "name": "main",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "env": [{"name": n, "value": "x"} for n in ("TF_FORCE_GPU_ALLOW_GROWTH", "PYTORCH_CUDA_ALLOC_CONF")],
    }
    ops, record = mutate_pod(p := pod(containers=[container]), None, H100)
    # the kept variables are still recorded
    assert record == {"kept": {"main": ["PYTORCH_CUDA_ALLOC_CONF", "TF_FORCE_GPU_ALLOW_GROWTH"]}}
    assert applied(p, ops)["metadata"]["annotations"][ANNOTATION_INJECTED]


def test_admission_limit_takes_the_tightest_candidate() -> None:
    merged = merge([policy("p", defaults={})], "ml", {})
    ts = node("gpu-h100-ts", [device("GPU-a", 81559, 529)])
    vgpu = node("gpu-a10-vgpu", [device("GPU-v", 24576, 1536, virtualization="VGPU")])
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/gpu": "1"}))
    limit, facts = admission_limit(req, [ts, vgpu], merged)
    # time-sliced H100: ~19.8Gi of 79.6Gi (0.25); the vGPU: all of its usable memory (0.94)
    assert limit is not None and limit.source == "node/time-slicing:4"
    assert facts == DeviceFacts(81559 * MI, False)


def test_admission_limit_for_mig_uses_the_mig_device_as_total() -> None:
    merged = merge([policy("p", defaults={})], "ml", {})
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/mig-1g.5gb": "1"}))
    limit, facts = admission_limit(req, [node("gpu-a100-mig")], merged)
    assert limit is not None and limit.bytes == facts.total_bytes == 4864 * MI
    assert xla_fraction(limit.bytes, facts.total_bytes) is None


def test_admission_limit_without_candidates_uses_a_declared_budget() -> None:
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}))
    limit, facts = admission_limit(req, [], merge([], "ml", {}))
    assert limit is not None and limit.bytes == 4096 * MI and facts.total_bytes is None
