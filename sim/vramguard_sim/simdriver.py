"""A simulated GPU driver that real processes use (docs/real-node.md, "The simulated GPU").

The real node has no GPU, so this daemon plays the kernel driver: it holds the
node's devices (``vramguard_sim.gpumem.Device``, the memory semantics the
simulated backend and the fleet simulation share) and serves a Unix stream
socket that pods mount from the host, as a CUDA program's container gets
``/dev/nvidia*``. A workload (``hack/cluster/simcuda``) connects, opens a
context on a device and asks for the memory it wants; the driver grants or
refuses each allocation as ``Device`` decides. A refused allocation is
out-of-memory: the process leaves the device, everything it held is freed, and
the workload exits as a framework does on "CUDA out of memory". Memory is also
freed when the connection closes, however the process ends (exit, SIGTERM,
SIGKILL by the kubelet).

The driver knows each client by the **host PID** the kernel gives it with the
connection (``SO_PEERCRED``, translated into the driver's PID namespace, the
host's), as the NVIDIA kernel module knows a process by its host PID. The
agent reads the devices through ``drivernvml.DriverNVML``, a ``pynvml``
stand-in whose process lists carry those PIDs, so the agent's production path
(NVML process list -> ``/proc/<pid>/cgroup`` -> pod) runs unchanged.

Protocol: one JSON object a line each way (UTF-8). Requests:

- ``{"op": "open", "device": N}``: a context on device ``N`` for the peer's
  PID (one context per connection; a PID has at most one per device);
- ``{"op": "resize", "bytes": B}``: hold ``B`` bytes on the context's device
  (frees the excess or allocates the difference);
- ``{"op": "query"}``: the driver's state (what NVML reads), see ``state()``.

Answers: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; a refused
allocation answers ``"error": "out of memory"`` with ``heldBytes`` (what the
process held, now freed), ``requestedBytes`` and ``freeBytes``, and ends the
context.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import struct
import threading
from pathlib import Path
from typing import Any

from vramguard_agent.cgroups import attribute_pid
from vramguard_api.units import format_bytes
from vramguard_sim.gpumem import Device, OOMKill

from .scenario import SimGPU
from .simbackend import gpu_uuid

log = logging.getLogger("vramguard.sim.simdriver")

DEFAULT_DRIVER_VERSION = "570.133.20"  # the real node's nvidia.com/cuda.driver-version label
MAX_REQUEST_BYTES = 4096
_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (socket(7), SO_PEERCRED)


class DriverError(Exception):
    """A request the driver refuses (unknown device, no context, bad field)."""


class SimDriver:
    """The node's simulated devices and the contexts on them; thread-safe.

    ``gpus`` are scenario GPU specs (``count`` of each; MIG is not simulated
    here and raises ``ValueError``); UUIDs are ``simbackend.gpu_uuid(node, index)``
    unless the spec names them.
    """

    def __init__(self, node: str, gpus: list[SimGPU], driver_version: str = DEFAULT_DRIVER_VERSION) -> None:
        self.node = node
        self.driver_version = driver_version
        self.names: list[str] = []
        self.devices: list[Device] = []
        for spec in gpus:
            if spec.mig is not None:
                raise ValueError(f"gpus: model {spec.model!r}: MIG is not simulated by the driver")
            for i in range(spec.count):
                index = len(self.devices)
                uuid = spec.uuids[i] if spec.uuids else gpu_uuid(node, index)
                self.devices.append(Device(uuid, spec.memory, spec.reserved, spec.overhead))
                self.names.append(spec.model)
        self.oom_kills: list[OOMKill] = []
        self._lock = threading.Lock()

    def _device(self, index: Any) -> Device:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.devices):
            raise DriverError(f"device: want an index in [0, {len(self.devices)}), got {index!r}")
        return self.devices[index]

    def open(self, pid: int, index: Any) -> dict[str, Any]:
        """Process ``pid`` opens a context on device ``index``; raises ``DriverError``."""
        with self._lock:
            device = self._device(index)
            if pid in device.processes:
                raise DriverError(f"pid {pid} already has a context on device {index}")
            device.start(pid, owner=_owner(pid))
            return {"ok": True, "uuid": device.uuid, "name": self.names[index],
                    "totalBytes": device.total_bytes, "freeBytes": device.free_bytes}

    def resize(self, pid: int, index: int, wanted: Any) -> dict[str, Any]:
        """Process ``pid`` moves to holding ``wanted`` bytes on device ``index``.
        Out of memory answers ``ok: false`` and ends the context (``Device`` semantics)."""
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
            raise DriverError(f"bytes: want a whole number >= 0, got {wanted!r}")
        with self._lock:
            device = self._device(index)
            if pid not in device.processes:
                raise DriverError(f"pid {pid} has no context on device {index}")
            kills = device.resize(pid, wanted)
            if not kills:
                return {"ok": True, "heldBytes": device.holding(pid), "freeBytes": device.free_bytes,
                        "totalBytes": device.total_bytes}
            kill = kills[0]
            self.oom_kills.append(kill)
        log.warning(
            "pid %d (%s) out of memory on %s: held %s, an allocation of %s failed with %s free; its memory is freed",
            pid, kill.owner or "no pod", kill.device, format_bytes(kill.held_bytes),
            format_bytes(kill.requested_bytes), format_bytes(kill.free_bytes),
        )
        return {"ok": False, "error": "out of memory", "heldBytes": kill.held_bytes,
                "requestedBytes": kill.requested_bytes, "freeBytes": kill.free_bytes,
                "totalBytes": device.total_bytes}

    def close(self, pid: int, index: int) -> int:
        """The context ends (the process exited or closed it): its memory is freed. Returns the bytes freed."""
        with self._lock:
            return self.devices[index].exit(pid)

    def state(self) -> dict[str, Any]:
        """What NVML reads: ``driverVersion`` and per device ``index``, ``uuid``,
        ``name``, ``totalBytes``, ``reservedBytes``, ``overheadBytes`` and
        ``processes`` (``pid``: host PID, ``usedBytes``), in bytes."""
        with self._lock:
            return {
                "ok": True,
                "driverVersion": self.driver_version,
                "devices": [
                    {"index": i, "uuid": d.uuid, "name": self.names[i], "totalBytes": d.total_bytes,
                     "reservedBytes": d.reserved_bytes, "overheadBytes": d.overhead_bytes,
                     "processes": [{"pid": p.pid, "usedBytes": p.used_bytes} for p in d.processes.values()]}
                    for i, d in enumerate(self.devices)
                ],
            }


def _owner(pid: int) -> str | None:
    """The pod uid of ``pid`` (for the driver's log), None outside a pod or when unreadable."""
    try:
        found = attribute_pid(pid, Path("/proc"))
    except OSError:
        return None
    return getattr(found, "pod_uid", None)


def peer_pid(sock: socket.socket) -> int:
    """The PID of the process at the other end of a Unix socket, in this
    process's PID namespace (``SO_PEERCRED``: the host PID for a driver on the host)."""
    pid, _, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(pid)


class _Handler(socketserver.StreamRequestHandler):
    server: DriverServer

    def handle(self) -> None:
        pid = peer_pid(self.request)
        context: int | None = None
        try:
            while line := self.rfile.readline(MAX_REQUEST_BYTES):
                answer, context = self._answer(pid, context, line)
                self.wfile.write(json.dumps(answer).encode() + b"\n")
        except OSError:
            pass  # the peer went away mid-answer: as a closed connection
        finally:
            if context is not None:
                freed = self.server.driver.close(pid, context)
                log.info("pid %d closed its context on device %d: %s freed", pid, context, format_bytes(freed))

    def _answer(self, pid: int, context: int | None, line: bytes) -> tuple[dict[str, Any], int | None]:
        driver = self.server.driver
        try:
            request = json.loads(line)
            op = request.get("op") if isinstance(request, dict) else None
            if op == "query":
                return driver.state(), context
            if op == "open":
                if context is not None:
                    raise DriverError("this connection already has a context")
                answer = driver.open(pid, request.get("device"))
                log.info("pid %d (%s) opened a context on device %s", pid, _owner(pid) or "no pod",
                         request.get("device"))
                return answer, request["device"]
            if op == "resize":
                if context is None:
                    raise DriverError("resize before open")
                answer = driver.resize(pid, context, request.get("bytes"))
                return answer, (context if answer["ok"] else None)
            raise DriverError(f"op: want open, resize or query, got {op!r}")
        except (DriverError, ValueError) as err:  # json.JSONDecodeError is a ValueError
            return {"ok": False, "error": str(err)}, context


class DriverServer(socketserver.ThreadingUnixStreamServer):
    """The driver's socket server (one thread per connection)."""

    daemon_threads = True

    def __init__(self, path: Path, driver: SimDriver) -> None:
        self.driver = driver
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_socket():
            path.unlink()  # a stale socket of a driver that is gone
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o666)  # any container user may open the device, as /dev/nvidia* allows


def serve_in_thread(path: Path, driver: SimDriver) -> DriverServer:
    """Start a ``DriverServer`` at ``path`` in a daemon thread; ``shutdown()`` stops it."""
    server = DriverServer(path, driver)
    threading.Thread(target=server.serve_forever, name="simdriver", daemon=True).start()
    return server
