"""Each limit kind, table-driven: which violation opens (Annotate at once) for
which usage, and which stays quiet."""

from __future__ import annotations

import pytest

from vramguard_operator.engine.types import Annotate

from .builders import GI, TWO_GPUS, at, budget, pod, report, run, vram

MIG = [
    {
        "uuid": "GPU-0",
        "index": 0,
        "migEnabled": True,
        "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI},
    },
    {
        "uuid": "MIG-a",
        "index": 0,
        "parentUUID": "GPU-0",
        "migProfile": "3g.40gb",
        "memory": {"totalBytes": 40 * GI, "reservedBytes": 0, "usableBytes": 39 * GI},
    },
]
VGPU = [
    {
        "uuid": "GPU-v",
        "index": 0,
        "virtualizationMode": "VGPU",
        "memory": {"totalBytes": 24 * GI, "reservedBytes": 2 * GI, "usableBytes": 22 * GI},
    },
]

CASES = [
    # id, budget kwargs, pod usages {name: fields}, devices, expected {(kind, pod, device)}
    ("pod-vram-over", {"per_pod": {"vram": "40Gi"}}, {"w0": vram(41), "w1": vram(39)}, None, {("PodVRAM", "w0", None)}),
    ("pod-vram-at-limit", {"per_pod": {"vram": "40Gi"}}, {"w0": vram(40)}, None, set()),
    (
        "pod-ram-over",
        {"per_pod": {"ram": "64Gi"}},
        {"w0": {"ramWorkingSetBytes": 65 * GI}, "w1": {"ramWorkingSetBytes": 10 * GI}},
        None,
        {("PodRAM", "w0", None)},
    ),
    (
        "device-bytes",
        {"per_device": {"vram": "20Gi"}},
        {
            "w0": {
                "vramBytes": 30 * GI,
                "devices": [{"uuid": "GPU-0", "usedBytes": 15 * GI}, {"uuid": "GPU-1", "usedBytes": 15 * GI}],
            },
            "w1": {"vramBytes": 21 * GI, "devices": [{"uuid": "GPU-0", "usedBytes": 21 * GI}]},
        },
        TWO_GPUS,
        {("DeviceVRAM", "w1", "GPU-0")},
    ),
    (
        "device-fraction-of-usable",
        {"per_device": {"fraction": 0.5}},
        # 0.5 x 22Gi usable (24Gi total, 2Gi reserved) = 11Gi: 11.5Gi is over, though under half of 24Gi
        {"w0": vram(11.5, "GPU-v")},
        VGPU,
        {("DeviceVRAM", "w0", "GPU-v")},
    ),
    ("device-fraction-under", {"per_device": {"fraction": 0.5}}, {"w0": vram(10.9, "GPU-v")}, VGPU, set()),
    (
        "mig-device-own-memory",
        {"per_device": {"fraction": 0.5}},
        # half of the MIG device's 39Gi, not of the parent's 80Gi
        {"w0": vram(20, "MIG-a")},
        MIG,
        {("DeviceVRAM", "w0", "MIG-a")},
    ),
    ("device-unknown-usable", {"per_device": {"fraction": 0.5}}, {"w0": vram(70, "GPU-x")}, None, set()),
    (
        "total-vram",
        {"total": {"vram": "60Gi"}},
        {"w0": vram(31), "w1": vram(30)},
        None,
        {("TotalVRAM", "w0", None), ("TotalVRAM", "w1", None)},
    ),
    ("total-vram-under", {"total": {"vram": "60Gi"}}, {"w0": vram(30), "w1": vram(30)}, None, set()),
    (
        "total-ram",
        {"total": {"ram": "100Gi"}},
        {"w0": {"ramWorkingSetBytes": 60 * GI}, "w1": {"ramWorkingSetBytes": 41 * GI}},
        None,
        {("TotalRAM", "w0", None), ("TotalRAM", "w1", None)},
    ),
    (
        "several-kinds",
        {"per_pod": {"vram": "40Gi", "ram": "8Gi"}, "total": {"vram": "70Gi"}},
        {"w0": vram(41, ramWorkingSetBytes=9 * GI), "w1": vram(30)},
        None,
        {("PodVRAM", "w0", None), ("PodRAM", "w0", None), ("TotalVRAM", "w0", None), ("TotalVRAM", "w1", None)},
    ),
]


@pytest.mark.parametrize(
    ("budget_kw", "usage", "devices", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_limit_kinds(budget_kw, usage, devices, expected):
    out = run([budget(**budget_kw)], [pod("w0"), pod("w1")], [report("node-a", at(0), usage, devices=devices)], at(0))
    got = {(d.violation.kind, d.pod.name, d.violation.device) for d in out.decisions if isinstance(d, Annotate)}
    assert got == expected
    status = out.statuses[0].status
    assert status.open_violations == len({(k, p if not k.startswith("Total") else None, dv) for k, p, dv in expected})


def test_decision_values_are_the_measured_value_and_the_limit():
    out = run(
        [budget(per_device={"fraction": 0.5})],
        [pod("w0")],
        [report("node-a", at(0), {"w0": vram(11.5, "GPU-v")}, devices=VGPU)],
        at(0),
    )
    (d,) = out.decisions
    assert d.observed_bytes == int(11.5 * GI)
    assert d.limit_bytes == 11 * GI
    assert "11.5Gi" in d.event.message and "11Gi" in d.event.message


def test_only_selected_pods_in_the_budget_namespace_count():
    pods = [pod("w0"), pod("other", labels={"app": "serve"}), pod("w9", ns="elsewhere")]
    usage = {"w0": vram(10), "other": vram(70), "w9": vram(70)}
    out = run([budget(per_pod={"vram": "40Gi"}, total={"vram": "50Gi"})], pods, [report("node-a", at(0), usage)], at(0))
    assert out.decisions == ()
    assert out.statuses[0].status.matched_pods == 1
    assert out.evaluated_pairs == 1


def test_finished_and_pending_pods_are_not_evaluated():
    pods = [pod("w0", phase="Succeeded"), pod("w1", phase="Pending"), pod("w2")]
    usage = {"w0": vram(70), "w1": vram(70), "w2": vram(1)}
    out = run([budget(per_pod={"vram": "40Gi"})], pods, [report("node-a", at(0), usage)], at(0))
    assert out.decisions == ()
    assert out.statuses[0].status.matched_pods == 2  # Pending counts as matched, Succeeded not
