"""``vramguard analyze`` on host-RAM logs: pidstat -r, ps -o etimes,rss and a
t_seconds,bytes CSV of a cgroup's usage, judged by the same detector."""

from __future__ import annotations

import json

import pytest

from vramguard_operator.cli.main import main
from vramguard_operator.cli.memlog import LogError
from vramguard_operator.cli.ramlog import read_ram_log, recognises

KIB, MIB, GIB = 2**10, 2**20, 2**30


def rss_kib(minute: int, leaking: bool) -> int:
    """A DataLoader worker: 2 GiB, +1 GiB/h when leaking, a ±20 MiB batch ripple."""
    ripple = 20 * MIB if minute % 3 == 0 else 0
    return (2 * GIB + (GIB * minute // 60 if leaking else 0) + ripple) // KIB


def pidstat_log(minutes: int = 90, twelve_hour: bool = True) -> str:
    """``pidstat -r 60`` as sysstat prints it: banner, header, one line per pid, Average lines;
    it starts at 11:30 PM so that the clock passes midnight."""
    lines = ["Linux 6.8.0-45-generic (gpu-node-1) \t12/06/2026 \t_x86_64_\t(32 CPU)", ""]
    start = 23 * 3600 + 30 * 60
    for minute in range(minutes):
        s = (start + minute * 60) % 86400
        h, m = divmod(s // 60, 60)
        when = f"{(h % 12) or 12:02d}:{m:02d}:00 {'PM' if h >= 12 else 'AM'}" if twelve_hour else f"{h:02d}:{m:02d}:00"
        if minute % 20 == 0:
            lines += ["", f"{when}   UID       PID  minflt/s  majflt/s     VSZ     RSS   %MEM  Command"]
        lines.append(f"{when}  1000      4242    812.00      0.00 9876543 {rss_kib(minute, True):7d}   3.10  pt_data_worker")
        lines.append(f"{when}  1000      4343     10.00      0.00 9876543 {rss_kib(minute, False):7d}   1.60  python3")
    lines += ["", "Average:     1000      4242    812.00      0.00 9876543 3000000   3.10  pt_data_worker"]
    return "\n".join(lines) + "\n"


def test_pidstat_gives_one_ram_series_per_pid_in_bytes_across_midnight():
    series = {s.label: s for s in read_ram_log(pidstat_log(), None)}
    assert set(series) == {"pid 4242 (pt_data_worker)", "pid 4343 (python3)"}
    worker = next(s for s in series.values() if s.pid == 4242)
    assert worker.memory == "RAM" and len(worker.times) == 90
    assert worker.values[0] == rss_kib(0, True) * KIB
    assert worker.times[-1] - worker.times[0] == 89 * 60  # 11:30 PM to 00:59 AM, read as one day's run
    assert read_ram_log(pidstat_log(twelve_hour=False), None)[0].times == worker.times


def test_analyze_calls_the_growing_worker_a_ram_leak_and_the_steady_one_not(tmp_path, capsys):
    log = tmp_path / "pidstat.txt"
    log.write_text(pidstat_log())
    code = main(["analyze", str(log), "--json"])
    verdicts = {d["series"].split()[1]: d for d in map(json.loads, capsys.readouterr().out.splitlines())}
    assert code == 1
    assert verdicts["4242"]["leak"] is True and verdicts["4242"]["memory"] == "RAM"
    assert verdicts["4242"]["growth_bytes_per_hour"] == pytest.approx(GIB, rel=0.1)
    assert verdicts["4343"]["leak"] is False
    main(["analyze", str(log), "--pid", "4242"])
    assert "pid 4242 (pt_data_worker) (RAM): 90 samples" in capsys.readouterr().out


def test_ps_log_with_elapsed_or_interval(tmp_path, capsys):
    # ps -o etimes,rss -p 4242 in a loop: the header repeats each time
    looped = "".join(f"ELAPSED   RSS\n{600 + 60 * i:7d} {rss_kib(i, True)}\n" for i in range(90))
    assert recognises(looped)
    (s,) = read_ram_log(looped, None)
    assert (s.times[0], s.times[-1], s.values[-1]) == (600, 600 + 89 * 60, rss_kib(89, True) * KIB)
    # ps -o rss without a time: one line per --interval
    plain = "RSS\n" + "".join(f"{rss_kib(i, True)}\n" for i in range(90))
    with pytest.raises(LogError, match="needs --interval"):
        read_ram_log(plain, None)
    log = tmp_path / "ps.txt"
    log.write_text(plain)
    assert main(["analyze", str(log), "--interval", "1m"]) == 1
    assert "RSS (RAM): 90 samples over 1h29m" in capsys.readouterr().out


def test_a_cgroup_usage_csv_is_named_ram_with_memory_ram(tmp_path, capsys):
    log = tmp_path / "memory.current.csv"
    log.write_text("t_seconds,bytes\n" + "".join(f"{60 * i},{rss_kib(i, True) * KIB}\n" for i in range(90)))
    assert main(["analyze", str(log), "--memory", "RAM", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["memory"] == "RAM"
    assert main(["analyze", str(log), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["memory"] == "VRAM"


def test_bad_ram_logs_name_the_line(tmp_path, capsys):
    cases = {
        "RSS\nlots\n": "line 2: RSS is not a number: 'lots'",
        "12:00:00   UID   PID   RSS  Command\n25:61:00  1 2 3 x\n": "line 2: bad pidstat time",
        "ELAPSED RSS\n60 -5\n": "line 2: RSS must not be negative",
    }
    for text, message in cases.items():
        log = tmp_path / "bad.txt"
        log.write_text(text)
        assert main(["analyze", str(log), "--interval", "1s"] if "ELAPSED" not in text else ["analyze", str(log)]) == 2
        assert message in capsys.readouterr().err
