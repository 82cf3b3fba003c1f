"""The desired budget status: conditions, usage, violations, warnings."""

from __future__ import annotations

import json

from vramguard_operator.engine.budget_status import status_changed
from vramguard_operator.engine.types import EngineConfig

from .builders import GI, TWO_GPUS, at, budget, pod, report, run, simulate, stale_selector, steps, vram


def conds(status):
    return {c.type: (c.status, c.reason) for c in status.conditions}


def test_quiet_budget_status():
    b = budget(per_pod={"vram": "40Gi"}, total={"vram": "60Gi", "ram": "100Gi"}, generation=7)
    usage = {"w0": vram(20.5, ramWorkingSetBytes=3 * GI), "w1": vram(20, ramWorkingSetBytes=1 * GI)}
    out = run([b], [pod("w0"), pod("w1")], [report("node-a", at(0), usage)], at(0))
    st = out.statuses[0].status
    assert st.observed_generation == 7
    assert all(c.observed_generation == 7 and c.last_transition_time == at(0) for c in st.conditions)
    assert conds(st) == {
        "Ready": ("True", "Valid"),
        "Violating": ("False", "NoViolations"),
        "Warning": ("False", "BelowWarningThreshold"),
        "DataStale": ("False", "ReportsFresh"),
    }
    assert st.matched_pods == 2 and st.open_violations == 0 and st.violations is None
    assert (st.usage.vram_bytes, st.usage.ram_bytes) == (int(40.5 * GI), 4 * GI)
    assert (st.usage.vram, st.usage.ram) == ("40.5Gi/60Gi", "4Gi/100Gi")
    assert st.effective_mode == "Enforce"


def test_usage_display_without_a_total_limit():
    out = run([budget(per_pod={"vram": "40Gi"})], [pod("w0")], [report("node-a", at(0), {"w0": vram(41)})], at(0))
    assert out.statuses[0].status.usage.vram == "41Gi"


def test_violating_condition_and_violation_entries():
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, _ = simulate(
        [b], [pod("w0"), pod("w1")], [(0, {"w0": vram(41), "w1": vram(1)}), (300, {"w0": vram(42), "w1": vram(1)})]
    )
    st = budgets[0].status
    assert conds(st)["Violating"] == ("True", "LimitExceeded")
    (v,) = st.violations
    assert (v.kind, v.pod, v.observed_bytes, v.limit_bytes) == ("PodVRAM", "w0", 42 * GI, 40 * GI)
    assert (v.since, v.opened_at, v.step, v.step_time) == (at(0), at(0), "Throttle", at(300))
    assert (v.next_step, v.next_step_time) == ("Evict", at(600))
    violating = next(c for c in st.conditions if c.type == "Violating")
    assert violating.last_transition_time == at(0) and "w0" in violating.message


def test_last_transition_time_moves_only_on_a_status_change():
    b = budget(per_pod={"vram": "40Gi"})
    timeline = [(0, {"w0": vram(10)}), (60, {"w0": vram(41)}), (120, {"w0": vram(42)}), (180, {"w0": vram(10)})]
    times = []
    for i in range(1, len(timeline) + 1):
        _, budgets, _ = simulate([b], [pod("w0")], timeline[:i])
        c = next(c for c in budgets[0].status.conditions if c.type == "Violating")
        times.append((c.status, c.last_transition_time))
    assert times == [("False", at(0)), ("True", at(60)), ("True", at(60)), ("False", at(180))]


def test_status_unchanged_when_nothing_changed():
    b = budget(per_pod={"vram": "40Gi"})
    _, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    out = run(budgets, pods, [report("node-a", at(30), {"w0": vram(41)})], at(30))
    assert not status_changed(budgets[0].status, out.statuses[0].status)
    out = run(budgets, pods, [report("node-a", at(30), {"w0": vram(41.5)})], at(30))
    assert status_changed(budgets[0].status, out.statuses[0].status)
    assert status_changed(None, out.statuses[0].status)


def test_status_changed_compares_with_the_status_as_read_from_the_api():
    b = budget(per_pod={"vram": "40Gi"})
    _, budgets, pods = simulate([b], [pod("w0")], [(0, {"w0": vram(41)})])
    as_read = json.loads(json.dumps(budgets[0].status.to_api()))  # what the API server returns
    out = run(budgets, pods, [report("node-a", at(30), {"w0": vram(41)})], at(30))
    assert not status_changed(as_read, out.statuses[0].status)
    out = run(budgets, pods, [report("node-a", at(30), {"w0": vram(41.5)})], at(30))
    assert status_changed(as_read, out.statuses[0].status)


def test_warning_threshold_event_and_condition():
    b = budget(per_pod={"vram": "40Gi"}, warning=0.8)
    timeline = [
        (0, {"w0": vram(30)}),  # 75%: quiet
        (60, {"w0": vram(33)}),  # 82.5%: Warn
        (120, {"w0": vram(34)}),  # still above: no second Warn
        (180, {"w0": vram(31.5)}),  # 78.75%: within the 2% margin below 80%: still warned
        (240, {"w0": vram(30)}),  # 75%: cleared
        (300, {"w0": vram(33)}),  # crosses again: Warn again
    ]
    events, budgets, _ = simulate([b], [pod("w0")], timeline)
    assert steps(events) == [(60, "Warn", "w0"), (300, "Warn", "w0")]
    warn = events[0][1]
    assert warn.threshold == 0.8 and "82%" in warn.event.message and "40Gi" in warn.event.message
    assert warn.event.reason == "AboveWarningThreshold"
    st = budgets[0].status
    assert conds(st)["Warning"] == ("True", "AboveWarningThreshold")
    (w,) = st.warnings
    assert (w.kind, w.pod, w.since) == ("PodVRAM", "w0", at(300))


def test_warning_gives_way_to_a_violation():
    b = budget(per_pod={"vram": "40Gi"})
    events, budgets, _ = simulate([b], [pod("w0")], [(0, {"w0": vram(35)}), (60, {"w0": vram(41)})])
    assert steps(events) == [(0, "Warn", "w0"), (60, "Annotate", "w0")]
    assert budgets[0].status.warnings is None
    assert conds(budgets[0].status)["Warning"] == ("False", "BelowWarningThreshold")


def test_total_warning_has_no_pod():
    b = budget(total={"vram": "60Gi"})
    events, budgets, _ = simulate([b], [pod("w0"), pod("w1")], [(0, {"w0": vram(26), "w1": vram(26)})])
    assert steps(events) == [(0, "Warn", None)]


def test_invalid_selector_is_reported_and_nothing_decided():
    b = budget(per_pod={"vram": "40Gi"})
    b.spec.selector = stale_selector({"key": "app", "operator": "In", "values": []})
    out = run([b], [pod("w0")], [report("node-a", at(0), {"w0": vram(70)})], at(0))
    assert out.decisions == ()
    (ready,) = out.statuses[0].status.conditions
    assert (ready.type, ready.status, ready.reason) == ("Ready", "False", "InvalidSpec")
    assert "matchExpressions[0]" in ready.message


def test_warnings_beyond_the_status_bound_raise_no_event_and_are_counted():
    b = budget(per_pod={"vram": "40Gi"})
    pods = [pod("w0"), pod("w1"), pod("w2")]
    usage = {"w0": vram(35), "w1": vram(36, "GPU-1"), "w2": vram(37)}
    config = EngineConfig(max_status_entries=2)
    events, budgets, _ = simulate([b], pods, [(t, usage) for t in (0, 60, 120)], TWO_GPUS, config=config)
    # the two highest shares are kept and warned once; the third is neither stored nor re-warned
    assert steps(events) == [(0, "Warn", "w2"), (0, "Warn", "w1")]
    st = budgets[0].status
    assert [w.pod for w in st.warnings] == ["w2", "w1"]
    warning = next(c for c in st.conditions if c.type == "Warning")
    assert warning.status == "True" and warning.message.endswith("and 1 more")
