"""Attribution of a host process to its container and pod from ``/proc/<pid>/cgroup``.

The formats of ``/proc/<pid>/cgroup`` and of the kubelet's pod and container
cgroups, and the path parser itself, are :mod:`vramguard_api.cgroup_path`'s (shared
with the OOM classifier).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vramguard_api.cgroup_path import Attribution, parse_cgroup_path

__all__ = ["Attribution", "NotInPod", "attribute_pid", "parse_cgroup_path", "parse_proc_cgroup", "read_proc_cgroup"]


@dataclass(frozen=True, slots=True)
class NotInPod:
    """A process that belongs to no pod, and why."""

    reason: str

    def to_json(self) -> dict[str, object]:
        """The ``vramguard-agent attribute`` output."""
        return {"pod_uid": None, "reason": self.reason}


def parse_proc_cgroup(text: str) -> Attribution | NotInPod:
    """Attribute a process from the text of its ``/proc/<pid>/cgroup``.

    On cgroup v1 different hierarchies can point at different cgroups; the line
    that names a pod and a container wins, then one that names a pod. Malformed
    lines are skipped; when no line is usable the reason says so.
    """
    best: Attribution | None = None
    paths: list[str] = []
    malformed: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            malformed.append(line)
            continue
        paths.append(parts[2])
        found = parse_cgroup_path(parts[2])
        if found and (best is None or (best.container_id is None and found.container_id is not None)):
            best = found
    if best is not None:
        return best
    if not paths:
        shown = repr(malformed[0][:120]) if malformed else "empty file"
        return NotInPod(f"unreadable cgroup membership: no valid 'ID:controllers:path' line ({shown})")
    return NotInPod(f"not in a pod: cgroup {_representative(paths)} names no kubelet pod")


def _representative(paths: list[str]) -> str:
    """The most specific path (v1 lines for unused controllers are just '/')."""
    return max(paths, key=len)[:200]


def read_proc_cgroup(pid: int, proc_root: str | Path = "/proc") -> str:
    """The text of ``<proc_root>/<pid>/cgroup``.

    Raises ``FileNotFoundError`` when the process is gone (or not visible in this
    PID namespace) and ``OSError`` when the file cannot be read.
    """
    return (Path(proc_root) / str(pid) / "cgroup").read_text()


def attribute_pid(pid: int, proc_root: str | Path = "/proc") -> Attribution | NotInPod:
    """Attribute host process ``pid``; raises ``OSError`` when its cgroup file cannot be read."""
    return parse_proc_cgroup(read_proc_cgroup(pid, proc_root))
