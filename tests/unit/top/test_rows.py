"""``vramguard top``'s pure part: rows from pods, budgets, policies and node reports."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import pytest

from vramguard_operator.cli.top.command import parse_settings
from vramguard_operator.cli.top.model import Snapshot
from vramguard_operator.cli.top.render import render, rows_json, trend_text
from vramguard_operator.cli.top.rows import build_rows

GI = 1 << 30
MI = 1 << 20
NOW = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)
USABLE = 81559 * MI - 579 * MI  # an H100 80GB's usable memory
GPU0, GPU1 = "GPU-aaaa", "GPU-bbbb"


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, ns: str = "ml", labels: dict[str, str] | None = None, gpus: int = 1,
        annotations: dict[str, str] | None = None, phase: str = "Running", node: str = "n1") -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {},
                     "annotations": annotations or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": resources}]},
        "status": {"phase": phase},
    }


def usage(name: str, vram: int | None, ram: int | None = None, devices: dict[str, int] | None = None,
          growth: float | None = None, leak: bool | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"uid": f"uid-{name}", "namespace": "ml", "name": name, "attribution": "Measured",
                         "devices": [{"uuid": u, "usedBytes": b} for u, b in (devices or {}).items()]}
    if vram is None:
        p["attribution"] = "Unknown"
    else:
        p["vramBytes"] = vram
    if ram is not None:
        p["ramWorkingSetBytes"] = ram
    if growth is not None:
        p["trend"] = {"windowSeconds": 3600, "samples": 60, "growthBytesPerHour": growth, "leak": leak}
    return p


def report(pods: list[dict[str, Any]], age_s: float = 5, node: str = "n1") -> dict[str, Any]:
    def device(uuid: str, index: int, mig: str | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"uuid": uuid, "index": index, "modelName": "NVIDIA H100 80GB HBM3",
                             "memory": {"totalBytes": 81559 * MI, "reservedBytes": 579 * MI, "usableBytes": USABLE}}
        if mig:
            d["migProfile"] = mig
            d["parentUUID"] = GPU1
        return d

    return {
        "apiVersion": "vramguard.io/v1alpha1", "kind": "NodeGPUUsage",
        "metadata": {"name": node, "uid": f"ngu-{node}"}, "spec": {"nodeName": node},
        "status": {"sampleTime": stamp(NOW - timedelta(seconds=age_s)),
                   "devices": [device(GPU0, 0), device(GPU1, 1)], "pods": pods},
    }


def budget(name: str, limits: dict[str, Any], selector: dict[str, str] | None = None,
           status: dict[str, Any] | None = None, ns: str = "ml", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryBudget",
        "metadata": {"name": name, "namespace": ns, "uid": f"b-{name}", "generation": 1},
        "spec": {"selector": {"matchLabels": selector or {"app": name}}, "limits": limits, **spec},
    }
    if status is not None:
        body["status"] = status
    return body


def violations_annotation(*entries: dict[str, Any]) -> dict[str, str]:
    full = [{"budget": "b", "since": stamp(NOW), "openedAt": stamp(NOW), **e} for e in entries]
    return {"vramguard.io/violations": json.dumps(full)}


def rows_of(snap: Snapshot) -> dict[str, Any]:
    rows, _ = build_rows(snap)
    return {r.pod: r for r in rows}


def test_device_fraction_uses_the_reported_usable_memory_and_the_busiest_device():
    snap = Snapshot(
        pods=[pod("w0", labels={"app": "train"}, gpus=2)],
        budgets=[budget("train", {"perDevice": {"fraction": 0.25}, "perPod": {"vram": "60Gi"}})],
        reports=[report([usage("w0", 30 * GI, devices={GPU0: 26 * GI, GPU1: 4 * GI})])],
        now=NOW,
    )
    (row,) = build_rows(snap)[0]
    dev = next(lim for lim in row.limits if lim.name == "dev")
    assert dev.limit_bytes == int(USABLE * 0.25) and dev.used_bytes == 26 * GI and dev.source == "gmb/train"
    assert row.binding is dev and row.pressure == pytest.approx(26 * GI / int(USABLE * 0.25))
    assert [(d.label, d.used_bytes) for d in row.devices] == [("gpu0", 26 * GI), ("gpu1", 4 * GI)]
    # above the limit, but the operator has recorded nothing: only a warning (it may be within the tolerance)
    assert row.state == "warning" and not row.stale


def test_policy_ceiling_lowers_the_budget_limit_and_names_itself():
    policy = {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryPolicy",
              "metadata": {"name": "strict", "uid": "p1"},
              "spec": {"namespaceSelector": {"matchLabels": {"team": "ml"}}, "ceilings": {"perPod": {"vram": "16Gi"}}}}
    snap = Snapshot(
        pods=[pod("s0", labels={"app": "serve"})],
        budgets=[budget("serve", {"perPod": {"vram": "40Gi", "ram": "8Gi"}})],
        policies=[policy],
        reports=[report([usage("s0", 8 * GI, ram=2 * GI, devices={GPU0: 8 * GI})])],
        namespace_labels={"ml": {"team": "ml"}},
        now=NOW,
    )
    limits = {lim.name: lim for lim in rows_of(snap)["s0"].limits}
    assert (limits["pod"].limit_bytes, limits["pod"].source) == (16 * GI, "policy/strict/ceiling")
    assert (limits["ram"].limit_bytes, limits["ram"].source, limits["ram"].used_bytes) == (8 * GI, "gmb/serve", 2 * GI)
    # another namespace's labels do not bring the ceiling
    other = Snapshot(**{**snap.__dict__, "namespace_labels": {"ml": {"team": "other"}}})
    assert {lim.name: lim.limit_bytes for lim in rows_of(other)["s0"].limits}["pod"] == 40 * GI


def test_implicit_limits_come_from_the_pod_annotation():
    ann = {"vramguard.io/limits": json.dumps({
        "perDevice": {"bytes": 21241528320, "limit": "19.8Gi", "source": "node/time-slicing:4", "detail": "x"}})}
    snap = Snapshot(pods=[pod("nb", annotations=ann)],
                    reports=[report([usage("nb", 19 * GI, devices={GPU0: 19 * GI})])], now=NOW)
    row = rows_of(snap)["nb"]
    (lim,) = row.limits
    assert (lim.name, lim.limit_bytes, lim.used_bytes, lim.source) == ("dev", 21241528320, 19 * GI,
                                                                      "node/time-slicing:4")
    assert row.state == "warning"  # 96% of the share, above the default threshold 85%


def test_device_limits_from_grants_compare_with_their_own_device():
    """A DRA claim's limit on one device (``perDevice[<uuid>]``) is compared with
    that device's usage, not the busiest one; also beside a budget that selects
    the pod (its ``allocation:`` budget)."""
    ann = {"vramguard.io/limits": json.dumps({
        f"perDevice[{GPU0}]": {"bytes": 20 * GI, "limit": "20Gi", "source": "dra/a-gpu-x7k", "detail": "x"},
        f"perDevice[{GPU1}]": {"bytes": 40 * GI, "limit": "40Gi", "source": "dra/a-big", "detail": "x"}})}
    snap = Snapshot(pods=[pod("a", labels={"app": "train"}, annotations=ann)],
                    budgets=[budget("train", {"perPod": {"vram": "100Gi"}})],
                    reports=[report([usage("a", 60 * GI, devices={GPU0: 25 * GI, GPU1: 35 * GI})])], now=NOW)
    row = rows_of(snap)["a"]
    by_source = {lim.source: lim for lim in row.limits}
    assert (by_source["dra/a-gpu-x7k"].limit_bytes, by_source["dra/a-gpu-x7k"].used_bytes) == (20 * GI, 25 * GI)
    assert (by_source["dra/a-big"].limit_bytes, by_source["dra/a-big"].used_bytes) == (40 * GI, 35 * GI)
    assert by_source["gmb/train"].limit_bytes == 100 * GI
    assert row.binding is not None and row.binding.source == "dra/a-gpu-x7k"  # 125%: the binding limit


@pytest.mark.parametrize(
    ("annotations", "state"),
    [
        (violations_annotation({"kind": "PodVRAM", "step": "Annotate"}), "violating"),
        ({**violations_annotation({"kind": "PodVRAM", "step": "Throttle"}),
          "vramguard.io/original-cpu": '{"main":{"limit":"2","request":"2"}}'}, "throttled"),
        ({**violations_annotation({"kind": "Leak", "step": "Throttle"}),
          "vramguard.io/original-cpu": '{"main":{"limit":"2","request":"2"}}'}, "leak"),
        (violations_annotation({"kind": "PodVRAM", "step": None, "openedAt": None}), "ok"),
        ({"vramguard.io/violations": "not json"}, "ok"),
    ],
)
def test_state_from_the_pod_annotations(annotations, state):
    snap = Snapshot(pods=[pod("p", labels={"app": "b"}, annotations=annotations)],
                    budgets=[budget("b", {"perPod": {"vram": "40Gi"}})],
                    reports=[report([usage("p", 10 * GI, devices={GPU0: 10 * GI})])], now=NOW)
    assert rows_of(snap)["p"].state == state


def test_state_from_budget_status_dry_run_pending_and_warnings():
    def status(violations=(), warnings=(), mode="Enforce"):
        return {"effectiveMode": mode, "violations": list(violations), "warnings": list(warnings)}

    base = {"observedBytes": 45 * GI, "limitBytes": 40 * GI, "since": stamp(NOW)}
    snap = Snapshot(
        pods=[pod("a", labels={"app": "dry"}), pod("b", labels={"app": "pend"}), pod("c", labels={"app": "warn"}),
              pod("d", labels={"app": "tot"}), pod("e", labels={"app": "tot"})],
        budgets=[
            budget("dry", {"perPod": {"vram": "40Gi"}},
                   status=status([{**base, "kind": "PodVRAM", "pod": "a", "openedAt": stamp(NOW), "step": "Evict"}],
                                 mode="DryRun")),
            budget("pend", {"perPod": {"vram": "40Gi"}}, status=status([{**base, "kind": "PodVRAM", "pod": "b"}])),
            budget("warn", {"perPod": {"vram": "40Gi"}},
                   status=status(warnings=[{**base, "kind": "PodVRAM", "pod": "c"}])),
            budget("tot", {"total": {"vram": "40Gi"}},
                   status=status([{**base, "kind": "TotalVRAM", "openedAt": stamp(NOW), "step": "Annotate"}])),
        ],
        reports=[report([usage(n, 4 * GI) for n in "abcde"])],
        now=NOW,
    )
    rows = rows_of(snap)
    assert rows["a"].state == "violating" and "dry run" in rows["a"].why[0]
    assert rows["b"].state == "warning" and "pending" in rows["b"].why[0]
    assert rows["c"].state == "warning"
    assert rows["d"].state == rows["e"].state == "violating"
    total = next(lim for lim in rows["d"].limits if lim.name == "total")
    assert total.used_bytes == 8 * GI and total.limit_bytes == 40 * GI  # the sum over both selected pods


def test_rows_sorted_by_state_then_pressure_and_non_gpu_or_finished_pods_left_out():
    leak = violations_annotation({"kind": "Leak", "step": "Annotate"})
    snap = Snapshot(
        pods=[pod("low", labels={"app": "b"}), pod("high", labels={"app": "b"}),
              pod("leaky", labels={"app": "b"}, annotations=leak),
              pod("web", gpus=0), pod("done", labels={"app": "b"}, phase="Succeeded"),
              pod("gpu-no-report", node="n2")],
        budgets=[budget("b", {"perPod": {"vram": "40Gi"}})],
        reports=[report([usage("low", 4 * GI), usage("high", 30 * GI), usage("leaky", 5 * GI, growth=2 * GI,
                                                                                leak=True)])],
        now=NOW,
    )
    rows, _ = build_rows(snap)
    assert [r.pod for r in rows] == ["leaky", "high", "low", "gpu-no-report"]
    missing = rows[-1]
    assert missing.vram_bytes is None and missing.stale and missing.pressure is None


def test_a_pod_holding_only_a_resource_claim_is_listed_before_any_report():
    """A DRA pod requests no GPU resource: its claim makes it a GPU pod, as for the operator's pod watch."""
    rerank = pod("rerank-0", gpus=0, node="n2")
    rerank["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "rerank-gpu"}]
    rows, _ = build_rows(Snapshot(pods=[rerank, pod("web", gpus=0, node="n2")], budgets=[], reports=[], now=NOW))
    assert [r.pod for r in rows] == ["rerank-0"] and rows[0].vram_bytes is None and rows[0].stale


def test_stale_report_is_marked_and_unknown_vram_shown_as_such():
    snap = Snapshot(pods=[pod("p")], reports=[report([usage("p", None)], age_s=300)], now=NOW)
    (row,) = build_rows(snap)[0]
    assert row.stale and row.vram_bytes is None
    text = render([row])
    assert "?*" in text and "no fresh node report" in text


def test_malformed_budget_becomes_a_note_and_the_rest_is_kept():
    bad = budget("bad", {"perPod": {"vram": "lots"}})
    snap = Snapshot(pods=[pod("p", labels={"app": "good"})],
                    budgets=[bad, budget("good", {"perPod": {"vram": "40Gi"}})],
                    reports=[report([usage("p", 4 * GI)])], now=NOW)
    rows, notes = build_rows(snap)
    assert [lim.source for lim in rows[0].limits] == ["gmb/good"]
    assert len(notes) == 1 and "ml/bad" in notes[0]


def test_render_columns_namespace_and_wide():
    snap = Snapshot(pods=[pod("w0", labels={"app": "train"})],
                    budgets=[budget("train", {"perPod": {"vram": "20Gi"}})],
                    reports=[report([usage("w0", 24 * GI, ram=3 * GI, devices={GPU0: 24 * GI}, growth=0.0)])],
                    now=NOW)
    rows, notes = build_rows(snap)
    lines = render(rows, notes).splitlines()
    assert lines[0].split() == [
        "POD", "NODE", "VRAM", "DEVICES", "RAM", "LIMIT", "SOURCE", "USE", "TREND", "STATE", "DIAGNOSIS"
    ]
    assert lines[1].split() == ["w0", "n1", "24Gi", "gpu0:24Gi", "3Gi", "pod", "20Gi", "gmb/train", "120%", "flat",
                                "warning", "VRAMShort"]
    assert render(rows, all_namespaces=True).splitlines()[1].startswith("ml ")
    wide = render(rows, wide=True).splitlines()
    assert wide[0].split()[-5:] == ["LIMITS", "CAPS", "LAST", "OOM", "WHY"] and "pod 20Gi (gmb/train)" in wide[1]
    assert json.loads(json.dumps(rows_json(rows)))[0]["limits"][0]["ratio"] == pytest.approx(1.2)


def test_the_diagnosis_column_names_which_memory_is_the_problem():
    ram_leak = usage("loader", 8 * GI, ram=20 * GI, devices={GPU0: 8 * GI}, growth=0.0, leak=False)
    ram_leak["ramTrend"] = {"windowSeconds": 3600, "samples": 60, "growthBytesPerHour": GI, "leak": True}
    pods = {"calm": usage("calm", 8 * GI, ram=2 * GI, devices={GPU0: 8 * GI}), "loader": ram_leak,
            "short": usage("short", 8 * GI, ram=30 * GI, devices={GPU0: 8 * GI}), "unknown": usage("unknown", None)}
    snap = Snapshot(pods=[pod(n, labels={"app": "train"}) for n in pods],
                    budgets=[budget("train", {"perPod": {"vram": "20Gi", "ram": "32Gi"}})],
                    reports=[report(list(pods.values()))], now=NOW)
    rows, _ = build_rows(snap)
    assert {r.pod: r.diagnosis for r in rows} == {"calm": "OK", "loader": "RAMLeak", "short": "RAMShort", "unknown": None}
    assert {d["pod"]: d["diagnosis"] for d in rows_json(rows)}["loader"] == "RAMLeak"


@pytest.mark.parametrize(
    ("growth", "text"),
    [(None, "-"), (0.0, "flat"), (-10 * MI, "flat"), (2 * GI, "+2Gi/h"), (-300 * MI, "-300Mi/h")],
)
def test_trend_text(growth, text):
    assert trend_text(growth) == text


def test_flags():
    args = parse_settings(["-A", "--watch", "--interval", "5s", "-o", "wide"])
    assert (args.all_namespaces, args.watch, args.interval, args.output) == (True, True, 5.0, "wide")
    assert parse_settings(["-n", "ml"]).namespace == "ml"
    with pytest.raises(click.UsageError):
        parse_settings(["-n", "ml", "-A"])
    with pytest.raises(click.UsageError):
        parse_settings(["--interval", "soon"])


def test_budget_totals_are_per_namespace_when_two_budgets_share_a_name():
    """With -A, budget ``train`` in ``ml`` and in ``cv`` each total their own pods."""
    ml, cv = usage("a", 30 * GI), {**usage("b", 5 * GI), "namespace": "cv"}
    snap = Snapshot(
        pods=[pod("a", labels={"app": "train"}), pod("b", ns="cv", labels={"app": "train"})],
        budgets=[budget("train", {"total": {"vram": "40Gi"}}), budget("train", {"total": {"vram": "40Gi"}}, ns="cv")],
        reports=[report([ml, cv])],
        now=NOW,
    )
    rows = rows_of(snap)
    assert [lim.used_bytes for lim in rows["a"].limits if lim.name == "total"] == [30 * GI]
    assert [lim.used_bytes for lim in rows["b"].limits if lim.name == "total"] == [5 * GI]


def test_caps_show_what_the_agent_holds_else_what_is_asked_and_unsupported_devices():
    held = {"uuid": GPU0, "state": "Applied", "reason": "Applied", "hardLimitBytes": 45 * GI,
            "softLimitBytes": 20 * GI, "currentUsedBytes": 44 * GI}
    capped = usage("w0", 44 * GI, devices={GPU0: 44 * GI})
    capped["memoryLimits"] = [held]
    asked = pod("w1", annotations={"vramguard.io/memory-limits": json.dumps({GPU1: {"softLimit": 20 * GI}})})
    rep = report([capped, usage("w1", 1 * GI, devices={GPU1: GI}), usage("w2", 2 * GI, devices={GPU1: 2 * GI})])
    rep["status"]["devices"][1].update(memoryLimits="Unsupported", memoryLimitsReason="DriverTooOld")
    snap = Snapshot(pods=[pod("w0"), asked, pod("w2")], reports=[rep], now=NOW)
    rows = rows_of(snap)
    assert rows["w0"].state == "capped" and rows["w1"].state == "ok"
    wide = {line.split()[0]: line for line in render(list(rows.values()), wide=True).splitlines()}
    assert "gpu0 hard 45Gi soft 20Gi Applied" in wide["w0"]
    assert "gpu1 soft 20Gi Wanted (NotReported)" in wide["w1"]
    assert "gpu1 Unsupported (DriverTooOld)" in wide["w2"]
    assert rows_json([rows["w0"]])[0]["caps"][0]["hard_bytes"] == 45 * GI
