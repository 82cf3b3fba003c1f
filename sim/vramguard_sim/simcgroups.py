"""The simulated node's cgroups: the kubelet's and the runtime's paths, and the
per-cgroup memory limits the fake driver holds on them.

The fake NVML keeps the limits the agent sets (``nvmlDeviceSetMemoryLimits_v1``)
by cgroup nameSpace: ``/sys/fs/cgroup`` followed by the cgroup's path, as the
agent names them (``caps.NVML_CGROUP_ROOT``). ``cgroup_namespaces`` maps each
pod cgroup's nameSpace to the pod's owner on the simulated devices
(``simgpu.owner_of``) and each process to its container cgroup (the fake's
``pid_cgroups``, for ``currentUsed``); ``device_limits`` turns what the fake
holds into what the devices enforce (``vramguard_sim.gpumem``: an allocation
above the pod's hard limit fails in that pod only; under pressure the pod
furthest above its soft limit is evicted first). A real driver keeps its limits
when the agent restarts; the simulation does with ``DriverState``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramguard_agent.caps import NVML_CGROUP_ROOT
from vramguard_api.memlimits import NVML_DEVICE_MEMORY_LIMIT_MAX

from .scenario import SimCgroup, SimNode, SimProcess
from .simgpu import owner_of

RUNTIME_SCOPE_PREFIX = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}
V1_CONTROLLERS = ("12:memory", "11:cpu,cpuacct", "10:devices", "9:pids", "1:name=systemd")

# --- cgroup paths ----------------------------------------------------------


def pod_cgroup_path(cgroup: SimCgroup, qos: str, cgroup_uid: str) -> str:
    """The kubelet's cgroup path of a pod (systemd or cgroupfs driver)."""
    if cgroup.driver == "systemd":
        level = "" if qos == "guaranteed" else f"-{qos}"
        parent = "/kubepods.slice" + ("" if qos == "guaranteed" else f"/kubepods{level}.slice")
        return f"{parent}/kubepods{level}-pod{cgroup_uid.replace('-', '_')}.slice"
    return "/kubepods" + ("" if qos == "guaranteed" else f"/{qos}") + f"/pod{cgroup_uid}"


def container_cgroup_path(cgroup: SimCgroup, pod_path: str, container_id: str) -> str:
    """The runtime's cgroup path of a container under its pod."""
    if cgroup.driver == "systemd":
        return f"{pod_path}/{RUNTIME_SCOPE_PREFIX[cgroup.runtime]}-{container_id}.scope"
    return f"{pod_path}/{container_id}"


def proc_cgroup_text(cgroup: SimCgroup, path: str) -> str:
    """``/proc/<pid>/cgroup`` of a process in ``path`` (v2: one line; v1: one per hierarchy)."""
    if cgroup.version == 2:
        return f"0::{path}\n"
    return "".join(f"{controllers}:{path}\n" for controllers in V1_CONTROLLERS)


# --- memory limits -------------------------------------------------------------------


def cgroup_namespaces(
    node: SimNode, identities: Mapping[tuple[str, str], Any], pids: Mapping[int, SimProcess]
) -> tuple[dict[str, str], dict[int, str]]:
    """The nameSpace of each pod cgroup -> the pod's owner on the devices, and
    each process's container cgroup nameSpace by pid (``identities``:
    ``simbackend.PodIdentity`` by (namespace, name))."""
    cgroup = node.cgroup
    pods: dict[str, str] = {}
    by_pid: dict[int, str] = {}
    pid_of = {id(p): pid for pid, p in pids.items()}
    for pod in node.pods:
        identity = identities[(pod.namespace, pod.name)]
        pod_path = pod_cgroup_path(cgroup, pod.qos, identity.cgroup_uid)
        pods[NVML_CGROUP_ROOT + pod_path] = owner_of(pod)
        for c in pod.containers:
            path = container_cgroup_path(cgroup, pod_path, identity.containers[c.name])
            for p in c.processes:
                by_pid[pid_of[id(p)]] = NVML_CGROUP_ROOT + path
    return pods, by_pid


def device_limits(
    held: Mapping[str, Mapping[str, tuple[int, int]]], owners: Mapping[str, str]
) -> dict[str, dict[str, tuple[int, int | None]]]:
    """What the fake driver ``held`` (uuid -> nameSpace -> (soft, hard), NVML's
    MAX for no hard limit) as the devices enforce it: uuid -> owner -> (soft,
    hard or None). Limits on cgroups that are no pod's are left out."""
    return {
        uuid: {
            owners[ns]: (soft, None if hard == NVML_DEVICE_MEMORY_LIMIT_MAX else hard)
            for ns, (soft, hard) in by_ns.items()
            if ns in owners
        }
        for uuid, by_ns in held.items()
    }


class DriverState:
    """The fake driver's memory limits in a JSON file (``SimBackend``'s
    ``driver_state``): ``{uuid: {nameSpace: [soft, hard]}}``, written whole
    through a temporary file, and only when they changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved: str | None = None

    def load(self) -> dict[str, dict[str, tuple[int, int]]]:
        """The limits saved last (none when the file is absent). Raises
        ``ValueError`` naming the file when it is not such JSON."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            raw = json.loads(text)
            out = {str(u): {str(ns): (int(v[0]), int(v[1])) for ns, v in held.items()} for u, held in raw.items()}
        except (ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
            raise ValueError(f"sim driver state {self.path}: not limits JSON ({err})") from None
        self._saved = text
        return out

    def save(self, limits: Mapping[str, Mapping[str, tuple[int, int]]]) -> None:
        """Write ``limits`` when they differ from what was saved."""
        text = json.dumps({u: {ns: list(v) for ns, v in held.items()} for u, held in limits.items()}, sort_keys=True)
        if text == self._saved:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(self.path)
        self._saved = text
