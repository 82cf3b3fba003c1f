"""``vramguard analyze`` on a container log and kernel lines (cli/oom_log.py), with the
fixtures' real messages."""

from __future__ import annotations

import json

from tests.unit.oom.cases import kernel_cases, message_cases
from vramguard_operator.cli.main import main


def case_text(case_id: str) -> str:
    return next(c.text for c in message_cases() if c.id == case_id)


def kernel_lines(case_id: str) -> list[str]:
    return next(c["lines"] for c in kernel_cases() if c["id"] == case_id)


def test_a_pytorch_traceback_is_a_gpu_oom_with_the_size_asked(tmp_path, capsys):
    log = tmp_path / "previous.log"
    log.write_text("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                   + case_text("torch-oom-class-2024") + "\n")
    assert main(["analyze", str(log)]) == 1
    out = capsys.readouterr().out
    assert "GPU out of memory (VRAM): PyTorch said" in out and "it asked for 22.8Gi" in out


def test_kernel_lines_name_the_process_cgroup_pod_and_what_it_held(tmp_path, capsys):
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join(kernel_lines("gpud-containerd-pytorch") + kernel_lines("npd-event")) + "\n")
    assert main(["analyze", "--json", str(log)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["oom"] and out["message"] is None
    (pt, kubectl) = out["kernel"]
    assert (pt["pid"], pt["pod_uid"], pt["scope"]) == (461754, "eded8c65-6e8e-4c6e-a889-3e427565c740", "Cgroup")
    assert (kubectl["command"], kubectl["anon_rss_bytes"]) == ("kubectl", 58776 * 1024)


def test_a_host_ram_message_says_ram_not_vram(tmp_path, capsys):
    log = tmp_path / "log"
    log.write_text(case_text("torch-cpu-allocator") + "\n")
    assert main(["analyze", str(log)]) == 1
    assert "host out of memory (RAM)" in capsys.readouterr().out


def test_triton_shared_memory_is_reported_as_not_vram(tmp_path, capsys):
    log = tmp_path / "log"
    log.write_text(case_text("triton-shared-memory-vllm") + "\n")
    assert main(["analyze", str(log)]) == 0
    out = capsys.readouterr().out
    assert "not a VRAM or RAM shortage" in out and "no out-of-memory evidence" in out


def test_a_memory_csv_is_still_a_memory_csv(tmp_path, capsys):
    log = tmp_path / "m.csv"
    log.write_text("t_seconds,bytes\n" + "".join(f"{t},{1000}\n" for t in range(0, 600, 10)))
    # judged as memory (ten flat minutes are too short for a verdict: undetermined, 3), not as an OOM log
    assert main(["analyze", str(log)]) == 3
    out = capsys.readouterr().out
    assert "leak: undetermined" in out and "OOM" not in out
