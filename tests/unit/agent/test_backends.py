"""The agent finds its GPU backends by name through entry points: the product's nvml,
the simulators' sim and simdriver (vramguard-sim), and refuses, in one line naming
the backend and what to install, a name that no installed distribution registers."""

from __future__ import annotations

from importlib.metadata import entry_points as real_entry_points

import pytest

from vramguard_agent import backends
from vramguard_agent.cli import main
from vramguard_agent.config import AgentConfig
from vramguard_agent.settings import agent_config, parse


def test_the_installed_backends_are_the_products_and_the_simulators():
    assert backends.installed() == ["nvml", "sim", "simdriver"]
    assert backends.load("nvml") is backends.NVML
    from vramguard_sim.agent_backends import DRIVER, SCENARIO

    assert (backends.load("sim"), backends.load("simdriver")) == (SCENARIO, DRIVER)


@pytest.fixture
def without_simulators(monkeypatch):
    """The product alone: vramguard-sim's entry points are not there."""

    def product_only(**kw):
        return [ep for ep in real_entry_points(**kw) if not ep.value.startswith("vramguard_sim")]

    monkeypatch.setattr(backends, "entry_points", product_only)


def test_a_backend_not_installed_is_refused_in_one_line_with_the_install_hint(without_simulators, capsys):
    with pytest.raises(backends.BackendNotInstalled) as err:
        backends.load("sim")
    message = str(err.value)
    assert "backend 'sim' is not installed (installed: nvml)" in message and "pip install 'vramguard[sim]'" in message
    assert main(["once", "--backend", "sim", "--node", "n"]) == 2
    out = capsys.readouterr().err
    assert "--backend" in out and "'sim' is not installed" in out and "vramguard[sim]" in out
    assert agent_config(parse(["once", "--node", "n"], env={}).params).backend == "nvml"


def test_a_misspelt_backend_names_flag_variable_and_what_is_installed(capsys):
    assert main(["once", "--node", "n", "--backend", "nvlm"]) == 2
    err = capsys.readouterr().err
    assert "--backend" in err and "'nvlm' is not installed (installed: nvml, sim, simdriver)" in err


def test_each_backend_refuses_the_settings_it_cannot_use(tmp_path):
    with pytest.raises(ValueError, match="--simgpu-socket: the simulated driver is read by --backend simdriver"):
        backends.NVML.build(AgentConfig("n", simgpu_socket=tmp_path / "s"), None)
    with pytest.raises(ValueError, match="backend simdriver: --simgpu-socket is required"):
        backends.load("simdriver").build(AgentConfig("n", backend="simdriver"), None)
    with pytest.raises(ValueError, match="backend sim: --scenario is required"):
        backends.load("sim").build(AgentConfig("n", backend="sim"), None)


def test_the_nvml_backend_reads_the_hosts_trees_and_the_api_pods():
    parts = backends.NVML.build(AgentConfig("n"), None)
    assert (str(parts.proc_root), str(parts.cgroup_root), parts.pods()) == ("/proc", "/sys/fs/cgroup", {})
    assert parts.nvml is parts.gpu.library and parts.history_clock is None  # type: ignore[attr-defined]
