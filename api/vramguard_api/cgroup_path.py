"""The kubelet's cgroup paths: which pod and container a cgroup belongs to.

Shared by the agent (``/proc/<pid>/cgroup``) and the OOM classifier (the
kernel OOM killer's ``oom_memcg``/``task_memcg``).

``/proc/<pid>/cgroup`` has one ``hierarchy-ID:controllers:path`` line per cgroup
v1 hierarchy, the single line ``0::path`` on cgroup v2, and both on hybrid
hosts. The kubelet names a pod's cgroup

- ``pod<uid>`` under ``kubepods/[burstable|besteffort]/`` (cgroupfs driver), or
- ``kubepods[-<qos>]-pod<uid with underscores>.slice`` (systemd driver),

where Guaranteed pods have no QoS level and static pods carry their 32-hex
config hash instead of the API uid. Under kind the kubelet's slices are
prefixed ``kubelet-`` and nested under the node container. The container's
cgroup below it is a bare 64-hex id (cgroupfs), ``cri-containerd-<id>.scope``,
``crio-<id>[.scope]`` or ``docker-<id>.scope`` (systemd), or appended as
``...pod<uid>.slice:cri-containerd:<id>`` (runc's systemd cgroupsPath form).
Paths are relative to the reader's cgroup namespace and may start with ``/..``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UUID_SYSTEMD = r"[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}"
_HASH = r"[0-9a-f]{32}"  # a static pod's config hash
_ID = r"[0-9a-f]{64}"

# systemd driver: "[prefix-]kubepods[-qos]-pod<uid>.slice[:runtime:id]"
_SYSTEMD_POD = re.compile(
    rf"^(?:[\w.@]+-)?kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>{_UUID_SYSTEMD}|{_HASH})\.slice"
    r"(?::(?P<colon>.*))?$"
)
# cgroupfs driver: "pod<uid>" under kubepods or a QoS level
_CGROUPFS_POD = re.compile(rf"^pod(?P<uid>{_UUID}|{_HASH})$")
_CGROUPFS_PARENT = re.compile(r"^(?:.*kubepods|burstable|besteffort|\.\.)$")

# Container segments, most specific first: (regex, runtime).
_CONTAINERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"^cri-containerd-(?P<id>{_ID})\.scope$"), "containerd"),
    (re.compile(rf"^crio-(?P<id>{_ID})(?:\.scope)?$"), "cri-o"),
    (re.compile(rf"^docker-(?P<id>{_ID})\.scope$"), "docker"),
    (re.compile(rf"^(?P<id>{_ID})$"), "unknown"),
)
# runc's systemd cgroupsPath "<slice>:<prefix>:<name>", after the slice.
_COLON_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}
_COLON = re.compile(rf"^(?P<prefix>[\w-]+):(?P<id>{_ID})$")
# cri-o's per-pod conmon (runtime monitor) is in the pod but in no container.
_CONMON = re.compile(rf"^crio-conmon-{_ID}\.scope$")


@dataclass(frozen=True, slots=True)
class Attribution:
    """A process's pod and container.

    ``pod_uid`` is the API uid with dashes, or a static pod's 32-hex config hash
    (``static_pod``). ``container_id`` is the runtime's 64-hex id, None for a
    process in the pod's cgroup but in no container. ``runtime`` is
    ``containerd``, ``cri-o``, ``docker`` or ``unknown``; ``qos`` is
    ``guaranteed``, ``burstable``, ``besteffort``, or None when a
    namespace-relative cgroupfs path hides it.
    """

    pod_uid: str
    container_id: str | None
    runtime: str
    qos: str | None
    static_pod: bool
    cgroup_path: str

    def to_json(self) -> dict[str, object]:
        """The ``vramguard-agent attribute`` output."""
        return {
            "pod_uid": self.pod_uid,
            "container_id": self.container_id,
            "runtime": self.runtime,
            "qos": self.qos,
        }


def parse_cgroup_path(path: str) -> Attribution | None:
    """Attribute one cgroup path (the third field of a ``/proc/<pid>/cgroup`` line).

    Returns None when the path names no kubelet pod.
    """
    segments = path.split("/")
    for i, segment in enumerate(segments):
        systemd = _SYSTEMD_POD.match(segment)
        if systemd:
            below = systemd.group("colon")
            container = _colon_container(below) if below is not None else _container(segments[i + 1 : i + 2])
            # A systemd pod slice names its QoS level; no level means Guaranteed.
            qos = systemd.group("qos") or "guaranteed"
            return _attribution(systemd.group("uid").replace("_", "-"), qos, container, path)
        cgroupfs = _CGROUPFS_POD.match(segment)
        if cgroupfs and i > 0 and _CGROUPFS_PARENT.match(segments[i - 1]):
            parent = segments[i - 1]
            # Directly under kubepods means Guaranteed; under "/.." the level is out of sight.
            qos = parent if parent in ("burstable", "besteffort") else None if parent == ".." else "guaranteed"
            return _attribution(cgroupfs.group("uid"), qos, _container(segments[i + 1 : i + 2]), path)
    return None


def _attribution(uid: str, qos: str | None, container: tuple[str | None, str], path: str) -> Attribution:
    container_id, runtime = container
    # API uids have dashes; a static pod's config hash has none.
    return Attribution(uid, container_id, runtime, qos, static_pod="-" not in uid, cgroup_path=path)


def _container(segments: list[str]) -> tuple[str | None, str]:
    if not segments or not segments[0]:
        return None, "unknown"
    segment = segments[0]
    for pattern, runtime in _CONTAINERS:
        match = pattern.match(segment)
        if match:
            return match.group("id"), runtime
    if _CONMON.match(segment):
        return None, "cri-o"
    return None, "unknown"


def _colon_container(text: str) -> tuple[str | None, str]:
    match = _COLON.match(text)
    if not match:
        return None, "unknown"
    return match.group("id"), _COLON_RUNTIMES.get(match.group("prefix"), "unknown")
