"""The ``vramguard`` command group: its subcommands, the offline ones without
kopf, and ``kopf run -m vramguard_operator.controller.handlers`` registering
every handler the command does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kopf

from vramguard_operator.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "replay"


def python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "operator", "agent", "sim"))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("operator", "top", "analyze", "replay"))


def test_replay_and_analyze_run_without_kopf_or_a_cluster(tmp_path):
    """kopf cannot be imported, no KUBECONFIG points anywhere: both commands
    still work (the ``vramguard`` group imports kopf only when ``operator`` runs)."""
    log = tmp_path / "leak.csv"
    log.write_text("".join(f"{60 * i},{2**30 + i * 2**24}\n" for i in range(120)))
    code = f"""
import os, sys
sys.modules["kopf"] = None  # import kopf now raises ImportError
os.environ["KUBECONFIG"] = {str(tmp_path / "absent")!r}
from vramguard_operator.cli.main import main
assert main(["replay", "--budget", {str(EXAMPLE / "budget.yaml")!r}, "--usage", {str(EXAMPLE / "usage.csv")!r}]) == 0
assert main(["analyze", {str(log)!r}]) == 1  # 1: a leak
print("ok")
"""
    done = python(code)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_the_command_group_and_its_own_subcommands_run_without_the_simulators():
    """vramguard_sim cannot be imported: ``--help`` lists ``simulate`` all the same
    (its help is the product's table), ``replay`` runs, and ``simulate`` says what to install."""
    code = f"""
import sys
sys.modules["vramguard_sim"] = None  # import vramguard_sim now raises ImportError
from vramguard_operator.cli import main as cli
cli.entry_points = lambda **kw: []  # and no distribution registers a command
assert cli.main(["--help"]) == 0
assert cli.main(["replay", "--budget", {str(EXAMPLE / "budget.yaml")!r}, "--usage", {str(EXAMPLE / "usage.csv")!r}]) == 0
assert cli.main(["simulate", "--seed", "1"]) == 2
print("ok")
"""
    done = python(code)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    assert "simulate a GPU fleet" in done.stdout
    assert done.stderr.strip().splitlines() == [
        "vramguard simulate: not installed; the fleet simulation comes with pip install 'vramguard[sim]' "
        "(a checkout: pip install ./sim)"
    ]


def test_simulate_is_found_through_the_entry_point_of_vramguard_sim(capsys):
    from vramguard_operator.cli.main import COMMANDS_GROUP, plugin_module

    module = plugin_module("simulate", "hint")
    assert module.__name__ == "vramguard_sim.simulate.command" and COMMANDS_GROUP == "vramguard.commands"
    assert main(["simulate", "--nodes", "x"]) == 2  # its own parser, reached through the group
    assert "vramguard simulate: --nodes: 'x'" in capsys.readouterr().err


def test_argparse_subcommands_get_their_arguments_as_given(capsys):
    rc = main(["replay", "--budget", str(EXAMPLE / "budget.yaml"), "--usage", str(EXAMPLE / "usage.csv"), "--json"])
    assert rc == 0 and capsys.readouterr().out.lstrip().startswith('{\n "decisions": [')


def test_importing_the_handlers_registers_the_policy_handlers():
    """``kopf run -m vramguard_operator.controller.handlers`` gets the policy
    status writer too; kopf itself watches nothing (vramguard's informers do)."""
    from vramguard_operator.controller import handlers  # noqa: F401

    registry = kopf.get_default_registry()
    assert not registry._indexing.get_all_handlers()
    assert not registry._watching.get_all_handlers()
    startups = {h.id for h in registry._activities.get_all_handlers()}
    assert {"operator_startup", "policy_status_startup", "evaluation"} <= startups
