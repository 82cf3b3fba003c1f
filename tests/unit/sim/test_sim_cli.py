"""The vramguard-sim command: its settings, and its refusals (exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from vramguard_sim.cli import group, main


def parse(argv: list[str]) -> dict[str, object]:
    """The values ``vramguard-sim ARGV`` reads (seconds, paths)."""
    command = group().commands[argv[0]]
    with command.make_context(f"vramguard-sim {argv[0]}", argv[1:]) as ctx:
        return dict(ctx.params)


def test_fake_host_settings(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "n")
    fake = parse(["fake-host", "--scenario", "s.yaml", "--out", "o", "--at", "5m"])
    assert fake == {"scenario": Path("s.yaml"), "node": "n", "out": Path("o"), "at": 300.0, "kubeconfig": None}
    with pytest.raises(click.UsageError):
        parse(["fake-host", "--out", "o"])


def test_a_missing_scenario_and_an_unknown_command_are_refused(tmp_path, capsys):
    assert main(["fake-host", "--scenario", str(tmp_path / "none.yaml"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "none.yaml" in err and len(err.strip().splitlines()) == 1
    assert main(["run"]) == 2 and "No such command 'run'" in capsys.readouterr().err
