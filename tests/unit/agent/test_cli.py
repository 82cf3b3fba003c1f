"""The vramguard-agent command: once (after vramguard-sim fake-host too) and argument errors (run is covered by e2e)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
import yaml

from vramguard_agent.agent import AgentConfig
from vramguard_agent.cli import main
from vramguard_agent.settings import agent_config, parse
from vramguard_api.usage import NodeGPUUsageStatus

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "examples" / "scenarios" / "demo.yaml"


def parse_args(argv: list[str]) -> SimpleNamespace:
    """The values ``vramguard-agent ARGV`` is told, as attributes (``command`` too)."""
    parsed = parse(argv)
    return SimpleNamespace(command=parsed.command, **parsed.params)


def _config(args: SimpleNamespace) -> AgentConfig:
    return agent_config(vars(args))


def run_cli(*args: str, module: str = "vramguard_agent") -> subprocess.CompletedProcess[str]:
    """``vramguard-agent ARGS`` (``module="vramguard_sim"``: ``vramguard-sim ARGS``) in a subprocess."""
    env = {"PYTHONPATH": f"{ROOT / 'api'}:{ROOT / 'agent'}:{ROOT / 'sim'}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    ("node", "devices", "pods"),
    [("gpu-h100-ts", 8, 5), ("gpu-a100-mig", 5, 4), ("gpu-a10-vgpu", 1, 2)],
)
def test_once_on_the_demo_scenario_prints_a_valid_status(node, devices, pods, capsys):
    assert main(["once", "--backend", "sim", "--scenario", str(DEMO), "--node", node]) == 0
    status = NodeGPUUsageStatus.model_validate(json.loads(capsys.readouterr().out))
    assert len(status.devices) == devices and len(status.pods) == pods
    assert all(p.name and p.namespace for p in status.pods)
    assert {c.type: c.status for c in status.conditions} == {"AgentHealthy": "True", "ProcessesMissing": "False"}


def test_once_at_a_fault_time_reports_it(capsys):
    assert (
        main(["once", "--backend", "sim", "--scenario", str(DEMO), "--node", "gpu-a10-vgpu", "--sim-offset", "21m"])
        == 0
    )
    status = NodeGPUUsageStatus.model_validate(json.loads(capsys.readouterr().out))
    assert {p.attribution for p in status.pods} == {"Unknown"}


def test_fake_host_then_once_with_proc_root_in_a_subprocess(tmp_path):
    out = run_cli("fake-host", "--scenario", str(DEMO), "--node", "gpu-a100-mig", "--out", str(tmp_path),
                  module="vramguard_sim")
    assert out.returncode == 0, out.stderr
    written = json.loads(out.stdout)
    assert sorted(written["pids"].values()) == [
        "batch/ocr-0/ocr",
        "batch/ocr-1/ocr",
        "ml-serving/whisper-0/asr",
        "research/finetune-small-0/trainer",
    ]
    out = run_cli(
        "once",
        "--backend",
        "sim",
        "--scenario",
        str(DEMO),
        "--node",
        "gpu-a100-mig",
        "--proc-root",
        written["procRoot"],
        "--cgroup-root",
        written["cgroupRoot"],
    )
    assert out.returncode == 0, out.stderr
    status = NodeGPUUsageStatus.model_validate(json.loads(out.stdout))
    assert sorted(p.name for p in status.pods) == ["finetune-small-0", "ocr-0", "ocr-1", "whisper-0"]
    assert all(p.ram_working_set_bytes for p in status.pods)


def test_unknown_node_is_a_clear_error(capsys):
    assert main(["once", "--backend", "sim", "--scenario", str(DEMO), "--node", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no node 'nope'" in err and "gpu-h100-ts" in err


def test_run_without_a_cluster_configuration_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "no-kubeconfig"
    assert (
        main(
            ["run", "--backend", "sim", "--scenario", str(DEMO), "--node", "gpu-a10-vgpu", "--kubeconfig", str(missing)]
        )
        == 2
    )
    assert "cannot load a Kubernetes configuration" in capsys.readouterr().err


def test_bad_durations_and_fractions_are_refused():
    with pytest.raises(click.UsageError):
        parse_args(["run", "--sample-interval", "often"])
    with pytest.raises(click.UsageError):
        parse_args(["run", "--deadband-fraction", "2"])


def test_run_defaults_and_environment(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-1")
    monkeypatch.setenv("VRAMGUARD_SAMPLE_INTERVAL", "15s")
    monkeypatch.setenv("VRAMGUARD_DEADBAND", "128Mi")
    args = parse_args(["run"])
    assert (args.node, args.sample_interval, args.deadband) == ("gpu-1", 15.0, 128 * 1024 * 1024)
    assert (args.heartbeat, args.min_report_interval, args.deadband_fraction) == (30.0, 5.0, 0.02)
    assert args.backend == "nvml" and args.metrics_address == ":9402"


def test_sim_speed_flag_environment_and_errors(monkeypatch):
    assert parse_args(["run"]).sim_speed == 1.0
    assert parse_args(["once", "--sim-speed", "60"]).sim_speed == 60.0
    monkeypatch.setenv("VRAMGUARD_SIM_SPEED", "30")
    assert parse_args(["run"]).sim_speed == 30.0
    for bad in ("0", "-2", "fast", "inf"):
        with pytest.raises(click.UsageError):
            parse_args(["run", "--sim-speed", bad])


def test_once_at_sim_speed_samples_scenario_time(tmp_path):
    """``--sim-speed`` reaches the simulated backend (it fails for a bad value)."""
    from vramguard_agent.agent import build

    args = parse_args(
        ["once", "--backend", "sim", "--scenario", str(DEMO), "--node", "gpu-a10-vgpu", "--sim-speed", "120"]
    )
    parts = build(_config(args))
    try:
        assert parts.backend.speed == 120.0  # type: ignore[attr-defined]
        assert parts.sampler.history_clock == parts.backend.now  # type: ignore[attr-defined]
    finally:
        parts.close()


@pytest.mark.parametrize(("var", "value", "flag"), [
    ("VRAMGUARD_HISTORY_POINTS", "many", "--history-points"),
    ("VRAMGUARD_HISTORY_POINTS", "0", "--history-points"),
    ("VRAMGUARD_LOG_LEVEL", "LOUD", "--log-level"),
    ("VRAMGUARD_RAM_INTERVAL", "soon", "--ram-interval"),
    ("VRAMGUARD_SAMPLE_INTERVAL", "-10s", "--sample-interval"),
    ("VRAMGUARD_SIM_SPEED", "fast", "--sim-speed"),
    ("VRAMGUARD_SIM_SPEED", "0", "--sim-speed"),
])
def test_bad_environment_values_name_the_variable_not_a_traceback(monkeypatch, capsys, var, value, flag):
    monkeypatch.setenv(var, value)
    assert main(["once", "--node", "n"]) == 2
    err = capsys.readouterr().err
    assert flag in err and var in err and repr(value) in err


def test_flags_override_bad_environment_values_and_levels_are_case_insensitive(monkeypatch):
    monkeypatch.setenv("VRAMGUARD_HISTORY_POINTS", "many")
    args = parse_args(["once", "--history-points", "50", "--log-level", "debug"])
    assert (args.history_points, args.log_level) == (50, "DEBUG")


def test_ram_interval_flag_and_environment_reach_the_cgroup_reader(monkeypatch):
    from vramguard_agent.agent import build

    assert _config(parse_args(["run", "--node", "n"])).ram_interval_s == 30.0
    monkeypatch.setenv("VRAMGUARD_RAM_INTERVAL", "1m")
    assert _config(parse_args(["run", "--node", "n"])).ram_interval_s == 60.0
    args = parse_args(
        ["once", "--backend", "sim", "--scenario", str(DEMO), "--node", "gpu-a10-vgpu", "--ram-interval", "0s"]
    )
    parts = build(_config(args))
    try:
        assert parts.sampler.memory.refresh_s == 0.0
    finally:
        parts.close()
    with pytest.raises(click.UsageError):
        parse_args(["run", "--ram-interval", "-5s"])


@pytest.mark.parametrize(("var", "value", "flag"), [
    ("VRAMGUARD_DEADBAND", "lots", "--deadband"),
    ("VRAMGUARD_DEADBAND_FRACTION", "1.5", "--deadband-fraction"),
    ("VRAMGUARD_HEARTBEAT", "often", "--heartbeat"),
])
def test_bad_run_environment_values_name_the_variable(monkeypatch, capsys, var, value, flag):
    monkeypatch.setenv(var, value)
    with pytest.raises(click.UsageError) as exit_:
        parse_args(["run", "--node", "n"])
    exit_.value.show()  # what the command prints
    err = capsys.readouterr().err
    assert exit_.value.exit_code == 2 and flag in err and var in err and repr(value) in err


def test_enforce_caps_flag_and_environment(monkeypatch):
    from vramguard_agent.agent import build

    assert _config(parse_args(["run", "--node", "n"])).enforce_caps is False
    assert _config(parse_args(["run", "--node", "n", "--enforce-caps"])).enforce_caps is True
    monkeypatch.setenv("VRAMGUARD_ENFORCE_CAPS", "true")
    assert _config(parse_args(["run", "--node", "n"])).enforce_caps is True
    assert _config(parse_args(["run", "--node", "n", "--no-enforce-caps"])).enforce_caps is False
    monkeypatch.setenv("POD_UID", "0000-agent")
    args = parse_args(["once", "--backend", "sim", "--scenario", str(DEMO), "--node", "gpu-a10-vgpu"])
    cfg = _config(args)
    assert cfg.enforce_caps is False and cfg.pod_uid == "0000-agent"  # once never applies limits
    parts = build(cfg)
    try:
        caps = parts.caps
        assert caps is not None and caps.enforce is False and caps.own_pod_uid == "0000-agent"
    finally:
        parts.close()
    with pytest.raises(click.UsageError):
        parse_args(["once", "--enforce-caps"])  # a run setting only


def test_bad_enforce_caps_environment_names_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("VRAMGUARD_ENFORCE_CAPS", "maybe")
    with pytest.raises(click.UsageError) as exit_:
        parse_args(["run", "--node", "n"])
    exit_.value.show()
    err = capsys.readouterr().err
    assert "--enforce-caps" in err and "VRAMGUARD_ENFORCE_CAPS" in err and "'maybe'" in err


def test_once_without_a_readable_device_prints_the_report_and_exits_1(tmp_path, capsys):
    doc = yaml.safe_load(DEMO.read_text())
    for n in doc["nodes"]:
        n["faults"] = [{"type": "nvml-unavailable", "from": "0s", "until": "1h"}]
    path = tmp_path / "down.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["once", "--backend", "sim", "--scenario", str(path), "--node", "gpu-a10-vgpu"]) == 1
    out, err = capsys.readouterr()
    status = NodeGPUUsageStatus.model_validate(json.loads(out))
    assert status.healthy_devices == 0 and status.devices == []
    assert err.splitlines() == [err.strip()] and err.startswith("vramguard-agent once: no GPU device can be read:")
