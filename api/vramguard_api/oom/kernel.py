"""The kernel OOM killer's lines (``dmesg``, ``journalctl -k``): who was killed, where, holding what.

Formats, from torvalds/linux ``mm/oom_kill.c``:

- ``dump_oom_summary``: ``oom-kill:constraint=%s,nodemask=%*pbl,cpuset=...,
  mems_allowed=...,oom_memcg=<path>,task_memcg=<path>,task=%s,pid=%d,uid=%d``
  (``global_oom`` in place of ``oom_memcg`` for a system-wide OOM; since 4.19);
- ``__oom_kill_process``: ``"%s: Killed process %d (%s) total-vm:%lukB,
  anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB, UID:%u pgtables:%lukB
  oom_score_adj:%hd"`` where ``%s`` is ``Memory cgroup out of memory`` (a
  cgroup's limit: constraint ``CONSTRAINT_MEMCG``) or ``Out of memory`` (the
  node); older kernels print ``Killed process %d (%s) total-vm:...`` alone.

``parse_kernel_lines(lines)`` -> one ``KernelOOMKill`` per killed process (the
summary and the kill line joined by pid), in the order of the log. Lines of any
other kind (timestamps, syslog prefixes, the task table) are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from vramguard_api.cgroup_path import parse_cgroup_path

Scope = Literal["Cgroup", "Node"]

_SUMMARY = re.compile(r"oom-kill:constraint=(?P<constraint>\w+),(?P<fields>.*)$")
_KILLED = re.compile(
    r"(?:(?P<why>Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?): )?"
    r"Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)(?P<rest>.*)$"
)
_RSS = re.compile(r"(?P<key>total-vm|anon-rss|file-rss|shmem-rss):(?P<kb>\d+)kB")
_FIELD = re.compile(r"(?:^|,)(?P<key>oom_memcg|task_memcg|task|pid|uid)=(?P<value>[^,]*)")


@dataclass(frozen=True, slots=True)
class KernelOOMKill:
    """One process the kernel killed: ``pid``, ``command``; ``scope`` ``Cgroup``
    (its memory cgroup's limit) or ``Node`` (the whole node was out of memory);
    ``anon_rss_bytes`` etc. (bytes, what it held in RAM when killed; None where
    the line was not seen); the memory cgroup at its limit (``oom_memcg``) and
    the task's own (``task_memcg``), with the pod uid and container id the
    kubelet's cgroup naming gives (None outside a pod)."""

    pid: int
    command: str
    scope: Scope | None = None
    total_vm_bytes: int | None = None
    anon_rss_bytes: int | None = None
    file_rss_bytes: int | None = None
    shmem_rss_bytes: int | None = None
    oom_memcg: str | None = None
    task_memcg: str | None = None
    pod_uid: str | None = None
    container_id: str | None = None


def parse_kernel_lines(lines: Iterable[str]) -> list[KernelOOMKill]:
    """Every OOM kill in ``lines`` (any prefix before the kernel's text is ignored)."""
    kills: dict[int, KernelOOMKill] = {}
    for line in lines:
        summary = _SUMMARY.search(line)
        if summary:
            found = _from_summary(summary)
            if found is not None:
                kills[found.pid] = _merge(kills.get(found.pid), found)
            continue
        killed = _KILLED.search(line)
        if killed:
            found = _from_killed(killed)
            kills[found.pid] = _merge(kills.get(found.pid), found)
    return list(kills.values())


def _from_summary(m: re.Match[str]) -> KernelOOMKill | None:
    fields = {f.group("key"): f.group("value") for f in _FIELD.finditer("," + m.group("fields"))}
    if not fields.get("pid", "").isdigit():
        return None
    task_memcg = fields.get("task_memcg")
    where = parse_cgroup_path(task_memcg) if task_memcg else None
    scope: Scope = "Cgroup" if m.group("constraint") == "CONSTRAINT_MEMCG" else "Node"
    return KernelOOMKill(
        pid=int(fields["pid"]), command=fields.get("task", ""), scope=scope,
        oom_memcg=fields.get("oom_memcg"), task_memcg=task_memcg,
        pod_uid=where.pod_uid if where else None, container_id=where.container_id if where else None,
    )


def _from_killed(m: re.Match[str]) -> KernelOOMKill:
    sizes = {r.group("key"): int(r.group("kb")) * 1024 for r in _RSS.finditer(m.group("rest"))}
    why = m.group("why")
    scope: Scope | None = None if why is None else "Cgroup" if why.startswith("Memory cgroup") else "Node"
    return KernelOOMKill(
        pid=int(m.group("pid")), command=m.group("comm"), scope=scope,
        total_vm_bytes=sizes.get("total-vm"), anon_rss_bytes=sizes.get("anon-rss"),
        file_rss_bytes=sizes.get("file-rss"), shmem_rss_bytes=sizes.get("shmem-rss"),
    )


def _merge(old: KernelOOMKill | None, new: KernelOOMKill) -> KernelOOMKill:
    """``new``'s known fields over ``old``'s (the summary line precedes the kill line)."""
    if old is None:
        return new
    changes = {k: getattr(new, k) for k in KernelOOMKill.__dataclass_fields__ if getattr(new, k) not in (None, "")}
    return replace(old, **changes)
