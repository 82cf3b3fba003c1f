"""A ``pynvml`` stand-in that reads the simulated driver (``simdriver``) of the real node.

``DriverNVML`` is the fake ``pynvml`` (``fakenvml.FakeNVML``: nvidia-ml-py's
own error classes, constants, structs and signatures) whose devices and
process lists come from the simulated driver's socket instead of a test's
state: every NVML call that reads a device asks the driver again, as each real
NVML call asks the kernel module, so two calls of one sample can see a process
appear or exit between them, as on a GPU node. The PIDs are the host PIDs the
driver learnt from its clients' connections (``SO_PEERCRED``), so the agent's
``NVMLBackend`` attributes them through ``/proc/<pid>/cgroup`` exactly as it
attributes a real driver's.

A driver that does not answer (no socket, the daemon gone) is what a node
without the kernel module shows: ``nvmlInit`` and every later call raise
``NVMLError_DriverNotLoaded``. The driver's version is below r615, so the
per-cgroup memory-limit functions raise ``FunctionNotFound`` as on such a
driver (``fakenvml_limits``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pynvml as _real

from .fakenvml import FakeGPU, FakeNVML, FakeProcess

QUERY_TIMEOUT_S = 2.0
MAX_ANSWER_BYTES = 1 << 20


def query(path: str | Path, timeout_s: float = QUERY_TIMEOUT_S) -> dict[str, Any]:
    """The simulated driver's state (``SimDriver.state()``: ``driverVersion``,
    ``devices`` with bytes and host PIDs). Raises ``OSError`` when the driver
    does not answer within ``timeout_s`` seconds, ``ValueError`` for an answer
    that is not its JSON state."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(b'{"op": "query"}\n')
        with sock.makefile("rb") as stream:
            line = stream.readline(MAX_ANSWER_BYTES)
    state = json.loads(line)
    if not isinstance(state, dict) or not isinstance(state.get("devices"), list):
        raise ValueError(f"simulated driver at {path}: unexpected answer {line[:200]!r}")
    return state


class DriverNVML(FakeNVML):
    """``pynvml`` over the simulated driver at ``socket_path``; pass it to
    ``NVMLBackend(nvml=...)``. See the module doc for the errors it raises."""

    def __init__(self, socket_path: str | Path) -> None:
        super().__init__()
        self.socket_path = Path(socket_path)
        self._by_uuid: dict[str, FakeGPU] = {}

    def _refresh(self) -> None:
        """Read the driver's state into ``gpus`` (the same ``FakeGPU`` object per
        UUID, so a handle taken earlier sees the device's current state)."""
        try:
            state = query(self.socket_path)
        except (OSError, ValueError) as err:
            raise _real.NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED) from err
        gpus = []
        for d in state["devices"]:
            gpu = self._by_uuid.get(d["uuid"])
            if gpu is None:
                gpu = self._by_uuid[d["uuid"]] = FakeGPU(uuid=d["uuid"], name=d["name"], total_bytes=d["totalBytes"])
            gpu.reserved_bytes, gpu.overhead_bytes = d["reservedBytes"], d["overheadBytes"]
            gpu.processes = [FakeProcess(p["pid"], p["usedBytes"]) for p in d["processes"]]
            gpus.append(gpu)
        self.gpus = gpus
        self.driver_version = str(state.get("driverVersion", self.driver_version))

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        self._refresh()
        self._refcount += 1

    def _check_init(self) -> None:
        # Every call checks initialisation first: each reads the driver afresh.
        super()._check_init()
        self._refresh()
