"""GPU sharers' allocation annotations as per-device grants: each format, its
arithmetic, and malformed values (reported, never half-applied)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vramguard_operator.policy.grants import EVENT_MALFORMED_ALLOCATION, Grants
from vramguard_operator.policy.sharers import (
    declares_grant,
    hami_grant,
    kai_group_devices,
    koordinator_grant,
    nvfractions_grant,
    sharer_grants,
)

from .builders import GI, MI, device, node, pod

A, B = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"
NVF = "nvidia.com/container."


def named(g: Grants) -> dict[str, tuple[int, str]]:
    return {u: (lim.bytes, lim.source) for u, lim in g.by_device().items()}


def each(g: Grants) -> tuple[int, str] | None:
    lim = g.each_device()
    return None if lim is None else (lim.bytes, lim.source)


def assert_rejected(g: Grants, annotation: str, value: str) -> None:
    assert not g and g.by_device() == {} and g.each_device() is None  # nothing half-applied
    assert len(g.problems) == 1
    p = g.problems[0]
    assert p.reason == EVENT_MALFORMED_ALLOCATION and annotation in p.message and repr(value) in p.message


# --- NVIDIA GPU fractioning --------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "by_uuid", "each_"),
    [
        # one container, one device named by UUID: the limit, on that device
        ({f"{NVF}trainer.gpu-memory.limit": "16Gi", f"{NVF}trainer.gpus.devices": A}, {A: 16 * GI}, None),
        # the request stands in for a missing limit; a set limit wins over the request
        ({f"{NVF}t.gpu-memory.request": "8Gi", f"{NVF}t.gpus.devices": A}, {A: 8 * GI}, None),
        (
            {f"{NVF}t.gpu-memory.request": "8Gi", f"{NVF}t.gpu-memory.limit": "12Gi", f"{NVF}t.gpus.devices": A},
            {A: 12 * GI},
            None,
        ),
        # two containers on one device: their sum; a container on two devices: on each
        (
            {
                f"{NVF}a.gpu-memory.limit": "4Gi",
                f"{NVF}a.gpus.devices": f"{A},{B}",
                f"{NVF}b.gpu-memory.limit": "2Gi",
                f"{NVF}b.gpus.devices": A,
            },
            {A: 6 * GI, B: 4 * GI},
            None,
        ),
        # devices by index (or not assigned yet): the sum over containers on each device
        ({f"{NVF}a.gpu-memory.limit": "4Gi", f"{NVF}a.gpus.devices": "0"}, {}, 4 * GI),
        ({f"{NVF}a.gpu-memory.limit": "3000M", f"{NVF}b.gpu-memory.limit": "1Gi"}, {}, 3 * 10**9 + GI),
        # not a fractioning annotation: a key that is no container name
        ({f"{NVF}Bad_Name.gpu-memory.limit": "4Gi"}, {}, None),
    ],
)
def test_nvfractions(annotations: dict[str, str], by_uuid: dict[str, int], each_: int | None) -> None:
    g = nvfractions_grant(annotations)
    assert not g.problems
    assert {u: b for u, (b, _) in named(g).items()} == by_uuid
    assert (each(g) or (None,))[0] == each_


def test_nvfractions_source_names_the_annotation() -> None:
    g = nvfractions_grant({f"{NVF}trainer.gpu-memory.limit": "16Gi", f"{NVF}trainer.gpus.devices": A})
    assert named(g)[A][1] == f"nvfractions/{NVF}trainer.gpu-memory.limit"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("limit", "lots"),
        ("limit", "-4Gi"),
        ("limit", "512Ki"),  # under the 1 MB MPS can enforce
        ("request", "1.5.3Gi"),
    ],
)
def test_nvfractions_malformed_drops_the_whole_grant(key: str, value: str) -> None:
    bad = f"{NVF}a.gpu-memory.{key}"
    g = nvfractions_grant({bad: value, f"{NVF}b.gpu-memory.limit": "4Gi", f"{NVF}b.gpus.devices": A})
    assert_rejected(g, bad, value)


# --- HAMi ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "by_uuid"),
    [
        (f"{A},NVIDIA,20000,30:;", {A: 20000 * MI}),
        # two containers on one device add up; a container on two devices
        (f"{A},NVIDIA,3000,0:{B},NVIDIA,5000,0:;{A},NVIDIA,1000,10:;", {A: 4000 * MI, B: 5000 * MI}),
        # empty container entries keep positions and add nothing
        (f";{A},NVIDIA,1024,0:;;", {A: 1024 * MI}),
        # a dynamic-MIG slice names its parent GPU: no limit from it
        (f"{A}[1g.10gb-0],NVIDIA,9856,0:;", {}),
        # 0 MiB books no memory: no limit
        (f"{A},NVIDIA,0,100:;", {}),
        ("", {}),
    ],
)
def test_hami_allocated(value: str, by_uuid: dict[str, int]) -> None:
    g = hami_grant({"hami.io/vgpu-devices-allocated": value})
    assert not g.problems
    assert {u: b for u, (b, _) in named(g).items()} == by_uuid
    assert all(src == "hami/hami.io/vgpu-devices-allocated" for _, src in named(g).values())


@pytest.mark.parametrize(
    "value",
    [
        f"{A},NVIDIA,20000:;",  # three fields
        f"{A},NVIDIA,lots,30:;",
        f"{A},NVIDIA,-1,30:;",
        f"{B},NVIDIA,1000,0:;{A},NVIDIA,2000,x:;",  # the second container is bad: nothing applies
        ",NVIDIA,1000,0:;",  # no UUID
    ],
)
def test_hami_allocated_malformed(value: str) -> None:
    assert_rejected(hami_grant({"hami.io/vgpu-devices-allocated": value}), "hami.io/vgpu-devices-allocated", value)


# --- Koordinator ------------------------------------------------------------------------------

KOORD = "scheduling.koordinator.sh/device-allocated"


def koord(*gpus: dict[str, Any]) -> str:
    return json.dumps({"gpu": list(gpus), "rdma": [{"minor": 0, "resources": {"koordinator.sh/rdma": 100}}]})


@pytest.mark.parametrize(
    ("value", "each_"),
    [
        (koord({"minor": 0, "resources": {"koordinator.sh/gpu-memory": "16Gi"}}), 16 * GI),
        # both memory and ratio (as Koordinator writes them): the memory
        (
            koord({"minor": 1, "resources": {"koordinator.sh/gpu-memory": "8Gi", "koordinator.sh/gpu-memory-ratio": 10}}),
            8 * GI,
        ),
        # only a ratio: percent of the device's total (81559 MiB from the node's GFD label)
        (koord({"minor": 0, "resources": {"koordinator.sh/gpu-memory-ratio": 50}}), 81559 * MI // 2),
        # two GPUs: the largest grant applies to each (minors are not UUIDs)
        (
            koord(
                {"minor": 0, "resources": {"koordinator.sh/gpu-memory": "10Gi"}},
                {"minor": 1, "resources": {"koordinator.sh/gpu-memory": "12Gi"}},
            ),
            12 * GI,
        ),
        # no GPU in the allocation
        (json.dumps({"rdma": [{"minor": 0, "resources": {}}]}), None),
        # a GPU with no memory booked beside one with some: no limit on each device
        (
            koord(
                {"minor": 0, "resources": {"koordinator.sh/gpu-memory": "0"}},
                {"minor": 1, "resources": {"koordinator.sh/gpu-memory": "12Gi"}},
            ),
            None,
        ),
    ],
)
def test_koordinator(value: str, each_: int | None) -> None:
    g = koordinator_grant({KOORD: value}, node("gpu-h100-ts"))
    assert not g.problems
    assert (each(g) or (None,))[0] == each_
    assert g.by_device() == {}


def test_koordinator_ratio_without_a_device_size_sets_nothing() -> None:
    g = koordinator_grant({KOORD: koord({"minor": 0, "resources": {"koordinator.sh/gpu-memory-ratio": 50}})}, None)
    assert not g and not g.problems


@pytest.mark.parametrize(
    "value",
    [
        "{not json",
        json.dumps(["gpu"]),
        json.dumps({"gpu": {"minor": 0}}),
        koord({"minor": "zero", "resources": {"koordinator.sh/gpu-memory": "1Gi"}}),
        koord({"minor": 0, "resources": {"koordinator.sh/gpu-memory": "much"}}),
        koord({"minor": 0, "resources": {"koordinator.sh/gpu-memory-ratio": 150}}),
        # one bad GPU of two: nothing applies
        koord(
            {"minor": 0, "resources": {"koordinator.sh/gpu-memory": "1Gi"}},
            {"minor": 1, "resources": {"koordinator.sh/gpu-memory": "1Xi"}},
        ),
    ],
)
def test_koordinator_malformed(value: str) -> None:
    assert_rejected(koordinator_grant({KOORD: value}, node("gpu-h100-ts")), KOORD, value)


# --- KAI ----------------------------------------------------------------------------------------


def reservation(group: str, uuid: str | None, ns: str = "kai-resource-reservation") -> dict[str, Any]:
    ann = {"run.ai/reserve_for_gpu_index": uuid} if uuid else {}
    return {"metadata": {"namespace": ns, "labels": {"runai-gpu-group": group}, "annotations": ann}}


def test_kai_group_devices_from_reservation_pods() -> None:
    pods = [reservation("g1", A), reservation("g2", None), reservation("g3", B, ns="default"), reservation("g4", "3")]
    assert kai_group_devices(pods) == {"g1": A}


def test_kai_grant_names_the_groups_devices() -> None:
    p = pod(annotations={"gpu-memory": "2000"}, labels={"runai-gpu-group": "g1"})
    g = sharer_grants(p, node("gpu-h100-ts"), {"g1": A})
    assert named(g) == {A: (2000 * MI, "kai/gpu-memory")}
    # multi-fraction: one label per device
    p = pod(
        annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"},
        labels={"runai-gpu-group/g1": "g1", "runai-gpu-group/g2": "g2"},
    )
    g = sharer_grants(p, node("gpu-h100-ts"), {"g1": A, "g2": B})
    assert named(g) == {A: (81559 * MI // 2, "kai/gpu-fraction"), B: (81559 * MI // 2, "kai/gpu-fraction")}


def test_kai_grant_without_every_groups_device_names_none() -> None:
    p = pod(annotations={"gpu-memory": "2000"}, labels={"runai-gpu-group/g1": "g1", "runai-gpu-group/g2": "g2"})
    assert not sharer_grants(p, node("gpu-h100-ts"), {"g1": A})


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("gpu-memory", "2Gi"),  # KAI wants a whole number of MiB
        ("gpu-memory", "0"),
        ("gpu-fraction", "1"),  # KAI's binder rejects 1.0: a whole GPU is nvidia.com/gpu
        ("gpu-fraction", "half"),
        ("gpu-fraction-num-devices", "-2"),
    ],
)
def test_kai_malformed_annotations_are_problems(annotation: str, value: str) -> None:
    g = sharer_grants(pod(annotations={annotation: value}, labels={"runai-gpu-group": "g1"}), None, {"g1": A})
    assert not g
    assert len(g.problems) == 1 and annotation in g.problems[0].message and repr(value) in g.problems[0].message


# --- together -----------------------------------------------------------------------------------


def test_one_bad_system_leaves_the_others() -> None:
    ann = {
        "hami.io/vgpu-devices-allocated": f"{A},NVIDIA,1000,0:;",
        KOORD: "{broken",
        f"{NVF}t.gpu-memory.limit": "2Gi",
        f"{NVF}t.gpus.devices": B,
    }
    g = sharer_grants(pod(annotations=ann), node("gpu-h100-ts", [device(A, 81559)]))
    assert {u: b for u, (b, _) in named(g).items()} == {A: 1000 * MI, B: 2 * GI}
    assert [p.reason for p in g.problems] == [EVENT_MALFORMED_ALLOCATION]
    assert KOORD in g.problems[0].message


def test_strictest_grant_per_device() -> None:
    ann = {
        "hami.io/vgpu-devices-allocated": f"{A},NVIDIA,3000,0:;",
        f"{NVF}t.gpu-memory.limit": "2Gi",
        f"{NVF}t.gpus.devices": A,
    }
    assert named(sharer_grants(pod(annotations=ann), None)) == {A: (2 * GI, f"nvfractions/{NVF}t.gpu-memory.limit")}


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({f"{NVF}t.gpu-memory.limit": "2Gi"}, True),
        ({"hami.io/vgpu-devices-allocated": ""}, True),
        ({KOORD: "{}"}, True),
        ({f"{NVF}t.gpus.devices": A, "gpu-memory": "10"}, False),
    ],
)
def test_declares_grant(annotations: dict[str, str], expected: bool) -> None:
    assert declares_grant(annotations) is expected
