"""The local cluster's tools for Python callers (tests/e2e, hack/demo): the
settings of hack/cluster/versions.sh, the kubectl that build.sh built at the
cluster's version (never one on the host's PATH), and a `kubectl wait` that
survives an object's first moments.

Importable by putting hack/cluster on sys.path (hack/ is no package)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

VERSIONS = Path(__file__).resolve().parent / "versions.sh"


def settings(*names: str) -> dict[str, str]:
    """The values of shell variables ``names`` as hack/cluster/versions.sh sets them
    (VG_CACHE and the other overrides of the environment apply); CalledProcessError if bash fails."""
    script = f"source {VERSIONS} && " + " && ".join(f'echo "${n}"' for n in names)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    return dict(zip(names, out, strict=True))


def kubectl_binary() -> str:
    """The path of the kubectl that hack/cluster/build.sh built; FileNotFoundError, saying
    how to build it, when it is missing."""
    path = settings("KUBECTL")["KUBECTL"]
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} missing; run hack/cluster/build.sh first")
    return path


Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]
"""A kubectl runner: ``run(*args, check=False)`` returns the finished process."""


def wait(kubectl: Kubectl, *args: str, timeout_s: float = 60.0, retry_s: float = 1.0) -> str:
    """``kubectl wait ARGS`` retried until ``timeout_s`` seconds have passed; returns its stdout.

    A freshly created object can have no status, or ``status.conditions: null``,
    for a moment; kubectl then fails at once (".status.conditions accessor
    error: <nil> is of the type <nil>") instead of waiting, and a name or
    selector can match nothing yet. Every failure before the deadline is
    retried; RuntimeError with kubectl's last message after it."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(1, round(deadline - time.monotonic()))
        done = kubectl("wait", *args, f"--timeout={left}s", check=False)
        if done.returncode == 0:
            return str(done.stdout)
        if time.monotonic() >= deadline:
            raise RuntimeError(f"kubectl wait {' '.join(args)}: {done.stderr.strip()} (after {timeout_s:g} s)")
        time.sleep(retry_s)
