"""No action on stale or unknown data, and the DataStale condition."""

from __future__ import annotations

from datetime import timedelta

import pytest

from vramguard_operator.engine.types import EngineConfig

from .builders import GI, apply, at, budget, pod, report, run, simulate, vram


def cond(status, type_):
    return next(c for c in status.conditions if c.type == type_)


def test_stale_report_means_no_action_and_data_stale():
    b = budget(per_pod={"vram": "40Gi"})
    out = run([b], [pod("w0")], [report("node-a", at(0), {"w0": vram(70)})], at(61))
    assert out.decisions == () and out.pod_patches == ()
    st = out.statuses[0].status
    c = cond(st, "DataStale")
    assert (c.status, c.reason) == ("True", "ReportStale") and "node-a" in c.message
    assert st.usage.vram_bytes is None


def test_freshness_bound_is_configurable():
    b = budget(per_pod={"vram": "40Gi"})
    rep = [report("node-a", at(0), {"w0": vram(70)})]
    assert run([b], [pod("w0")], rep, at(100), config=EngineConfig(freshness_seconds=120)).decisions
    assert not run([b], [pod("w0")], rep, at(100), config=EngineConfig(freshness_seconds=90)).decisions
    assert run([b], [pod("w0")], rep, at(60)).decisions  # exactly at the default 60s bound: fresh


def test_missing_report():
    b = budget(per_pod={"vram": "40Gi"})
    out = run([b], [pod("w0", node="node-b")], [report("node-a", at(0), {"w0": vram(70)})], at(0))
    assert out.decisions == ()
    c = cond(out.statuses[0].status, "DataStale")
    assert (c.status, c.reason) == ("True", "ReportMissing") and "node-b" in c.message


def test_stale_data_pauses_an_open_violation_without_closing_it():
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    # the report stops at t=0; at t=400 Throttle would be due, but the data is stale
    out = run(budgets, pods, [report("node-a", at(0), {"w0": vram(41)})], at(400))
    assert out.decisions == ()
    st = out.statuses[0].status
    assert st.open_violations == 1 and "paused" in st.violations[0].message
    budgets, pods = apply(out, budgets, pods)
    # fresh again and still above: the overdue Throttle fires now
    out = run(budgets, pods, [report("node-a", at(460), {"w0": vram(41)})], at(460))
    assert [d.action for d in out.decisions] == ["Throttle"]
    assert cond(out.statuses[0].status, "DataStale").status == "False"


UNKNOWN = [
    # id, pod usage, expected kinds acted on (perPod vram 40Gi, ram 8Gi)
    (
        "attribution-unknown-ram-measured",
        {"attribution": "Unknown", "vramBytes": 70 * GI, "ramWorkingSetBytes": 9 * GI},
        {"PodRAM"},
    ),
    ("vram-none", {"ramWorkingSetBytes": 9 * GI}, {"PodRAM"}),
    ("device-usage-none", {"vramBytes": 41 * GI, "devices": [{"uuid": "GPU-0"}]}, {"PodVRAM"}),
    ("measured", {"vramBytes": 41 * GI, "ramWorkingSetBytes": 1 * GI}, {"PodVRAM"}),
]


@pytest.mark.parametrize(("usage", "kinds"), [u[1:] for u in UNKNOWN], ids=[u[0] for u in UNKNOWN])
def test_unknown_attribution(usage, kinds):
    b = budget(per_pod={"vram": "40Gi", "ram": "8Gi"}, per_device={"vram": "20Gi"})
    out = run([b], [pod("w0")], [report("node-a", at(0), {"w0": usage})], at(0))
    assert {d.violation.kind for d in out.decisions} == kinds


def test_total_with_a_member_on_stale_data_takes_no_action():
    b = budget(total={"vram": "60Gi"})
    pods = [pod("w0"), pod("w1", node="node-b")]
    reports = [report("node-a", at(0), {"w0": vram(70)}), report("node-b", at(-300), {"w1": vram(1)})]
    out = run([b], pods, reports, at(0))
    assert out.decisions == ()
    st = out.statuses[0].status
    assert cond(st, "DataStale").status == "True"
    assert st.usage.vram_bytes == 70 * GI  # what is known is still shown


def test_total_with_a_member_of_unknown_attribution_takes_no_action():
    b = budget(total={"vram": "60Gi"})
    usage = {"w0": vram(70), "w1": {"attribution": "Unknown"}}
    assert run([b], [pod("w0"), pod("w1")], [report("node-a", at(0), usage)], at(0)).decisions == ()


def test_pod_absent_from_a_complete_report_holds_no_vram():
    b = budget(total={"vram": "60Gi"})
    pods = [pod("w0"), pod("w1")]
    out = run([b], pods, [report("node-a", at(0), {"w0": vram(61)})], at(0))
    assert [(d.action, d.pod.name, d.observed_bytes) for d in out.decisions] == [
        ("Annotate", "w0", 61 * GI),
        ("Annotate", "w1", 61 * GI),
    ]
    # a truncated report cannot say so: unknown, no action on the total
    out = run([b], pods, [report("node-a", at(0), {"w0": vram(61)}, truncated=True)], at(0))
    assert out.decisions == ()


def test_report_from_the_future_within_the_bound_counts_as_fresh():
    b = budget(per_pod={"vram": "40Gi"})
    out = run([b], [pod("w0")], [report("node-a", at(5), {"w0": vram(41)})], at(0))
    assert [d.action for d in out.decisions] == ["Annotate"]
    out = run([b], [pod("w0")], [report("node-a", at(60), {"w0": vram(41)})], at(0))
    assert [d.action for d in out.decisions] == ["Annotate"]


def test_report_further_in_the_future_than_the_bound_is_stale():
    # clock skew beyond the freshness bound: the sample time cannot be trusted
    b = budget(per_pod={"vram": "40Gi"})
    out = run([b], [pod("w0")], [report("node-a", at(61), {"w0": vram(41)})], at(0))
    assert out.decisions == ()
    c = cond(out.statuses[0].status, "DataStale")
    assert (c.status, c.reason) == ("True", "ReportStale") and "node-a" in c.message


GPU0 = {"uuid": "GPU-0", "index": 0, "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI}}
GPU1 = {**GPU0, "uuid": "GPU-1", "index": 1}
INCOMPLETE = [
    ("processes-incomplete", [GPU0, {**GPU1, "processesComplete": False}]),
    ("device-lost", [GPU0, {**GPU1, "health": "Lost", "error": "GPU is lost"}]),
    ("device-error", [{**GPU0, "health": "Error", "error": "NVML_ERROR_UNKNOWN"}]),
]


@pytest.mark.parametrize("devices", [c[1] for c in INCOMPLETE], ids=[c[0] for c in INCOMPLETE])
def test_pod_absent_from_an_incomplete_report_is_unknown(devices):
    # a device whose processes are not all known (or that cannot be read) may hold
    # the absent pod's VRAM: no action on the total ...
    b = budget(total={"vram": "60Gi"})
    pods = [pod("w0"), pod("w1")]
    out = run([b], pods, [report("node-a", at(0), {"w0": vram(61)}, devices=devices)], at(0))
    assert out.decisions == ()
    assert out.statuses[0].status.usage.vram_bytes == 61 * GI
    # ... and no closing of the absent pod's open violation
    b = budget(per_pod={"vram": "40Gi"})
    _, budgets, pods = simulate([b], [pod("w1")], [(0, {"w1": vram(41)})])
    out = run(budgets, pods, [report("node-a", at(60), {}, devices=devices)], at(60))
    assert out.decisions == () and out.statuses[0].status.open_violations == 1


def test_naive_now_is_rejected():
    b = budget(per_pod={"vram": "40Gi"})
    with pytest.raises(ValueError, match="naive"):
        run([b], [pod("w0")], [report("node-a", at(0), {})], at(0).replace(tzinfo=None))


def test_stale_pod_keeps_other_pods_acting():
    b = budget(per_pod={"vram": "40Gi"})
    pods = [pod("w0"), pod("w1", node="node-b")]
    timeline_reports = [
        report("node-a", at(0), {"w0": vram(41)}),
        report("node-b", at(0) - timedelta(minutes=5), {"w1": vram(41)}),
    ]
    out = run([b], pods, timeline_reports, at(0))
    assert [(d.action, d.pod.name) for d in out.decisions] == [("Annotate", "w0")]
