"""``vramguard replay`` on the memory logs ``vramguard analyze`` reads: each
format becomes pods and samples, and the ladder runs on them as on the
replay's own usage CSV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramguard_operator.cli.main import main
from vramguard_operator.cli.replay import load_usage
from vramguard_operator.cli.replay_run import ReplayError

ROOT = Path(__file__).resolve().parents[3]
BUDGET = ROOT / "examples" / "replay" / "budget.yaml"  # perPod.vram 20Gi, Annotate at 0s, Throttle at 5m
GI = 1 << 30
MI = 1 << 20


def smi_apps(minutes: int = 12) -> str:
    """``nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_gpu_memory --format=csv -l 60``:
    pid 4242 grows 1Gi a minute from 16Gi, pid 99 stays at 8Gi (one row unknown)."""
    rows = ["timestamp, pid, process_name, used_gpu_memory [MiB]"]
    for i in range(minutes):
        rows.append(f"2026/12/01 10:{i:02d}:00.000, 4242, python, {(16 + i) * 1024} MiB")
        rows.append(f"2026/12/01 10:{i:02d}:00.010, 99, python, {'[N/A]' if i == 3 else '8192 MiB'}")
    return "\n".join(rows) + "\n"


def smi_gpu() -> str:
    """``nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv -l 60``, two GPUs."""
    rows = ["timestamp, index, memory.used [MiB]"]
    for i in range(3):
        rows += [f"2026/12/01 10:0{i}:00.000, 0, {(20 + i) * 1024} MiB", f"2026/12/01 10:0{i}:00.005, 1, 1024 MiB"]
    return "\n".join(rows) + "\n"


# (file name, content, --interval, {pod: [(t, vram bytes or None)]} of the first samples)
FORMATS = [
    ("train.csv", "t_seconds,bytes\n0,1073741824\n60,2147483648\n", None,
     {"train": [(0.0, GI), (60.0, 2 * GI)]}),
    ("steps.csv", "step,bytes\n0,1073741824\n1,2147483648\n", 30.0, {"steps": [(0.0, GI), (30.0, 2 * GI)]}),
    ("mib.csv", "step,memory [MiB]\n0,512\n1,1024\n", 2.0, {"mib": [(0.0, 512 * MI), (2.0, GI)]}),
    ("apps.csv", smi_apps(5), None, {"pid 4242 (python)": [(0.0, 16 * GI), (60.0, 17 * GI)],
                                     "pid 99 (python)": [(0.01, 8 * GI), (60.01, 8 * GI), (120.01, 8 * GI),
                                                         (180.01, None)]}),
    ("gpus.csv", smi_gpu(), None, {"index 0": [(0.0, 20 * GI), (60.0, 21 * GI)],
                                   "index 1": [(0.005, GI), (60.005, GI)]}),
    ("own.csv", "t_seconds,pod,vram_bytes\n0,w,5\n", None, {"w": [(0.0, 5)]}),
]


@pytest.mark.parametrize(("name", "text", "interval", "wanted"), FORMATS, ids=[f[0] for f in FORMATS])
def test_each_log_format_becomes_pods_and_samples(tmp_path, name, text, interval, wanted):
    path = tmp_path / name
    path.write_text(text)
    samples = load_usage(path, interval)
    assert {s.pod for s in samples} == set(wanted)
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    for pod, first in wanted.items():
        assert [(round(s.t, 3), s.vram) for s in samples if s.pod == pod][: len(first)] == first
    assert all(s.ram is None for s in samples if name != "own.csv")


# (content, --interval, text of the one-line error)
BAD = [
    ("", None, "log.csv: no samples"),
    ("t_seconds,bytes\n", None, "log.csv: no samples"),
    ("step,bytes\n0,1\n", None, "needs --interval"),
    ("t_seconds,bytes\n0,1\n", 1.0, "--interval is for logs indexed by step"),
    ("t_seconds,pod,vram_bytes\n0,p,1\n", 1.0, "--interval is for memory logs indexed by step"),
    ("t_seconds,bytes\n0,1e38\n", None, "above the maximum of 8Pi"),
    ("t_seconds,bytes\n-5,1\n", None, "log.csv:2: time -5 s is not in [0,"),
    ("timestamp, memory.used [MiB]\n2026/12/01 10:00:00, lots\n", None, "line 2"),
]


@pytest.mark.parametrize(("text", "interval", "wanted"), BAD)
def test_a_bad_log_is_one_error_naming_the_file(tmp_path, text, interval, wanted):
    path = tmp_path / "log.csv"
    path.write_text(text)
    with pytest.raises(ReplayError) as err:
        load_usage(path, interval)
    assert str(err.value).startswith(str(path)) and wanted in str(err.value) and "\n" not in str(err.value)


def test_an_nvidia_smi_log_runs_the_ladder_per_process(tmp_path, capsys):
    log = tmp_path / "apps.csv"
    log.write_text(smi_apps(14))
    rc = main(["replay", "--budget", str(BUDGET), "--usage", str(log), "--json", "--fail-on", "Throttle"])
    body = json.loads(capsys.readouterr().out)
    steps = [(d["t_seconds"], d["pod"], d["action"]) for d in body["decisions"]]
    # 4242 warns at 17Gi (85%), is above 22Gi (20Gi + 10%) from 7 minutes on: Annotate at once,
    # Throttle 5 minutes later; 99 stays at 8Gi
    assert steps == [(60, "pid 4242 (python)", "Warn"), (420, "pid 4242 (python)", "Annotate"),
                     (720, "pid 4242 (python)", "Throttle")]
    assert {p["pod"] for p in body["pods"]} == {"pid 4242 (python)", "pid 99 (python)"}
    assert rc == 1
