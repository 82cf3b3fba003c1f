"""The real node for end-to-end tests (hack/cluster/realnode.sh, docs/real-node.md):
its handle, host-side readers that do not go through vramguard's code
(containerd's task list, the kernel's cgroup files, the simulated GPU driver's
own state) and a pod builder."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack" / "cluster"))
import localkube  # noqa: E402  (hack/cluster/localkube.py: the cluster's settings, kubectl and waits)

TAINT = "vramguard.io/real-node"


def settings() -> dict[str, str]:
    """The real node's names and paths, from hack/cluster/versions.sh (as the scripts see them)."""
    return localkube.settings("REAL_NODE_NAME", "REAL_NODE_STATE", "CONTAINERD_BIN", "CONTAINERD_VERSION",
                              "WORKLOAD_IMAGE", "K8S_VERSION", "SIMGPU_DIR", "SIMGPU_SOCKET")


@dataclass(frozen=True)
class RealNode:
    """The real node of the test cluster: its Node name, its containerd, its workload
    image and its simulated GPU driver (``simgpu_dir`` holds the socket ``simgpu_socket``)."""

    name: str
    state: Path
    ctr: str
    image: str
    kubelet_version: str
    containerd_version: str
    simgpu_dir: Path
    simgpu_socket: Path

    def host_pid(self, container_id: str) -> int | None:
        """The host PID of a container's init process, from containerd's task list
        (``ctr tasks ls``: TASK PID STATUS); None when containerd has no such task."""
        out = subprocess.run(
            [self.ctr, "--address", str(self.state / "run/containerd.sock"), "-n", "k8s.io", "tasks", "ls"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout
        for line in out.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[0] == container_id and fields[2] == "RUNNING":
                return int(fields[1])
        return None


def driver_state(node: RealNode) -> dict[str, Any]:
    """The simulated GPU driver's state, over its socket in its own protocol (as nvidia-smi reads a
    real driver; not through vramguard's NVML code): ``devices`` with ``processes`` (host ``pid``, ``usedBytes``)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(node.simgpu_socket))
        sock.sendall(b'{"op": "query"}\n')
        state: dict[str, Any] = json.loads(sock.makefile("rb").readline())
    return state


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of each cgroup mount, from /proc/mounts."""
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        _, target, kind, options, *_ = line.split()
        if kind in ("cgroup", "cgroup2"):
            found.append((target, kind, set(options.split(","))))
    return found


def cgroup_dir(pid: int, controller: str) -> Path:
    """The directory of ``pid``'s cgroup for ``controller`` (``cpu``, ``cpuacct``,
    ``memory``): in the v1 hierarchy that has it, else in the v2 one. Read from
    the kernel (/proc/<pid>/cgroup and /proc/mounts), not through vramguard's
    parser. Raises LookupError when neither is mounted."""
    paths = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        paths["" if hierarchy == "0" else controllers] = path
    for target, kind, options in _mounts():
        key = next((k for k in paths if controller in k.split(",")), None)
        if kind == "cgroup" and controller in options and key is not None:
            return Path(target) / paths[key].lstrip("/")
    for target, kind, _ in _mounts():
        if kind == "cgroup2" and "" in paths:
            return Path(target) / paths[""].lstrip("/")
    raise LookupError(f"no mounted cgroup hierarchy has the {controller} controller for pid {pid}")


def cpu_quota_us(pid: int) -> int | None:
    """The CFS quota of ``pid``'s cgroup in microseconds per period (None: unlimited).
    cgroup v1 ``cpu.cfs_quota_us`` (-1 unlimited) or v2 ``cpu.max`` ("max 100000")."""
    directory = cgroup_dir(pid, "cpu")
    v1 = directory / "cpu.cfs_quota_us"
    if v1.exists():
        quota = int(v1.read_text())
        return None if quota < 0 else quota
    first = (directory / "cpu.max").read_text().split()[0]
    return None if first == "max" else int(first)


def cpu_usage_s(pid: int) -> float:
    """CPU time used by ``pid``'s cgroup, in seconds: v1 ``cpuacct.usage`` (ns) or v2 ``cpu.stat`` usage_usec."""
    directory = cgroup_dir(pid, "cpuacct")
    v1 = directory / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text()) / 1e9
    stat = dict(line.split() for line in (directory / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def pod(node: RealNode, name: str, script: str | list[str], *, cpu: tuple[str, str] = ("50m", "200m"),
        memory: tuple[str, str] = ("16Mi", "64Mi"), host_dir: Path | None = None, grace_s: int = 30,
        gpu: bool = False, restart_policy: str = "Always", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod for the real node: one container ``main`` running ``script`` (a
    string: with ``/bin/sh -c``; a list: the command itself) from the local
    busybox image (never pulled), CPU and memory request and limit (Burstable
    unless they are equal), ``host_dir`` (a host directory) mounted at /host
    when given, and with ``gpu`` the simulated driver's directory at
    /run/simgpu (as a GPU pod gets /dev/nvidia*); ``labels`` on the pod."""
    container: dict[str, Any] = {
        "name": "main",
        "image": node.image,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", script] if isinstance(script, str) else script,
        "resources": {"requests": {"cpu": cpu[0], "memory": memory[0]},
                      "limits": {"cpu": cpu[1], "memory": memory[1]}},
    }
    spec: dict[str, Any] = {
        "nodeSelector": {TAINT: "true"},
        "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace_s,
        "restartPolicy": restart_policy,
        "containers": [container],
    }
    mounts = {"host": ("/host", host_dir), "simgpu": ("/run/simgpu", node.simgpu_dir if gpu else None)}
    for volume, (mount_path, host_path) in mounts.items():
        if host_path is not None:
            container.setdefault("volumeMounts", []).append({"name": volume, "mountPath": mount_path})
            spec.setdefault("volumes", []).append(
                {"name": volume, "hostPath": {"path": str(host_path), "type": "Directory"}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec}
