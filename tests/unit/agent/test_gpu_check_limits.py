"""hack/gpu_check_limits.py's logic over the fake pynvml (the script itself needs a GPU
and has not run on one: docs/agent.md, "Real-GPU check")."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import pytest

from vramguard_sim.fakenvml import FakeNVML

from .builders import gpu, nvml

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "hack"))
import gpu_check_limits  # noqa: E402


@pytest.fixture
def host(tmp_path, monkeypatch) -> FakeNVML:
    fake = nvml(gpu(0), privileged=True)
    fake.driver_version = "615.12.03"
    fake.nvmlInit()
    (tmp_path / "cgroup.controllers").write_text("cpu memory dmem\n")
    monkeypatch.setattr(gpu_check_limits, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(gpu_check_limits, "_nvml", lambda: fake)
    monkeypatch.setattr(gpu_check_limits.os, "geteuid", lambda: 0)
    return fake


def args() -> Namespace:
    return Namespace(device=0, limit_mib=2048, enforce_check=False)


def test_sets_reads_and_clears_and_removes_its_cgroup(host, tmp_path):
    checks, verdict = gpu_check_limits.run(args(), "gpu_check.py", "ctypes", {"memoryLimits": "Supported"})
    assert verdict == "SUPPORTED" and all(ok for _, ok in checks) and len(checks) == 4
    assert host.calls["nvmlDeviceSetMemoryLimits_v1"] >= 2 and host.memory_limits[gpu(0).uuid] == {}
    assert not list(tmp_path.glob("vramguard-gpu-check-*"))


def test_a_driver_older_than_r615_is_unsupported_and_the_agent_must_agree(host, tmp_path):
    host.driver_version = "550.90.07"
    checks, verdict = gpu_check_limits.run(args(), "gpu_check.py", "ctypes", {"memoryLimits": "Unsupported"})
    assert verdict.startswith("UNSUPPORTED: nvmlDeviceGetMemoryLimits_v1: NVMLError_FunctionNotFound")
    assert checks == [("the agent reports Unsupported too (it says Unsupported)", True)]
    checks, _ = gpu_check_limits.run(args(), "gpu_check.py", "ctypes", {"memoryLimits": "Supported"})
    assert checks[0][1] is False  # the agent disagrees: a failed check
    assert not list(tmp_path.glob("vramguard-gpu-check-*"))


def test_not_root_or_no_cgroup_v2_is_unsupported_before_nvml(host, tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check_limits.os, "geteuid", lambda: 1000)
    checks, verdict = gpu_check_limits.run(args(), "gpu_check.py", "ctypes", {"memoryLimits": "Supported"})
    assert verdict.startswith("UNSUPPORTED: not root") and checks[0][1] is False
    monkeypatch.setattr(gpu_check_limits.os, "geteuid", lambda: 0)
    (tmp_path / "cgroup.controllers").unlink()
    _, verdict = gpu_check_limits.run(args(), "gpu_check.py", "ctypes", {})
    assert "no cgroup v2" in verdict
    assert host.calls.get("nvmlDeviceGetMemoryLimits_v1", 0) == 0
