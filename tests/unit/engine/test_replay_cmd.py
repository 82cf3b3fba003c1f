"""``vramguard replay`` on the shipped example and on generated recordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vramguard_operator.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "replay"
GI = 1 << 30


def replay(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["replay", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_example_json_shows_the_whole_ladder(capsys):
    rc, out, _ = replay(
        capsys, "--budget", str(EXAMPLE / "budget.yaml"), "--usage", str(EXAMPLE / "usage.csv"), "--json"
    )
    assert rc == 0
    decisions = json.loads(out)["decisions"]
    assert all(
        set(d) == {"t_seconds", "pod", "action", "violation", "observed_bytes", "limit_bytes", "message", "dry_run"}
        for d in decisions
    )
    assert "worker-0" in decisions[1]["message"] and decisions[1]["dry_run"] is False
    assert [(d["t_seconds"], d["pod"], d["action"]) for d in decisions] == [
        (180, "worker-0", "Warn"),
        (360, "worker-0", "Annotate"),  # 21Gi at 240s is within the 10% overshoot: opens after 2m
        (480, "worker-1", "Annotate"),  # 24Gi is above the overshoot: at once
        (660, "worker-0", "Throttle"),
        (780, "worker-1", "Throttle"),
        (840, "worker-1", "Recover"),
        (960, "worker-0", "Evict"),
    ]
    assert {d["violation"] for d in decisions} == {"PodVRAM"}
    annotate = decisions[1]
    assert (annotate["observed_bytes"], annotate["limit_bytes"]) == (23 * GI, 20 * GI)


def test_example_table(capsys):
    rc, out, _ = replay(capsys, "--budget", str(EXAMPLE / "budget.yaml"), "--usage", str(EXAMPLE / "usage.csv"))
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["T_SECONDS", "POD", "ACTION", "VIOLATION", "OBSERVED", "LIMIT"]
    assert lines[4].split()[:6] == ["660", "worker-0", "Throttle", "PodVRAM", "23Gi", "20Gi"]
    assert "CPU limit set to 200m" in lines[4]
    assert len(lines) == 10  # the table, then each pod's leak verdict
    assert [line.split(":")[0] for line in lines[8:]] == ["worker-0", "worker-1"]


def write(tmp_path: Path, budget: dict, rows: list[str]) -> tuple[str, str]:
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump(budget))
    u = tmp_path / "u.csv"
    u.write_text("\n".join(rows) + "\n")
    return str(b), str(u)


BUDGET = {
    "apiVersion": "vramguard.io/v1alpha1",
    "kind": "GPUMemoryBudget",
    "metadata": {"name": "b"},
    "spec": {
        "selector": {
            "matchExpressions": [
                {"key": "app", "operator": "In", "values": ["x"]},
                {"key": "canary", "operator": "DoesNotExist"},
            ]
        },
        "limits": {"perPod": {"ram": "8Gi"}, "total": {"vram": "10Gi"}},
        "enforcement": {"mode": "DryRun"},
    },
}


def test_ram_and_totals_in_dry_run_without_ram_column_for_vram(tmp_path, capsys):
    rows = [
        "t_seconds,pod,vram_bytes,ram_bytes",
        f"0,a,{6 * GI},{9 * GI}",
        f"0,b,{5 * GI},",
        f"60,a,{1 * GI},{1 * GI}",
        f"60,b,{1 * GI},",
    ]
    b, u = write(tmp_path, BUDGET, rows)
    rc, out, _ = replay(capsys, "--budget", b, "--usage", u, "--json")
    assert rc == 0
    got = [(d["t_seconds"], d["pod"], d["action"], d["violation"]) for d in json.loads(out)["decisions"]]
    assert got == [
        (0, "a", "Annotate", "PodRAM"),
        (0, "a", "Annotate", "TotalVRAM"),
        (0, "b", "Annotate", "TotalVRAM"),
        (60, "a", "Recover", "PodRAM"),
        (60, None, "Recover", "TotalVRAM"),
    ]
    rc, table, _ = replay(capsys, "--budget", b, "--usage", u)
    assert "Annotate (dry run)" in table and "(total)" in table


def test_csv_without_ram_column(tmp_path, capsys):
    budget = {**BUDGET, "spec": {**BUDGET["spec"], "limits": {"perPod": {"vram": "1Gi"}}}}
    b, u = write(tmp_path, budget, ["t_seconds,pod,vram_bytes", f"0,a,{2 * GI}"])
    rc, out, _ = replay(capsys, "--budget", b, "--usage", u, "--json")
    assert rc == 0 and [d["action"] for d in json.loads(out)["decisions"]] == ["Annotate"]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["t,pod,vram_bytes", "0,a,1"], "lacks 't_seconds'"),
        (["t_seconds,pod,vram_bytes", "zero,a,1"], "u.csv:2: t_seconds: not a number: 'zero'"),
        (["t_seconds,pod,vram_bytes", "0,a,-5"], "u.csv:2: vram_bytes: negative"),
        (["t_seconds,pod,vram_bytes", "0,,5"], "u.csv:2: pod: empty"),
    ],
)
def test_bad_usage_is_a_clear_error(tmp_path, capsys, rows, message):
    b, u = write(tmp_path, BUDGET, rows)
    rc, out, err = replay(capsys, "--budget", b, "--usage", u)
    assert rc == 2 and message in err and out == ""


def test_bad_budget_is_a_clear_error(tmp_path, capsys):
    bad = {**BUDGET, "spec": {**BUDGET["spec"], "limits": {"perPod": {"vram": "lots"}}}}
    b, u = write(tmp_path, bad, ["t_seconds,pod,vram_bytes", "0,a,1"])
    rc, _, err = replay(capsys, "--budget", b, "--usage", u)
    assert rc == 2 and "b.yaml: spec.limits.perPod.vram" in err
    (tmp_path / "b.yaml").write_text("kind: Pod\n")
    rc, _, err = replay(capsys, "--budget", b, "--usage", u)
    assert rc == 2 and "no GPUMemoryBudget" in err


def sawtooth_rows(pod: str, hours: float, growth_gib_h: float) -> list[str]:
    """A training loop's sawtooth (10 to 14Gi every 5 minutes) on a floor growing
    ``growth_gib_h`` GiB per hour, sampled every 30s."""
    rows = []
    for i in range(int(hours * 120)):
        t = i * 30
        tooth = 4 * ((t % 300) / 300)
        rows.append(f"{t},{pod},{int((10 + tooth + growth_gib_h * t / 3600) * GI)}")
    return rows


LEAK_BUDGET = {
    "apiVersion": "vramguard.io/v1alpha1",
    "kind": "GPUMemoryBudget",
    "metadata": {"name": "serve", "namespace": "s"},
    "spec": {
        "selector": {"matchLabels": {"app": "serve"}},
        "limits": {"perPod": {"vram": "40Gi"}},
        "warningThreshold": 1.0,
        "leakDetection": {"enabled": True, "minGrowthPerHour": "200Mi", "minWindow": "30m"},
    },
}


def test_replay_detects_a_leak_under_a_sawtooth_and_not_the_sawtooth(tmp_path, capsys):
    rows = ["t_seconds,pod,vram_bytes"] + sawtooth_rows("leaky", 1.5, 2.0) + sawtooth_rows("steady", 1.5, 0.0)
    rows = [rows[0]] + sorted(rows[1:], key=lambda r: int(r.split(",")[0]))
    b, u = write(tmp_path, LEAK_BUDGET, rows)
    rc, out, _ = replay(capsys, "--budget", b, "--usage", u, "--json")
    assert rc == 0
    got = json.loads(out)["decisions"]
    assert {(d["pod"], d["violation"]) for d in got} == {("leaky", "Leak")}
    first = got[0]
    assert first["action"] == "Annotate" and first["t_seconds"] >= 1800  # not before minWindow
    assert 1.0 * GI < first["observed_bytes"] < 3.0 * GI  # growth per hour, about 2Gi/h


def test_fail_on_a_step_exits_1_only_when_that_step_was_taken(capsys):
    args = ("--budget", str(EXAMPLE / "budget.yaml"), "--usage", str(EXAMPLE / "usage.csv"))
    assert replay(capsys, *args, "--fail-on", "Evict")[0] == 1
    assert replay(capsys, *args, "--fail-on", "Cap")[0] == 0
    assert replay(capsys, *args)[0] == 0


def test_each_pod_gets_the_leak_verdict_analyze_would_give(capsys, tmp_path):
    usage = tmp_path / "usage.csv"
    usage.write_text("t_seconds,pod,vram_bytes\n" + "".join(f"{t},short,{GI}\n" for t in range(0, 60, 10))
                     + "".join(f"{t},blank,\n" for t in range(0, 60, 10)))
    rc, out, _ = replay(capsys, "--budget", str(EXAMPLE / "budget.yaml"), "--usage", str(usage), "--json")
    pods = {p["pod"]: p for p in json.loads(out)["pods"]}
    assert rc == 0 and (pods["short"]["verdict"], pods["short"]["reason"]) == ("Undetermined", "TooShort")
    assert (pods["blank"]["verdict"], pods["blank"]["reason"]) == ("Undetermined", "NoUsableValues")
    rc, out, _ = replay(capsys, "--budget", str(EXAMPLE / "budget.yaml"), "--usage", str(usage))
    assert "short: leak: undetermined (too short): 6 samples over" in out


def test_times_in_messages_are_relative_to_the_start_of_the_log(capsys):
    rc, out, _ = replay(capsys, "--budget", str(EXAMPLE / "budget.yaml"), "--usage", str(EXAMPLE / "usage.csv"))
    assert rc == 0 and "1970" not in out
    assert "above its PodVRAM limit 20Gi since t=4m. Annotated. Next: Throttle at t=11m." in out
