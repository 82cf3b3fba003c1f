"""``vramguard analyze`` on plain and nvidia-smi CSV logs."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from tests.leak_corpora.tuning import CORPUS, trace
from vramguard_operator.cli.main import main

MIB, GIB = 2**20, 2**30
ROOT = Path(__file__).resolve().parents[3]
START = datetime(2024, 5, 1, 12, 0, 0, 123000)
LEAKING, FLAT = "linear-2.csv", "eval-spikes-1.csv"


def stamp(t: float) -> str:
    """An nvidia-smi timestamp: ``2024/05/01 12:00:00.123``."""
    return f"{START + timedelta(seconds=float(t)):%Y/%m/%d %H:%M:%S.%f}"[:-3]


def mib(value: float, units: bool = True) -> str:
    return f"{int(round(value / MIB))}" + (" MiB" if units else "")


def gpu_log(*names: str, units: bool = True, header: bool = True) -> str:
    """``--query-gpu=timestamp,memory.used`` output with one GPU per corpus trace."""
    traces = [trace(n) for n in names]
    n = min(tr.t.size for tr in traces)
    lines = ["timestamp, memory.used [MiB]"] if header else []
    for i in range(n):
        for g, tr in enumerate(traces):
            lines.append(f"{stamp(traces[0].t[i] + g * 0.002)}, {mib(tr.v[i], units)}")
    return "\n".join(lines) + "\n"


def apps_log() -> str:
    """``--query-compute-apps=timestamp,pid,process_name,used_gpu_memory`` output: pid
    4242 leaks, pid 4343 does not and sometimes reads [N/A]."""
    leaking, flat = trace(LEAKING), trace(FLAT)
    lines = ["timestamp, pid, process_name, used_gpu_memory [MiB]"]
    for i in range(min(leaking.t.size, flat.t.size)):
        when = stamp(leaking.t[i])
        lines.append(f"{when}, 4242, /usr/bin/python3, {mib(leaking.v[i])}")
        lines.append(f"{when}, 4343, python, {'[N/A]' if i % 50 == 0 else mib(flat.v[i])}")
    return "\n".join(lines) + "\n"


def analyze(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["analyze", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def objects(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_plain_csv_leak_with_limit(capsys):
    code, out, _ = analyze(capsys, str(CORPUS / LEAKING), "--limit", "40Gi", "--json")
    assert code == 1
    [obj] = objects(out)
    assert set(obj) == {
        "series",
        "verdict",
        "reason",
        "detail",
        "memory",
        "leak",
        "growth_bytes_per_hour",
        "growth_low_bytes_per_hour",
        "onset_t_seconds",
        "time_to_limit_seconds",
        "samples",
        "evidence_seconds",
        "too_short",
        "needed_seconds",
    }
    assert obj["leak"] is True and obj["verdict"] == "Leak" and obj["reason"] is None
    assert obj["samples"] == trace(LEAKING).t.size
    assert obj["growth_bytes_per_hour"] == pytest.approx(
        trace(LEAKING).rate_bytes_per_hour, rel=0.1
    )
    assert isinstance(obj["onset_t_seconds"], float) and isinstance(
        obj["time_to_limit_seconds"], float
    )


def test_plain_csv_without_leak_exits_zero_and_reads_as_text(capsys):
    code, out, _ = analyze(capsys, str(CORPUS / FLAT), "--limit", "80Gi")
    assert code == 0
    assert "leak: no" in out and "time to limit 80Gi: not projected" in out


def test_plain_csv_header_is_optional(tmp_path, capsys):
    body = (CORPUS / LEAKING).read_text().splitlines()[1:]
    path = tmp_path / "noheader.csv"
    path.write_text("\n".join(body) + "\n")
    code, out, _ = analyze(capsys, str(path), "--json")
    assert code == 1 and objects(out)[0]["samples"] == len(body)


def test_unreadable_line_is_an_error_naming_its_line(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("t_seconds,bytes\n0,1073741824\n15,1073741824\n\n30,lots\n")
    code, out, err = analyze(capsys, str(path))
    assert code == 2 and out == ""
    assert "line 5" in err and "bytes is not a number: 'lots'" in err and str(path) in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,1\n15\n", "line 2: expected t_seconds,bytes"),
        ("0,1\n15,-3\n", "line 2: bytes must not be negative"),
        ("0,1\n15,2\n10,3\n", "line 3: t_seconds must increase, got 10 after 15"),
        ("0,1\n15,2\n15,3\n", "line 3: t_seconds must increase"),
        (
            "timestamp, memory.used [MiB]\n2024/05/01 12:00:09.000, 12 MiB\n2024/05/01 12:00:01.000, 1 MiB\n",
            "line 3: time goes back",
        ),
        (
            "timestamp, memory.used [MiB]\n2024/05/01 12:00:00.000, 12 MiB\nyesterday, 13 MiB\n",
            "line 3: bad timestamp",
        ),
        (
            "timestamp, memory.used [MiB]\n2024/05/01 12:00:00.000, twelve\n",
            "line 2: bad memory value 'twelve'",
        ),
        (
            "timestamp, pid, used_gpu_memory [MiB]\n2024/05/01 12:00:00.000, 1\n",
            "line 2: expected 3 fields",
        ),
        ("timestamp, name\n2024/05/01 12:00:00.000, H100\n", "line 1: an nvidia-smi log needs"),
        ("# only a comment\n", "no samples"),
    ],
)
def test_bad_logs(tmp_path, capsys, text, message):
    path = tmp_path / "log.csv"
    path.write_text(text)
    code, _, err = analyze(capsys, str(path))
    assert code == 2 and message in err


def test_missing_file_and_bad_limit(tmp_path, capsys):
    code, _, err = analyze(capsys, str(tmp_path / "absent.csv"))
    assert code == 2 and "cannot read" in err
    assert main(["analyze", str(CORPUS / FLAT), "--limit", "lots"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("vramguard analyze: argument --limit: invalid quantity 'lots'")


def test_nvidia_smi_gpu_log_gives_one_series_per_gpu(tmp_path, capsys):
    path = tmp_path / "gpu.csv"
    path.write_text(gpu_log(FLAT, LEAKING))
    code, out, _ = analyze(capsys, str(path), "--json")
    assert code == 1
    flat, leaking = objects(out)
    assert (flat["series"], flat["leak"]) == ("gpu 0", False)
    assert (leaking["series"], leaking["leak"]) == ("gpu 1", True)
    # Times come from the timestamps (seconds from the first one), so the onset matches.
    assert leaking["onset_t_seconds"] == pytest.approx(trace(LEAKING).onset_t_seconds, abs=600)


def test_nvidia_smi_gpu_log_without_units_or_header(tmp_path, capsys):
    path = tmp_path / "gpu.csv"
    path.write_text(gpu_log(LEAKING, units=False, header=False))
    code, out, _ = analyze(capsys, str(path), "--json")
    assert code == 1 and objects(out)[0]["leak"] is True


def test_nvidia_smi_gpu_log_keyed_by_index_with_repeated_headers(tmp_path, capsys):
    text = "timestamp, index, memory.used [MiB]\n"
    for i, (t, value) in enumerate(zip(trace(LEAKING).t, trace(LEAKING).v, strict=True)):
        if i % 100 == 0:
            text += "timestamp, index, memory.used [MiB]\n"
        text += f"{stamp(t)}, 3, {mib(value)}\n"
    path = tmp_path / "gpu.csv"
    path.write_text(text)
    code, out, _ = analyze(capsys, str(path))
    assert (
        code == 1
        and out.startswith("index 3: ")
        and "leak: yes" in out
        and "since 2024/05/01" in out
    )


def test_nvidia_smi_compute_apps_log_gives_one_series_per_pid(tmp_path, capsys):
    path = tmp_path / "apps.csv"
    path.write_text(apps_log())
    code, out, _ = analyze(capsys, str(path), "--json")
    assert code == 1
    by_series = {o["series"]: o for o in objects(out)}
    assert by_series["pid 4242 (/usr/bin/python3)"]["leak"] is True
    flat = by_series["pid 4343 (python)"]
    assert flat["leak"] is False
    # [N/A] readings are missing samples, not zeros.
    n = min(trace(LEAKING).t.size, trace(FLAT).t.size)
    assert flat["samples"] == n - len(range(0, n, 50))


def test_pid_picks_one_process(tmp_path, capsys):
    path = tmp_path / "apps.csv"
    path.write_text(apps_log())
    code, out, _ = analyze(capsys, str(path), "--pid", "4343", "--json")
    assert code == 0 and [o["series"] for o in objects(out)] == ["pid 4343 (python)"]
    code, _, err = analyze(capsys, str(path), "--pid", "99")
    assert code == 2 and "--pid 99: no such process in the log; pids: 4242, 4343" in err


def test_process_names_with_commas_and_two_gpus_per_pid(tmp_path, capsys):
    lines = ["timestamp, pid, process_name, used_gpu_memory [MiB]"]
    for t in np.arange(0, 3 * 3600, 30.0):
        used = 10 * GIB + t / 3600 * GIB  # 1 GiB/h in all, half on each GPU
        for _ in range(2):
            lines.append(f"{stamp(t)}, 77, python -c a,b, {mib(used / 2)}")
    path = tmp_path / "apps.csv"
    path.write_text("\n".join(lines) + "\n")
    code, out, _ = analyze(capsys, str(path), "--json")
    [obj] = objects(out)
    assert code == 1 and obj["series"] == "pid 77 (python -c a,b)"
    assert obj["growth_bytes_per_hour"] == pytest.approx(GIB, rel=0.05)


def test_thresholds_can_be_set(capsys):
    code, out, _ = analyze(capsys, str(CORPUS / LEAKING), "--min-growth", "4Gi", "--json")
    assert code == 0 and objects(out)[0]["leak"] is False
    code, _, _ = analyze(capsys, str(CORPUS / LEAKING), "--min-window", "10h")
    assert code == 0


def test_the_installed_command_runs(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "vramguard_operator", "analyze", str(CORPUS / FLAT), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": "api:operator:agent", "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["leak"] is False


# --- step-indexed logs, too short to judge, pictures ---------------------------------


def step_log(path: Path, header: str, steps: np.ndarray, values: np.ndarray, unit: str = "") -> Path:
    lines = [header] if header else []
    lines += [f"{int(s)},{v:.0f}{unit}" for s, v in zip(steps, values, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_step_indexed_log_with_interval_reads_like_the_timed_one(tmp_path, capsys):
    tr = trace(LEAKING)
    dt = float(np.median(np.diff(tr.t)))
    steps = np.rint(tr.t / dt) * 10  # logged every 10 steps, dt/10 seconds per step
    path = step_log(tmp_path / "steps.csv", "step,memory [MiB]", steps, tr.v / MIB)
    code, out, _ = analyze(capsys, str(path), "--interval", f"{dt / 10:g}s", "--json")
    [stepped] = objects(out)
    timed_code, timed_out, _ = analyze(capsys, str(CORPUS / LEAKING), "--json")
    [timed] = objects(timed_out)
    assert code == timed_code == 1 and stepped["leak"] is True
    assert stepped["growth_bytes_per_hour"] == pytest.approx(timed["growth_bytes_per_hour"], rel=0.05)
    assert stepped["onset_t_seconds"] == pytest.approx(timed["onset_t_seconds"], abs=10 * 60)


def test_a_column_of_values_with_units_and_an_interval(tmp_path, capsys):
    values = [f"{20 * 1024 + (i // 20) * 30} MiB" for i in range(400)]  # 30 MiB every 20 steps of 3 s: 1.8 GiB/h
    (tmp_path / "values.csv").write_text("\n".join(values) + "\n")
    code, out, _ = analyze(capsys, str(tmp_path / "values.csv"), "--interval", "3s", "--json")
    [obj] = objects(out)
    assert obj["samples"] == 400 and obj["growth_bytes_per_hour"] == pytest.approx(1800 * MIB, rel=0.1)


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        ("step,bytes\n0,1\n1,2\n", [], "needs --interval, the time per step"),
        ("1\n2\n3\n", [], "needs --interval"),
        ("t_seconds,bytes\n0,1\n1,2\n", ["--interval", "2s"], "--interval is for logs indexed by step"),
        ("step,bytes\n0,1\n5,2\n3,3\n", ["--interval", "2s"], "line 4: step must increase, got 3 after 5"),
        ("step,bytes\n0,1\n1,2\n", ["--interval", "0s"], "--interval must be above 0s"),
    ],
)
def test_step_log_errors(tmp_path, capsys, text, args, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    code, _, err = analyze(capsys, str(path), *args)
    assert code == 2 and message in err


def test_nvidia_smi_log_with_an_interval_is_refused(tmp_path, capsys):
    path = tmp_path / "gpu.csv"
    path.write_text(gpu_log(FLAT))
    code, _, err = analyze(capsys, str(path), "--interval", "2s")
    assert code == 2 and "this one has timestamps" in err


def test_a_short_log_is_too_short_to_judge_and_says_how_much_is_needed(tmp_path, capsys):
    tr = trace(LEAKING)
    short = tr.t < 6 * 60
    path = tmp_path / "short.csv"
    path.write_text("t_seconds,bytes\n" + "".join(f"{t},{int(v)}\n" for t, v in zip(tr.t[short], tr.v[short], strict=True)))
    code, out, _ = analyze(capsys, str(path))
    assert code == 3 and "leak: undetermined (too short)" in out and "leak: no" not in out
    [line] = [x for x in out.splitlines() if "cannot judge" in x]
    assert f"{int(short.sum())} samples over" in line and "are needed to call a leak at this noise" in line
    code, out, _ = analyze(capsys, str(path), "--json")
    [obj] = objects(out)
    assert code == 3 and (obj["verdict"], obj["reason"]) == ("Undetermined", "TooShort")
    assert obj["too_short"] is True and 7 * 60 < obj["needed_seconds"] <= 30 * 60
    code, out, _ = analyze(capsys, str(CORPUS / FLAT), "--json")
    assert code == 0 and objects(out)[0]["too_short"] is False and objects(out)[0]["verdict"] == "NoLeak"


def test_memory_that_doubles_in_seconds_is_undetermined_not_no_leak(tmp_path, capsys):
    path = tmp_path / "fast.csv"
    path.write_text("t_seconds,bytes\n" + "".join(f"{t},{(1 + t / 19) * GIB:.0f}\n" for t in range(20)))
    code, out, _ = analyze(capsys, str(path), "--json")
    [obj] = objects(out)
    assert code == 3 and (obj["verdict"], obj["reason"]) == ("Undetermined", "TooShort") and obj["leak"] is False


def test_a_log_of_unknown_values_has_no_usable_values(tmp_path, capsys):
    path = tmp_path / "na.csv"
    path.write_text(gpu_log(FLAT).splitlines()[0] + "\n" + "".join(
        f"2026/01/01 00:{m:02d}:00.000, [N/A]\n" for m in range(30)))
    code, out, _ = analyze(capsys, str(path))
    assert code == 3 and "leak: undetermined (no usable values)" in out and "growth" not in out
    code, out, _ = analyze(capsys, str(path), "--json")
    [obj] = objects(out)
    assert (obj["verdict"], obj["reason"], obj["growth_bytes_per_hour"]) == ("Undetermined", "NoUsableValues", None)


def test_a_few_samples_hours_apart_are_too_sparse_or_too_short_never_no_leak(tmp_path, capsys):
    path = tmp_path / "sparse.csv"
    path.write_text("t_seconds,bytes\n" + "".join(f"{h * 3600},{20 * GIB}\n" for h in range(4)))
    code, out, _ = analyze(capsys, str(path), "--json")
    [obj] = objects(out)
    assert code == 3 and obj["verdict"] == "Undetermined" and obj["reason"] in ("TooSparse", "TooShort")


def test_text_output_has_a_sparkline_of_the_floor(capsys):
    code, out, _ = analyze(capsys, str(CORPUS / LEAKING))
    [line] = [x for x in out.splitlines() if x.startswith("  floor ")]
    bars = line.split()[1]
    assert len(bars) == 48 and bars[0] in "▁_" and bars[-1] in "█#"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, after checking its signature, the CRC of every
    chunk, and that it starts with IHDR and ends with IEND (the PNG specification)."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, kinds = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        kinds.append(kind)
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    return width, height


def test_plot_writes_a_png_of_one_panel_per_series(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "verdict.png"
    code, _, _ = analyze(capsys, str(CORPUS / LEAKING), "--limit", "40Gi", "--plot", str(out))
    assert code == 1 and png_size(out) == (1000, 500)
    log = tmp_path / "apps.csv"
    log.write_text(apps_log())
    code, _, _ = analyze(capsys, str(log), "--plot", str(out))
    assert png_size(out) == (1000, 1000)


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = analyze(capsys, str(CORPUS / FLAT), "--plot", str(tmp_path / "x.png"))
    assert code == 2 and "pip install 'vramguard[plot]'" in err and not (tmp_path / "x.png").exists()


def test_stdin_and_the_limit_from_memory_total(tmp_path):
    """``-`` reads the log from stdin; a --query-gpu log with memory.total projects to it
    without --limit (the device's memory is the limit a leak runs into)."""
    tr = trace(LEAKING)
    lines = ["timestamp, memory.used [MiB], memory.total [MiB]"]
    lines += [f"{stamp(t)}, {v / MIB:.0f} MiB, 40960 MiB" for t, v in zip(tr.t, tr.v, strict=True)]
    out = subprocess.run(
        [sys.executable, "-m", "vramguard_operator", "analyze", "-"], input="\n".join(lines) + "\n",
        cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": "api:operator:agent", "PATH": ""},
    )
    assert out.returncode == 1, out.stderr
    assert "time to limit 40Gi: " in out.stdout and "not projected" not in out.stdout


@pytest.mark.parametrize(("span_s", "peak", "want"), [
    (19, 3 * GIB, ("seconds", "GiB")), (600, 500 * MIB, ("minutes", "MiB")), (6 * 3600, 30 * GIB, ("hours", "GiB")),
    (7199, 512, ("minutes", "bytes")),
])
def test_plot_axes_are_in_units_that_suit_the_span(span_s, peak, want):
    from vramguard_operator.cli.analyze_plot import axis_units

    (_, time_name), (_, size_name) = axis_units(span_s, peak)
    assert (time_name, size_name) == want


def test_the_plot_axis_fits_the_data_with_a_far_limit(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from vramguard_operator.cli import analyze_plot

    shown: list[tuple[float, float]] = []
    original = analyze_plot._panel

    def spy(ax, *args):
        original(ax, *args)
        shown.append(ax.get_xlim())

    analyze_plot._panel = spy
    try:
        code, out, _ = analyze(capsys, str(CORPUS / LEAKING), "--limit", "200Gi", "--plot", str(tmp_path / "p.png"))
    finally:
        analyze_plot._panel = original
        plt.close("all")
    span_h = float(trace(LEAKING).t[-1] - trace(LEAKING).t[0]) / 3600
    assert code == 1 and f"plot written to {tmp_path / 'p.png'}" in out
    [(left, right)] = shown
    assert left == pytest.approx(0, abs=0.01) and right == pytest.approx(span_h, rel=0.01)  # not 110 h
