"""``vramguard-agent``'s flags and variables: every one reaches ``AgentConfig``
or ``PublishPolicy``, the flag wins over the variable over the default, and a
bad value names the flag, the variable and the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from vramguard_agent.agent import AgentConfig
from vramguard_agent.publish import PublishPolicy
from vramguard_agent.settings import PARAMETERS, agent_config, parse, publish_policy

MI = 1 << 20


def run_config(argv: list[str], env: dict[str, str]) -> AgentConfig:
    parsed = parse(["run", *argv], env=env)
    return agent_config(parsed.params, publish_policy(parsed.params))


def get(cfg: AgentConfig, path: str) -> Any:
    value: Any = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


# (flag, variable, value for the variable, value for the flag, AgentConfig path,
#  read from the variable, read from the flag, default)
RUN_SETTINGS = [
    ("--node", "NODE_NAME", "gpu-1", "gpu-2", "node_name", "gpu-1", "gpu-2", None),
    ("--backend", "VRAMGUARD_BACKEND", "sim", "nvml", "backend", "sim", "nvml", "nvml"),
    ("--scenario", "VRAMGUARD_SCENARIO", "/s/a.yaml", "/s/b.yaml", "scenario", Path("/s/a.yaml"),
     Path("/s/b.yaml"), None),
    ("--proc-root", "VRAMGUARD_PROC_ROOT", "/host/proc", "/p", "proc_root", Path("/host/proc"), Path("/p"), None),
    ("--cgroup-root", "VRAMGUARD_CGROUP_ROOT", "/host/cg", "/c", "cgroup_root", Path("/host/cg"), Path("/c"), None),
    ("--sample-interval", "VRAMGUARD_SAMPLE_INTERVAL", "15s", "2s", "sample_interval_s", 15.0, 2.0, 10.0),
    ("--history-window", "VRAMGUARD_HISTORY_WINDOW", "1h", "30m", "history_window_s", 3600.0, 1800.0, 7200.0),
    ("--history-points", "VRAMGUARD_HISTORY_POINTS", "60", "3", "history_points", 60, 3, 120),
    ("--trend-interval", "VRAMGUARD_TREND_INTERVAL", "1m", "10m", "trend_interval_s", 60.0, 600.0, 300.0),
    ("--ram-interval", "VRAMGUARD_RAM_INTERVAL", "0s", "1m", "ram_interval_s", 0.0, 60.0, 30.0),
    ("--sim-offset", "VRAMGUARD_SIM_OFFSET", "21m", "1h", "sim_offset_s", 1260.0, 3600.0, 0.0),
    ("--sim-speed", "VRAMGUARD_SIM_SPEED", "30", "0.5", "sim_speed", 30.0, 0.5, 1.0),
    ("--sim-driver-state", "VRAMGUARD_SIM_DRIVER_STATE", "/s/env", "/s/flag", "sim_driver_state",
     Path("/s/env"), Path("/s/flag"), None),
    ("--kubeconfig", "KUBECONFIG", "/k/env", "/k/flag", "kubeconfig", "/k/env", "/k/flag", None),
    ("--metrics-address", "VRAMGUARD_METRICS_ADDRESS", "", ":9400", "metrics_address", None, ":9400", ":9402"),
    ("--heartbeat", "VRAMGUARD_HEARTBEAT", "1m", "10s", "policy.heartbeat_s", 60.0, 10.0, 30.0),
    ("--min-report-interval", "VRAMGUARD_MIN_REPORT_INTERVAL", "1s", "0s", "policy.min_interval_s", 1.0, 0.0, 5.0),
    ("--deadband", "VRAMGUARD_DEADBAND", "128Mi", "1Gi", "policy.deadband_bytes", 128 * MI, 1024 * MI, 64 * MI),
    ("--deadband-fraction", "VRAMGUARD_DEADBAND_FRACTION", "0.1", "0", "policy.deadband_fraction", 0.1, 0.0, 0.02),
    ("--pod-uid", "POD_UID", "uid-env", "uid-flag", "pod_uid", "uid-env", "uid-flag", None),
    ("--simgpu-socket", "VRAMGUARD_SIMGPU_SOCKET", "/s/env.sock", "/s/flag.sock", "simgpu_socket",
     Path("/s/env.sock"), Path("/s/flag.sock"), None),
]


@pytest.mark.parametrize(("flag", "var", "env_value", "flag_value", "path", "from_env", "from_flag", "default"),
                         RUN_SETTINGS, ids=[row[0] for row in RUN_SETTINGS])
def test_every_run_setting_reads_its_flag_over_its_variable_over_its_default(
    flag, var, env_value, flag_value, path, from_env, from_flag, default
):
    assert get(run_config([], {}), path) == default
    assert get(run_config([], {var: env_value}), path) == from_env
    assert get(run_config([flag, flag_value], {var: env_value}), path) == from_flag


def test_log_level_reads_its_flag_over_its_variable_over_its_default():
    for command in ("run", "once"):
        assert parse([command], env={}).params["log_level"] == "INFO"
        assert parse([command], env={"VRAMGUARD_LOG_LEVEL": "debug"}).params["log_level"] == "DEBUG"
        assert parse([command, "--log-level", "error"], env={"VRAMGUARD_LOG_LEVEL": "debug"}).params[
            "log_level"] == "ERROR"


def test_once_shares_the_sampling_settings_but_not_kubeconfig_from_the_environment():
    sampling = [row for row in RUN_SETTINGS if not row[4].startswith("policy.")
                and row[0] not in ("--metrics-address", "--kubeconfig")]
    for flag, var, env_value, flag_value, path, from_env, from_flag, _ in sampling:
        assert get(agent_config(parse(["once"], env={var: env_value}).params), path) == from_env
        assert get(agent_config(parse(["once", flag, flag_value], env={var: env_value}).params), path) == from_flag
    once = agent_config(parse(["once"], env={"KUBECONFIG": "/k/env"}).params)
    assert once.kubeconfig is None and once.metrics_address is None and once.policy == PublishPolicy()
    assert agent_config(parse(["once", "--kubeconfig", "/k"], env={}).params).kubeconfig == "/k"
    assert parse(["once", "--pretty"], env={}).params["pretty"] is True


def test_attribute_settings():
    assert parse(["attribute", "42"], env={}).params == {"pid": 42, "proc_root": Path("/proc")}
    assert parse(["attribute", "42"], env={"VRAMGUARD_PROC_ROOT": "/h"}).params["proc_root"] == Path("/h")
    assert parse(["attribute", "42", "--proc-root", "/f"], env={"VRAMGUARD_PROC_ROOT": "/h"}).params[
        "proc_root"] == Path("/f")
    with pytest.raises(click.UsageError, match="want a command: run, once, attribute"):
        parse(["fake-host", "--out", "o"], env={})  # vramguard-sim's (tests/unit/sim/test_sim_cli.py)


def test_the_table_covers_every_run_and_once_parameter():
    named = {row[0] for row in RUN_SETTINGS} | {"--log-level", "--pretty", "--enforce-caps"}
    for command in ("run", "once"):
        for param in PARAMETERS[command][0]():
            assert set(param.opts) & named, f"{command} {param.opts} is not tested"


# (flag, variable, bad value)
BAD_VALUES = [
    ("--backend", "VRAMGUARD_BACKEND", "cuda"),
    ("--sample-interval", "VRAMGUARD_SAMPLE_INTERVAL", "often"),
    ("--history-points", "VRAMGUARD_HISTORY_POINTS", "2"),
    ("--sim-speed", "VRAMGUARD_SIM_SPEED", "inf"),
    ("--log-level", "VRAMGUARD_LOG_LEVEL", "LOUD"),
    ("--heartbeat", "VRAMGUARD_HEARTBEAT", "-1s"),
    ("--deadband", "VRAMGUARD_DEADBAND", "-1Mi"),
    ("--deadband-fraction", "VRAMGUARD_DEADBAND_FRACTION", "1"),
]


@pytest.mark.parametrize(("flag", "var", "bad"), BAD_VALUES, ids=[f"{r[0]}={r[2]}" for r in BAD_VALUES])
def test_a_bad_value_names_flag_variable_and_value(flag, var, bad):
    for argv, env in ((["run", flag, bad], {}), (["run"], {var: bad})):
        with pytest.raises(click.BadParameter) as err:
            parse(argv, env=env)
        text = err.value.format_message()
        assert flag in text and var in text and repr(bad) in text, text


def test_enforce_caps_reads_its_flags_over_its_variable_over_its_default():
    """A boolean: --enforce-caps / --no-enforce-caps, VRAMGUARD_ENFORCE_CAPS true/false (empty: unset)."""
    assert run_config([], {}).enforce_caps is False
    assert run_config([], {"VRAMGUARD_ENFORCE_CAPS": "true"}).enforce_caps is True
    assert run_config([], {"VRAMGUARD_ENFORCE_CAPS": ""}).enforce_caps is False
    assert run_config(["--enforce-caps"], {"VRAMGUARD_ENFORCE_CAPS": "off"}).enforce_caps is True
    assert run_config(["--no-enforce-caps"], {"VRAMGUARD_ENFORCE_CAPS": "1"}).enforce_caps is False
    assert agent_config(parse(["once"], env={"VRAMGUARD_ENFORCE_CAPS": "true"}).params).enforce_caps is False
    with pytest.raises(click.BadParameter) as err:
        parse(["run"], env={"VRAMGUARD_ENFORCE_CAPS": "maybe"})
    text = err.value.format_message()
    assert "--enforce-caps" in text and "VRAMGUARD_ENFORCE_CAPS" in text and "'maybe'" in text, text
