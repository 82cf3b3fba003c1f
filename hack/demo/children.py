"""The demo runner's child processes (hack/demo/run.py): the operator and the
simulated agents, each logging to a file in the run's work directory, each
dying with the runner."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the runner dies, however it dies,
    so that nothing it started keeps running (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Children:
    """The processes the runner started, as (name, process, log file), in start order."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        """Start ``argv`` with ``env``, its output in ``<workdir>/<name>.log``."""
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.procs.append((name, proc, log))

    def check(self) -> None:
        """Raise RuntimeError naming the first child that exited, with its log's last 30 lines."""
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM every child still running; SIGKILL those not gone within 20 s in all."""
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
