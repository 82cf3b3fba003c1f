"""Shares from what the node says, and budgets other GPU-sharing systems declare."""

from __future__ import annotations

from decimal import Decimal

import pytest

from vramguard_operator.policy.grants import EffectiveLimit
from vramguard_operator.policy.merge import MergedPolicy, merge
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.request import PodGPURequest
from vramguard_operator.policy.shares import (
    candidate_nodes,
    clamp,
    declared_limit,
    mig_limit,
    node_share,
    per_device_limit,
)

from .builders import GI, MI, device, node, node_obj, pod, policy

H100_TOTAL = 81559  # MiB, nvidia-smi
H100_RESERVED = 529


# --- node shares -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "devices", "labels", "bytes_", "source"),
    [
        # time-slicing, 4 replicas, from the report's usable memory
        (
            "gpu-h100-ts",
            [device("GPU-a", H100_TOTAL, H100_RESERVED)],
            {},
            (H100_TOTAL - H100_RESERVED) * MI // 4,
            "node/time-slicing:4",
        ),
        # without a report: GFD's memory label (total), still divided
        ("gpu-h100-ts", None, {}, H100_TOTAL * MI // 4, "node/time-slicing:4"),
        # MPS with 2 replicas
        (
            "gpu-h100-ts",
            None,
            {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "2"},
            H100_TOTAL * MI // 2,
            "node/mps:2",
        ),
        # vGPU: usable = total - reserved from the report
        ("gpu-a10-vgpu", [device("GPU-v", 24576, 1536, virtualization="VGPU")], {}, (24576 - 1536) * MI, "vgpu/usable"),
        # vGPU without a report: the label, and the source says so
        ("gpu-a10-vgpu", None, {}, 24576 * MI, "vgpu/label"),
        # vGPU detected from the device's virtualization mode alone, and time-sliced
        (
            "plain",
            [device("GPU-v", 16384, 1024, virtualization="VGPU")],
            {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "2"},
            (16384 - 1024) * MI // 2,
            "vgpu/usable/time-slicing:2",
        ),
        # a dedicated GPU
        ("plain", [device("GPU-x", 40960, 570)], {}, (40960 - 570) * MI, "node/exclusive"),
        # replicas without a sharing strategy do not divide
        ("plain", [device("GPU-x", 1000)], {"nvidia.com/gpu.replicas": "4"}, 1000 * MI, "node/exclusive"),
    ],
)
def test_node_share(name: str, devices, labels, bytes_: int, source: str) -> None:
    share = node_share(node(name, devices, labels=labels))
    assert share is not None
    assert (share.bytes, share.source) == (bytes_, source)


def test_node_share_uses_smallest_reported_gpu_and_ignores_mig_devices() -> None:
    n = node(
        "plain",
        [device("GPU-a", 81920, 500), device("GPU-b", 81920, 700), device("MIG-1", 4864, mig_profile="1g.5gb")],
    )
    assert n.device_usable() == ((81920 - 700) * MI, "report")
    assert n.device_total() == 81920 * MI


def test_node_without_memory_information_has_no_share() -> None:
    assert node_share(node("plain")) is None


@pytest.mark.parametrize("raw", ["x", "0", "-2", ""])
def test_bad_replicas_label_means_one(raw: str) -> None:
    assert node("plain", labels={"nvidia.com/gpu.replicas": raw}).replicas == 1


# --- MIG ----------------------------------------------------------------------------


def test_mig_profile_memory_from_gfd_label() -> None:
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/mig-1g.5gb": "1"}))
    limit = mig_limit(req, node("gpu-a100-mig"))
    assert limit == EffectiveLimit(4864 * MI, "mig/1g.5gb", "MIG 1g.5gb: 4.8Gi (label)")


def test_mig_largest_requested_profile_wins() -> None:
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/mig-1g.5gb": "1", "nvidia.com/mig-3g.20gb": "1"}))
    limit = mig_limit(req, node("gpu-a100-mig"))
    assert limit is not None and (limit.bytes, limit.source) == (19968 * MI, "mig/3g.20gb")


def test_mig_memory_from_report_then_from_the_profile_name() -> None:
    n = node("plain", [device("MIG-a", 9856, mig_profile="2g.10gb")])
    assert n.mig_memory("2g.10gb") == (9856 * MI, "report")
    assert n.mig_memory("1g.10gb") == (10 * 10**9, "profile name")
    assert n.mig_memory("weird") is None


def test_mig_single_strategy_reads_the_product_label() -> None:
    n = node(
        "plain",
        labels={
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
            "nvidia.com/mig-1g.5gb.memory": "4864",
        },
    )
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/gpu": "1"}))
    limit = mig_limit(req, n)
    assert limit is not None and (limit.bytes, limit.source) == (4864 * MI, "mig/1g.5gb")
    assert mig_limit(req, node("gpu-h100-ts")) is None  # not MIG


# --- pods -----------------------------------------------------------------------


def test_pod_request_sums_and_maxes_over_containers() -> None:
    p = pod(
        containers=[
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}}},
            {"name": "c", "resources": {"limits": {"cpu": "1"}}},
            {"name": "d", "resources": {"limits": {"aliyun.com/gpu-mem": "3"}}},
            {"name": "e", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}},
        ]
    )
    req = PodGPURequest.from_api(p)
    assert req.gpus == 3 and req.hami_gpumem_mib == 5000
    assert req.aliyun_gpu_mem == Decimal(5)
    assert req.gpu_containers == ("a", "b", "d", "e")
    assert req.is_gpu_pod and req.device_count == 3


def test_pod_request_reports_bad_values_and_keeps_the_rest() -> None:
    p = pod(
        resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "lots"},
        annotations={"gpu-fraction": "1.5", "gpu-memory": "2000"},
    )
    req = PodGPURequest.from_api(p)
    assert req.gpus == 1 and req.hami_gpumem_mib is None
    assert req.kai_fraction is None and req.kai_memory_mib == 2000
    assert any("nvidia.com/gpumem" in m and "'lots'" in m for m in req.problems)
    assert any("gpu-fraction" in m and "1.5" in m for m in req.problems)


def test_cpu_pod_is_not_a_gpu_pod() -> None:
    assert not PodGPURequest.from_api(pod(resources={"cpu": "2", "memory": "1Gi"})).is_gpu_pod


# --- declared budgets ------------------------------------------------------------

ALIYUN_GIB = {"aliyun.com/gpu-mem": "160", "aliyun.com/gpu-count": "2"}
ALIYUN_MIB = {"aliyun.com/gpu-mem": "163118", "aliyun.com/gpu-count": "2"}


@pytest.mark.parametrize(
    ("resources", "annotations", "alloc", "bytes_", "source"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, {}, {}, 3000 * MI, "hami/nvidia.com/gpumem"),
        # percentage of the device's total (HAMi's arithmetic), from the GFD label here
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"},
            {},
            {},
            H100_TOTAL * MI // 4,
            "hami/nvidia.com/gpumem-percentage",
        ),
        # gpumem wins over percentage when both are given
        (
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "50"},
            {},
            {},
            1000 * MI,
            "hami/nvidia.com/gpumem",
        ),
        ({"aliyun.com/gpu-mem": "3"}, {}, ALIYUN_GIB, 3 * GI, "aliyun/aliyun.com/gpu-mem"),
        # a node that counts in MiB (81559 per GPU > 1024): the request is MiB too
        ({"aliyun.com/gpu-mem": "3000"}, {}, ALIYUN_MIB, 3000 * MI, "aliyun/aliyun.com/gpu-mem"),
        ({}, {"gpu-memory": "2000"}, {}, 2000 * MI, "kai/gpu-memory"),
        ({}, {"gpu-fraction": "0.5"}, {}, H100_TOTAL * MI // 2, "kai/gpu-fraction"),
    ],
)
def test_declared_limit(resources, annotations, alloc, bytes_: int, source: str) -> None:
    req = PodGPURequest.from_api(pod(resources=resources, annotations=annotations))
    limit = declared_limit(req, node("gpu-h100-ts", alloc=alloc))
    assert limit is not None and (limit.bytes, limit.source) == (bytes_, source)


def test_declared_fraction_needs_a_device_size() -> None:
    req = PodGPURequest.from_api(pod(annotations={"gpu-fraction": "0.5"}))
    assert declared_limit(req, None) is None
    assert declared_limit(PodGPURequest.from_api(pod(resources={"nvidia.com/gpu": "1"})), None) is None


def test_declared_percentage_uses_the_reported_total() -> None:
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}))
    limit = declared_limit(req, node("gpu-h100-ts", [device("GPU-a", 80000, 500)]))
    assert limit is not None and limit.bytes == 40000 * MI


# --- per-device limit precedence ----------------------------------------------------

TS = [device("GPU-a", H100_TOTAL, H100_RESERVED)]
SHARE = (H100_TOTAL - H100_RESERVED) * MI // 4


def merged_of(*specs: dict) -> MergedPolicy:
    return merge([policy(f"p{i}", **s) for i, s in enumerate(specs)], "ml", {})


@pytest.mark.parametrize(
    ("specs", "resources", "bytes_", "source"),
    [
        # a policy with defaults: the node's share
        ([{"defaults": {}}], {"nvidia.com/gpu": "1"}, SHARE, "node/time-slicing:4"),
        # an explicit default below the share wins; above it, the share wins
        (
            [{"defaults": {"perDevice": {"vram": "10Gi"}}}, {"defaults": {}}],
            {"nvidia.com/gpu": "1"},
            10 * GI,
            "policy/p0",
        ),
        (
            [{"defaults": {"perDevice": {"vram": "30Gi"}}}, {"defaults": {}}],
            {"nvidia.com/gpu": "1"},
            SHARE,
            "node/time-slicing:4",
        ),
        # a fraction default is taken of usable memory
        (
            [{"defaults": {"perDevice": {"fraction": 0.1}}}],
            {"nvidia.com/gpu": "1"},
            int((H100_TOTAL - H100_RESERVED) * MI * 0.1),
            "policy/p0",
        ),
        # a declared budget is the pod's grant, above the share
        (
            [{"defaults": {}}],
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"},
            30000 * MI,
            "hami/nvidia.com/gpumem",
        ),
        # ... but a ceiling still lowers it
        (
            [{"defaults": {}, "ceilings": {"perDevice": {"vram": "16Gi"}}}],
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"},
            16 * GI,
            "policy/p0/ceiling",
        ),
        (
            [{"ceilings": {"perDevice": {"fraction": 0.1}}}],
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000"},
            int((H100_TOTAL - H100_RESERVED) * MI * 0.1),
            "policy/p0/ceiling",
        ),
        # no policy: declared budgets are still honoured
        ([], {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, 3000 * MI, "hami/nvidia.com/gpumem"),
    ],
)
def test_per_device_limit(specs, resources, bytes_: int, source: str) -> None:
    req = PodGPURequest.from_api(pod(resources=resources))
    limit = per_device_limit(req, node("gpu-h100-ts", TS), merged_of(*specs))
    assert limit is not None and (limit.bytes, limit.source) == (bytes_, source)


def test_no_policy_and_nothing_declared_means_no_limit() -> None:
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/gpu": "1"}))
    assert per_device_limit(req, node("gpu-h100-ts", TS), merged_of()) is None
    assert per_device_limit(req, node("gpu-h100-ts", TS), merged_of({"defaults": {"shareFromNode": False}})) is None


def test_mig_pod_gets_its_profile_as_the_share() -> None:
    req = PodGPURequest.from_api(pod(resources={"nvidia.com/mig-2g.10gb": "1"}))
    limit = per_device_limit(req, node("gpu-a100-mig"), merged_of({"defaults": {}}))
    assert limit is not None and (limit.bytes, limit.source) == (9856 * MI, "mig/2g.10gb")


def test_clamp_keeps_the_smaller_and_explains() -> None:
    base = EffectiveLimit(20 * GI, "node/time-slicing:4")
    cap = EffectiveLimit(8 * GI, "policy/p/ceiling", "ceiling perDevice.vram")
    assert clamp(base, None) is base
    assert clamp(base, EffectiveLimit(30 * GI, "x")) is base
    lowered = clamp(base, cap)
    assert (lowered.bytes, lowered.source) == (8 * GI, "policy/p/ceiling")
    assert "lowered from 20Gi from node/time-slicing:4" in lowered.detail


def test_candidate_nodes() -> None:
    nodes = [node(n) for n in ("gpu-h100-ts", "gpu-a100-mig", "gpu-a10-vgpu")]
    names = lambda p: [n.name for n in candidate_nodes(p, nodes)]  # noqa: E731
    assert names(pod(resources={"nvidia.com/gpu": "1"})) == ["gpu-h100-ts", "gpu-a10-vgpu"]
    assert names(pod(resources={"nvidia.com/mig-1g.5gb": "1"})) == ["gpu-a100-mig"]
    assert names(pod(resources={"nvidia.com/gpu": "1"}, node_selector={"nvidia.com/vgpu.present": "true"})) == [
        "gpu-a10-vgpu"
    ]
    assert names(pod(resources={"nvidia.com/gpu": "1"}, node_name="gpu-h100-ts")) == ["gpu-h100-ts"]


def test_node_facts_from_api_reads_capacity_when_allocatable_is_missing() -> None:
    obj = node_obj("x")
    obj["status"] = {"capacity": {"nvidia.com/gpu": "4"}}
    assert NodeFacts.from_api(obj).allocatable == {"nvidia.com/gpu": "4"}
