"""A GPU pod is recognised by every name NVIDIA's device plugin and DRA give a
GPU: ``nvidia.com/gpu``, its shared rename ``nvidia.com/gpu.shared``
(``sharing.timeSlicing.renameByDefault: true`` or the same under ``mps``: the
device plugin's README, "Shared Access to GPUs", and api/config/v1/resources.go
DefaultSharedRename), MIG profiles (``nvidia.com/mig-1g.5gb``, and
``nvidia.com/mig-1g.5gb.shared`` when shared and renamed), and DRA claims.
One row per naming scheme: the pod is a GPU pod, holds its devices, and gets
the share the same device would give it under its plain name."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard_operator.policy.implicit import implicit_budget
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.request import PodGPURequest
from vramguard_operator.policy.sharers import may_use_gpu

from .builders import MI, device, node, pod, policy

TS = node("gpu-h100-ts", [device("GPU-a", 81559, 529)])
MIG = node("gpu-a100-mig")
SHARE_FROM_NODE = merge([policy("cluster-default", defaults={})], "ml", {})

# (resources, node, devices held, the source of the node's share)
SCHEMES = [
    ({"nvidia.com/gpu": "1"}, TS, 1, "node/time-slicing:4"),
    ({"nvidia.com/gpu.shared": "1"}, TS, 1, "node/time-slicing:4"),
    ({"nvidia.com/gpu.shared": "2"}, TS, 2, "node/time-slicing:4"),
    ({"nvidia.com/mig-1g.5gb": "1"}, MIG, 1, "mig/1g.5gb"),
    ({"nvidia.com/mig-1g.5gb.shared": "1"}, MIG, 1, "mig/1g.5gb"),
]


def on(resources: dict[str, str], node_name: str) -> dict[str, Any]:
    return pod("p", resources=resources, node_name=node_name)


@pytest.mark.parametrize(("resources", "facts", "held", "source"), SCHEMES)
def test_every_gpu_resource_name_makes_a_gpu_pod_with_its_share(
    resources: dict[str, str], facts: Any, held: int, source: str
) -> None:
    raw = on(resources, facts.name)
    req = PodGPURequest.from_api(raw)
    assert req.is_gpu_pod and may_use_gpu(raw) and not req.problems
    assert req.device_count == held and req.gpu_containers == ("main",)
    found = implicit_budget(raw, facts, SHARE_FROM_NODE)
    assert found is not None and found.sources["perDevice"] == source


def test_a_shared_mig_device_has_its_profile_s_memory_not_the_parent_s() -> None:
    found = implicit_budget(on({"nvidia.com/mig-1g.5gb.shared": "1"}, "gpu-a100-mig"), MIG, SHARE_FROM_NODE)
    assert found is not None and found.limits["perDevice"].bytes == 4864 * MI


def test_a_dra_claim_makes_a_gpu_pod() -> None:
    raw = pod("p", node_name="gpu-h100-ts")
    assert not may_use_gpu(raw)
    raw["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    assert may_use_gpu(raw)


@pytest.mark.parametrize("name", ["cpu", "memory", "example.com/foo", "ephemeral-storage"])
def test_other_resources_are_not_gpus(name: str) -> None:
    raw = on({name: "1"}, "gpu-h100-ts")
    assert not PodGPURequest.from_api(raw).is_gpu_pod and not may_use_gpu(raw)
