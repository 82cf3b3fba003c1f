"""hack/cluster/localkube.py: the wait that survives a new object's first moments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "hack" / "cluster"))
import localkube  # noqa: E402

NULL_CONDITIONS = "error: .status.conditions accessor error: <nil> is of the type <nil>, expected []interface{}"


class Script:
    """kubectl answering from a list of (returncode, stderr), recording its arguments."""

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers, self.calls = answers, []  # type: ignore[var-annotated]

    def __call__(self, *args: str, check: bool = True, **_: Any) -> subprocess.CompletedProcess[str]:
        assert not check
        self.calls.append(args)
        rc, err = self.answers[min(len(self.calls), len(self.answers)) - 1]
        return subprocess.CompletedProcess(["kubectl", *args], rc, "condition met\n" if rc == 0 else "", err)


def test_a_null_status_and_a_missing_object_are_retried_until_the_condition_is_met():
    kubectl = Script([(1, NULL_CONDITIONS), (1, 'Error from server (NotFound): crds "x" not found'), (0, "")])
    out = localkube.wait(kubectl, "--for=condition=Established", "crd/x", timeout_s=10, retry_s=0.01)
    assert out == "condition met\n" and len(kubectl.calls) == 3
    assert all(c[:3] == ("wait", "--for=condition=Established", "crd/x") for c in kubectl.calls)
    assert kubectl.calls[0][3].startswith("--timeout=") and kubectl.calls[0][3].endswith("s")


def test_after_the_deadline_it_fails_with_kubectls_last_message():
    kubectl = Script([(1, NULL_CONDITIONS)])
    with pytest.raises(RuntimeError, match="accessor error"):
        localkube.wait(kubectl, "--for=condition=Established", "crd/x", timeout_s=0.05, retry_s=0.01)
    assert len(kubectl.calls) >= 2


def test_the_settings_come_from_versions_sh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("VG_CACHE", str(tmp_path))
    s = localkube.settings("K8S_VERSION", "KUBECTL")
    assert s["KUBECTL"] == f"{tmp_path}/bin/kubectl-{s['K8S_VERSION']}/kubectl"
    with pytest.raises(FileNotFoundError, match="run hack/cluster/build.sh"):
        localkube.kubectl_binary()
