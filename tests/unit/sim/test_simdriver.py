"""The simulated GPU driver of the real node (simdriver) and the pynvml stand-in
that reads it (drivernvml), through the agent's own NVMLBackend.

Clients are real processes connected to a real Unix socket, so the PIDs the
driver reports are what the kernel says (SO_PEERCRED), not what a test wrote.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from vramguard_agent.gpu import BackendUnavailable
from vramguard_agent.nvml import NVMLBackend
from vramguard_sim.drivernvml import DriverNVML
from vramguard_sim.scenario import SimGPU
from vramguard_sim.simdriver import SimDriver, serve_in_thread

GIB = 1 << 30
MIB = 1 << 20
# A client process: forwards each JSON line of its stdin to the driver, prints each answer.
CHILD = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile('rwb')\n"
    "for line in sys.stdin:\n"
    "    f.write(line.encode()); f.flush(); print(f.readline().decode().strip(), flush=True)\n"
)


class Child:
    """A workload process speaking the driver's protocol."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid

    def call(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def call(path: Path, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    """Requests on one connection from this process; the answers."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(path))
        stream = sock.makefile("rwb")
        answers = []
        for r in requests:
            stream.write((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n")
            stream.flush()
            answers.append(json.loads(stream.readline()))
        return answers


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[tuple[SimDriver, Path]]:
    gpus = [SimGPU.model_validate({"model": "NVIDIA A10", "count": 2, "memory": "4Gi", "reserved": "100Mi"})]
    d = SimDriver("real-node-1", gpus)
    path = tmp_path / "simgpu" / "driver.sock"
    server = serve_in_thread(path, d)
    yield d, path
    server.shutdown()
    server.server_close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for c in made:
        c.kill()


def processes(backend: NVMLBackend, index: int = 0) -> dict[int, int | None]:
    device = backend.sample().devices[index]
    assert device.processes is not None
    return {p.pid: p.used_bytes for p in device.processes}


def test_the_agent_reads_each_process_by_its_host_pid(driver, children):
    d, path = driver
    a, b = Child(path), Child(path)
    children += [a, b]
    assert a.call(op="open", device=0)["uuid"] == d.devices[0].uuid
    assert a.call(op="resize", bytes=GIB) == {"ok": True, "heldBytes": GIB, "freeBytes": 4 * GIB - 100 * MIB - GIB,
                                               "totalBytes": 4 * GIB}
    assert b.call(op="open", device=1)["ok"]
    assert b.call(op="resize", bytes=512 * MIB)["ok"]

    backend = NVMLBackend(DriverNVML(path))
    sample = backend.sample()
    assert [dev.uuid for dev in sample.devices] == [dev.uuid for dev in d.devices]
    assert sample.driver_version == "570.133.20"
    assert processes(backend, 0) == {a.pid: GIB}
    assert processes(backend, 1) == {b.pid: 512 * MIB}
    memory = sample.devices[0].memory
    assert memory is not None
    assert (memory.total, memory.reserved, memory.used) == (4 * GIB, 100 * MIB, GIB)

    a.call(op="resize", bytes=256 * MIB)  # frees the excess
    assert processes(backend, 0) == {a.pid: 256 * MIB}


def test_an_allocation_that_does_not_fit_is_out_of_memory_and_frees_the_process(driver, children):
    d, path = driver
    big, small = Child(path), Child(path)
    children += [big, small]
    big.call(op="open", device=0)
    assert big.call(op="resize", bytes=3 * GIB)["ok"]
    small.call(op="open", device=0)
    small.call(op="resize", bytes=256 * MIB)
    free = 4 * GIB - 100 * MIB - 3 * GIB - 256 * MIB

    answer = small.call(op="resize", bytes=GIB)
    assert answer == {"ok": False, "error": "out of memory", "heldBytes": 256 * MIB,
                      "requestedBytes": GIB - 256 * MIB, "freeBytes": free, "totalBytes": 4 * GIB}
    # Its context is gone with all it held; the neighbour keeps its memory.
    assert small.call(op="resize", bytes=1)["error"] == "resize before open"
    assert processes(NVMLBackend(DriverNVML(path))) == {big.pid: 3 * GIB}
    assert [k.pid for k in d.oom_kills] == [small.pid]


def test_memory_is_freed_when_the_process_dies(driver, children):
    _, path = driver
    a = Child(path)
    children.append(a)
    a.call(op="open", device=0)
    a.call(op="resize", bytes=2 * GIB)
    backend = NVMLBackend(DriverNVML(path))
    assert processes(backend) == {a.pid: 2 * GIB}
    a.kill()  # SIGKILL: no goodbye, the kernel closes the socket
    deadline = time.monotonic() + 10
    while processes(backend) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes(backend) == {}
    assert call(path, {"op": "query"})[0]["devices"][0]["processes"] == []


def test_each_nvml_call_reads_the_driver_again(driver, children):
    _, path = driver
    nvml = DriverNVML(path)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    a = Child(path)
    children.append(a)
    a.call(op="open", device=0)
    a.call(op="resize", bytes=MIB)
    # The same handle, a later call: the process that started in between is there.
    listed = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in listed] == [(a.pid, MIB, 0xFFFFFFFF)]
    assert nvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used == MIB
    # An r570 driver has no per-cgroup memory limits (r615+).
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetMemoryLimits_v1(handle, pynvml.c_nvmlGetMemoryLimits_v1_t())


def test_no_driver_is_driver_not_loaded(tmp_path):
    nvml = DriverNVML(tmp_path / "absent.sock")
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()
    with pytest.raises(BackendUnavailable, match="NVMLError_DriverNotLoaded"):
        NVMLBackend(DriverNVML(tmp_path / "absent.sock")).sample()


def test_a_driver_that_goes_away_fails_the_next_call(driver, tmp_path):
    d, path = driver
    nvml = DriverNVML(path)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    path.unlink()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.nvmlDeviceGetMemoryInfo(handle)


def test_bad_requests_are_refused_naming_the_field_and_the_connection_goes_on(driver):
    _, path = driver
    answers = call(
        path,
        b"not json",
        {"op": "launch"},
        {"op": "resize", "bytes": 1},
        {"op": "open", "device": 7},
        {"op": "open", "device": True},
        {"op": "open", "device": 0},
        {"op": "open", "device": 1},
        {"op": "resize", "bytes": -1},
        {"op": "resize", "bytes": "1Gi"},
        {"op": "resize", "bytes": MIB},
    )
    errors = [a.get("error", "") for a in answers]
    assert "Expecting value" in errors[0]
    assert errors[1] == "op: want open, resize or query, got 'launch'"
    assert errors[2] == "resize before open"
    assert errors[3] == errors[4].replace("True", "7") == "device: want an index in [0, 2), got 7"
    assert answers[5]["ok"] and errors[6] == "this connection already has a context"
    assert errors[7] == "bytes: want a whole number >= 0, got -1"
    assert errors[8] == "bytes: want a whole number >= 0, got '1Gi'"
    assert answers[9]["ok"] and answers[9]["heldBytes"] == MIB


def test_one_context_per_pid_and_device(driver):
    _, path = driver
    with socket.socket(socket.AF_UNIX) as first:
        first.connect(str(path))
        first.sendall(b'{"op": "open", "device": 0}\n')
        assert json.loads(first.makefile("rb").readline())["ok"]
        # The same process (this one) on a second connection: refused, as the driver keys by pid.
        assert call(path, {"op": "open", "device": 0})[0]["error"].endswith("already has a context on device 0")


def test_mig_is_refused_with_the_model_named():
    gpu = SimGPU.model_validate({"model": "NVIDIA A100-SXM4-40GB", "memory": "40Gi", "migCapable": True,
                                 "mig": [{"profile": "1g.5gb", "memory": "5Gi"}]})
    with pytest.raises(ValueError, match="NVIDIA A100-SXM4-40GB.*MIG is not simulated"):
        SimDriver("n", [gpu])


def test_the_agent_samples_the_driver_with_simgpu_socket(driver, children, capsys):
    from vramguard_agent.cli import main

    _, path = driver
    a = Child(path)
    children.append(a)
    a.call(op="open", device=1)
    a.call(op="resize", bytes=3 * MIB)
    assert main(["once", "--node", "real-node-1", "--backend", "simdriver", "--simgpu-socket", str(path)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["agent"]["driverVersion"] == "570.133.20"
    # This test's processes are in no pod: the agent says so, with the PID the driver saw.
    assert [(u["pid"], u["usedBytes"]) for u in status["unattributed"]] == [(a.pid, 3 * MIB)]


def test_the_driver_command_serves_until_sigterm_and_removes_its_socket(tmp_path):
    path = tmp_path / "d.sock"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "vramguard_sim", "simgpu-driver", "--socket", str(path),
                             "--gpus", "[{model: NVIDIA L4, count: 3, memory: 23034Mi}]"], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not path.is_socket() and time.monotonic() < deadline:
            time.sleep(0.05)
        devices = call(path, {"op": "query"})[0]["devices"]
        assert [(d["name"], d["totalBytes"]) for d in devices] == [("NVIDIA L4", 23034 * MIB)] * 3
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    assert not path.exists()


def test_the_driver_command_refuses_bad_devices_naming_the_field(tmp_path):
    out = subprocess.run([sys.executable, "-m", "vramguard_sim", "simgpu-driver", "--socket", str(tmp_path / "s"),
                          "--gpus", "[{model: X, memory: lots}]"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert out.returncode == 2
    assert "memory" in out.stderr and "lots" in out.stderr
