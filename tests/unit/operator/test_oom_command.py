"""``vramguard oom`` against a scripted API server (the real kubernetes client)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.unit.agent.stubapi import StubAPI
from tests.unit.operator.test_oom_publisher import CID, NODE, TORCH, pod, report_body
from vramguard_operator.cli.main import main


@pytest.fixture
def stub():
    s = StubAPI()
    yield s
    s.close()


def kubeconfig(tmp_path: Any, url: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    return str(path)


def script(stub: StubAPI) -> None:
    stub.respond("GET", r"/nodegpuusages$", (200, {"items": [report_body(ack=10)]}))
    stub.respond("GET", r"/pods$", (200, {"items": [pod("victim", CID, "Error", 1, TORCH),
                                                     pod("done", "d" * 64, "Completed", 0, None)]}))
    stub.respond("GET", r"/nodes$", (200, {"items": [NODE]}))


def test_the_table_lists_memory_kills_with_verdict_and_blame(stub, tmp_path, capsys):
    script(stub)
    assert main(["oom", "--kubeconfig", kubeconfig(tmp_path, stub.url)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:6] == ["TIME", "NAMESPACE", "POD", "CONTAINER", "KIND", "VERDICT"]
    assert len(lines) == 2  # the normal exit is left out
    assert "victim" in lines[1] and "GPUOutOfMemory" in lines[1] and "Innocent" in lines[1]
    assert "ml/greedy +5Gi" in lines[1] and "10Gi" in lines[1]


def test_json_and_since(stub, tmp_path, capsys):
    script(stub)
    assert main(["oom", "--json", "--kubeconfig", kubeconfig(tmp_path, stub.url)]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["pod"], row["kind"], row["verdict"], row["shareBytes"]) == ("victim", "GPUOutOfMemory", "Innocent",
                                                                            10 << 30)
    assert row["neighboursAboveShare"][0]["name"] == "ml/greedy"
    script(stub)
    assert main(["oom", "--since", "1h", "--kubeconfig", kubeconfig(tmp_path, stub.url)]) == 0
    assert capsys.readouterr().out.strip() == "No OOM kills found."  # the records are from 2026-01-01


def test_an_unreadable_cluster_is_one_line(tmp_path, capsys):
    assert main(["oom", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("vramguard oom: cannot read the cluster:")
