"""Every grant vramguard cannot read is a ``MalformedAllocation`` Warning Event
on the pod naming the key, the value and what is wanted (docs/policy.md,
docs/allocations.md); the pod keeps the limits it has from other sources; a
unit on a value counted in MiB, GiB or percent is refused, not multiplied.

The problems are followed to where the controller posts them
(``PolicyMemory.pending_problems``: one Event each, ``reconcile``)."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard_operator.engine.types import PodFacts
from vramguard_operator.policy.grants import EVENT_MALFORMED_ALLOCATION
from vramguard_operator.policy.implicit import implicit_budget
from vramguard_operator.policy.inputs import PolicyMemory, prepare
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.sharers import sharer_grants

from .builders import GI, MI, device, node, pod

N = "gpu-h100-ts"
TS = node(N, [device("GPU-a", 81559, 529)])
GARBLED = node(N, [device("GPU-a", 81559, 529)], labels={"nvidia.com/gpu.replicas": "four"})


def gpu_pod(resources: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return pod("p", resources=resources if resources is not None else {}, annotations=annotations, node_name=N)


def events(raw: dict[str, Any], facts: NodeFacts = TS) -> list[str]:
    """The Warning Events the controller would post on the pod: their messages."""
    view = prepare([], [PodFacts.from_api(raw)], [raw], {N: facts}, {"ml": MergedPolicy("ml")})
    pending = PolicyMemory().pending_problems(view)
    assert all(pr.reason == EVENT_MALFORMED_ALLOCATION and ref.name == "p" for ref, pr in pending)
    return [pr.message for _, pr in pending]


# (pod resources, pod annotations, key, value, what is wanted)
CASES = [
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000Mi"}, None, "nvidia.com/gpumem", "3000Mi", "whole number of MiB"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-100"}, None, "nvidia.com/gpumem", "-100", "whole number of MiB"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "500m"}, None, "nvidia.com/gpumem", "500m", "whole number of MiB"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "-5"}, None, "nvidia.com/gpumem-percentage", "-5", "whole number of percent"),
    ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25%"}, None, "nvidia.com/gpumem-percentage", "25%", "whole number of percent"),
    ({"aliyun.com/gpu-mem": "8Gi"}, None, "aliyun.com/gpu-mem", "8Gi", "whole number of GiB"),
    ({"aliyun.com/gpu-mem": "-2"}, None, "aliyun.com/gpu-mem", "-2", "whole number of GiB"),
    ({"aliyun.com/gpu-mem": "lots"}, None, "aliyun.com/gpu-mem", "lots", "whole number of GiB"),
    ({"nvidia.com/gpu": "-1"}, None, "nvidia.com/gpu", "-1", "at least 0"),
    (None, {"gpu-fraction": "half"}, "gpu-fraction", "half", "fraction in (0, 1)"),
    (None, {"gpu-fraction": "1.5"}, "gpu-fraction", "1.5", "fraction in (0, 1)"),
    (None, {"gpu-fraction": "-0.5"}, "gpu-fraction", "-0.5", "fraction in (0, 1)"),
    (None, {"gpu-memory": "4Gi"}, "gpu-memory", "4Gi", "whole number of MiB"),
    (None, {"gpu-memory": "4096M"}, "gpu-memory", "4096M", "whole number of MiB"),
]


@pytest.mark.parametrize(("resources", "annotations", "key", "value", "wanted"), CASES)
def test_an_unreadable_grant_is_a_warning_naming_key_value_and_what_is_wanted(
    resources: dict[str, str] | None, annotations: dict[str, str] | None, key: str, value: str, wanted: str
) -> None:
    (message,) = events(gpu_pod(resources, annotations))
    assert key in message and repr(value) in message and wanted in message, message
    assert message.startswith("pod ml/p: ")


@pytest.mark.parametrize(
    ("resource", "value"),
    [("nvidia.com/gpumem", "3000Mi"), ("nvidia.com/gpumem", "3Gi"), ("aliyun.com/gpu-mem", "8Gi"), ("aliyun.com/gpu-mem", "8G")],
)
def test_a_unit_on_a_value_counted_in_mib_or_gib_is_refused_not_multiplied(resource: str, value: str) -> None:
    found = implicit_budget(gpu_pod({"nvidia.com/gpu": "1", resource: value}), TS, MergedPolicy("ml"))
    assert found is None  # 3000Mi MiB would be about 2.9 PiB, 8Gi GiB 8 EiB: no limit at all rather than those


def test_the_same_values_without_a_unit_are_read_in_their_own_unit() -> None:
    hami = implicit_budget(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}), TS, MergedPolicy("ml"))
    aliyun = implicit_budget(gpu_pod({"aliyun.com/gpu-mem": "8"}), TS, MergedPolicy("ml"))
    assert hami is not None and hami.limits["perDevice"].bytes == 3000 * MI
    assert aliyun is not None and aliyun.limits["perDevice"].bytes == 8 * GI
    assert events(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})) == []


def test_a_whole_number_as_the_api_server_stores_it_is_read() -> None:
    # the kube-apiserver canonicalises nvidia.com/gpumem: 3000 to "3k" (seen in the e2e test)
    hami = implicit_budget(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"}), TS, MergedPolicy("ml"))
    assert hami is not None and hami.limits["perDevice"].bytes == 3000 * MI
    assert events(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3k"})) == []


def test_the_pod_keeps_the_limits_it_has_from_other_sources() -> None:
    # gpumem with a unit is refused; the percentage HAMi also declares still applies
    raw = gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000Mi", "nvidia.com/gpumem-percentage": "25"})
    found = implicit_budget(raw, TS, MergedPolicy("ml"))
    assert found is not None and found.sources == {"perDevice": "hami/nvidia.com/gpumem-percentage"}
    assert found.limits["perDevice"].bytes == 81559 * MI // 4
    # a bad KAI fraction beside a good HAMi allocation record
    raw = gpu_pod({"nvidia.com/gpu": "1"}, {"gpu-fraction": "2", "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,4000,0:;"})
    assert len(events(raw)) == 1
    found = implicit_budget(raw, TS, MergedPolicy("ml"), sharer_grants(raw, TS))
    assert found is not None and found.device_limits == {"GPU-a": 4000 * MI}


def test_a_garbled_replicas_label_is_said_on_the_node_s_gpu_pods() -> None:
    (message,) = events(gpu_pod({"nvidia.com/gpu": "1"}), GARBLED)
    assert "nvidia.com/gpu.replicas='four'" in message and "whole number of at least 1" in message
    assert f"node {N}" in message
    assert GARBLED.replicas == 1
    for fine in ("1", "4"):
        labelled = node(N, [device("GPU-a", 81559, 529)], labels={"nvidia.com/gpu.replicas": fine})
        assert labelled.problems == () and labelled.replicas == int(fine)
    for bad in ("0", "-2", "4.5", ""):
        labelled = node(N, [device("GPU-a", 81559, 529)], labels={"nvidia.com/gpu.replicas": bad})
        assert len(labelled.problems) == 1 and labelled.replicas == 1
