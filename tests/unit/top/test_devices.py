"""``vramguard top``'s device-pressure table: devices under a rule, their free
memory against the rule's minimum, and what vramguard does there."""

from __future__ import annotations

from typing import Any

from vramguard_operator.cli.top.devices import build_devices
from vramguard_operator.cli.top.model import Snapshot
from vramguard_operator.cli.top.render import devices_json, render

from .test_rows import GI, GPU0, NOW, USABLE, budget, pod, report, stamp, usage

POLICY = {
    "apiVersion": "vramguard.io/v1alpha1",
    "kind": "GPUMemoryPolicy",
    "metadata": {"name": "fleet", "uid": "p1"},
    "spec": {"devicePressure": {"minFree": "5%"}},
}


def squeezed(used_gi: float, **kw: Any) -> dict[str, Any]:
    rep = report([usage("finetune-0", 56 * GI, devices={GPU0: 56 * GI}), usage("chat", 15 * GI, devices={GPU0: 15 * GI})],
                 **kw)
    rep["status"]["devices"][0]["memory"]["usedBytes"] = int(used_gi * GI)
    return rep


PODS = [pod("finetune-0", labels={"app": "finetune"}), pod("chat", labels={"app": "chat"})]


def test_a_device_under_pressure_and_the_pod_being_evicted() -> None:
    status = {"violations": [{"kind": "DevicePressure", "pod": "finetune-0", "device": GPU0, "observedBytes": 1,
                              "limitBytes": 1, "since": stamp(NOW), "step": "Evict"}]}
    snap = Snapshot(pods=PODS, budgets=[budget("finetune", {"perDevice": {"fraction": 0.25}}, status=status)],
                    policies=[POLICY], reports=[squeezed(USABLE / GI - 3)], now=NOW)
    [d] = build_devices(snap)
    assert (d.label, d.state, d.action, d.pods) == ("gpu0", "pressure", "evicting finetune-0", ("chat", "finetune-0"))
    assert d.free_bytes == 3 * GI and d.min_free_bytes == int(USABLE * 0.05)
    assert d.rule == "5% (policy/fleet)"
    text = render([], devices=[d])
    assert "MIN FREE" in text and "evicting finetune-0" in text
    assert devices_json([d])[0]["pods"] == ["chat", "finetune-0"]


def test_a_budget_override_and_enough_free_memory() -> None:
    strict = budget("chat", {"perDevice": {"fraction": 0.25}}, devicePressure={"minFree": "10Gi"})
    snap = Snapshot(pods=PODS, budgets=[strict], policies=[POLICY], reports=[squeezed(USABLE / GI - 12)], now=NOW)
    [d] = build_devices(snap)
    assert (d.state, d.min_free_bytes, d.rule, d.action) == ("ok", 10 * GI, "10Gi (gmb/chat)", "-")


def test_no_rule_no_row_and_unknown_or_stale_data() -> None:
    assert build_devices(Snapshot(pods=PODS, reports=[squeezed(70)], now=NOW)) == []
    rep = squeezed(78)
    rep["status"]["devices"][0]["processesComplete"] = False
    [d] = build_devices(Snapshot(pods=PODS, policies=[POLICY], reports=[rep], now=NOW))
    assert d.state == "unknown"
    [d] = build_devices(Snapshot(pods=PODS, policies=[POLICY], reports=[squeezed(78, age_s=600)], now=NOW))
    assert d.state == "stale"


def test_a_terminating_pod_is_waited_for() -> None:
    gone = pod("finetune-0", labels={"app": "finetune"})
    gone["metadata"]["deletionTimestamp"] = stamp(NOW)
    snap = Snapshot(pods=[gone, PODS[1]], policies=[POLICY], reports=[squeezed(USABLE / GI - 1)], now=NOW)
    [d] = build_devices(snap)
    assert d.action == "waiting for finetune-0"


def test_the_room_a_pod_within_its_share_needs() -> None:
    from vramguard_operator.cli.top.rows import build_rows

    chat_budget = budget("chat", {"perDevice": {"fraction": 0.25}})
    snap = Snapshot(pods=PODS, budgets=[chat_budget], policies=[POLICY], reports=[squeezed(USABLE / GI - 5)],
                    now=NOW)
    rows, _ = build_rows(snap)
    [d] = build_devices(snap, rows)
    room = int(USABLE * 0.25) - 15 * GI  # chat's share less what it holds
    assert (d.min_free_bytes, d.state, d.rule) == (room, "ok", "5% (policy/fleet); room for chat")
    assert build_devices(snap)[0].min_free_bytes == int(USABLE * 0.05)  # without the rows: minFree alone
    tight = Snapshot(**{**snap.__dict__, "reports": [squeezed(USABLE / GI - 4.5)]})
    assert build_devices(tight, build_rows(tight)[0])[0].state == "pressure"
