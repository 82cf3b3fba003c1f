"""``vramguard analyze FILE`` on a container log or kernel lines: which kind of
out-of-memory they show (``docs/oom.md``).

A container log (``kubectl logs --previous``, a termination message) is judged
by the frameworks' messages (``vramguard_api.oom.messages``); kernel lines
(``dmesg``, ``journalctl -k``) by the OOM killer's (``vramguard_api.oom.kernel``):
which process and cgroup, which pod and container, what it held in RAM. Both in
one file are both reported. Offline, there is no share to judge innocence by:
the blame is left to the live records (``vramguard oom``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from vramguard_api.oom import Evidence, KernelOOMKill, Verdict, classify, match_message, parse_kernel_lines
from vramguard_api.units import format_bytes


@dataclass(frozen=True, slots=True)
class LogFindings:
    """What a text log shows: the framework message's verdict (None: no memory
    message) and the kernel's OOM kills."""

    message: Verdict | None
    kernel: list[KernelOOMKill]

    @property
    def any(self) -> bool:
        """Whether the log shows an out-of-memory of any kind."""
        return bool(self.kernel) or (self.message is not None and self.message.kind != "NotMemory")


def shows_oom(text: str) -> bool:
    """Whether ``text`` carries a framework's memory message or a kernel OOM kill
    (``analyze`` then reads it as a log, not as a memory CSV)."""
    return match_message(text) is not None or bool(parse_kernel_lines(text.splitlines()))


def judge(text: str) -> LogFindings:
    """The findings of one log's text."""
    found = match_message(text)
    verdict = classify(Evidence(exit_code=1, message=text)) if found is not None else None
    return LogFindings(verdict, parse_kernel_lines(text.splitlines()))


def describe(name: str, f: LogFindings) -> str:
    """The human-readable findings."""
    lines = [f"{name}:"]
    v = f.message
    if v is not None and v.message is not None:
        row = v.message.pattern
        kind = {"GPUOutOfMemory": "GPU out of memory (VRAM)", "HostOutOfMemory": "host out of memory (RAM)"}.get(
            v.kind, "not a VRAM or RAM shortage")
        lines.append(f"  {kind}: {row.framework} said {v.message.text!r} (confidence {v.confidence})")
        if v.message.requested_bytes is not None:
            lines.append(f"  it asked for {format_bytes(v.message.requested_bytes)}")
        lines.append(f"  source of the pattern: {row.source}")
    for k in f.kernel:
        scope = {"Cgroup": "its memory cgroup's limit", "Node": "the node out of memory"}.get(k.scope or "", "unknown")
        lines.append(f"  kernel OOM kill: pid {k.pid} ({k.command}), {scope}: host RAM, not VRAM")
        if k.anon_rss_bytes is not None:
            lines.append(f"    held anon {format_bytes(k.anon_rss_bytes)}, file {format_bytes(k.file_rss_bytes)},"
                         f" shmem {format_bytes(k.shmem_rss_bytes)} of RAM")
        if k.task_memcg:
            lines.append(f"    cgroup {k.task_memcg}")
        if k.pod_uid:
            lines.append(f"    pod {k.pod_uid}" + (f", container {k.container_id}" if k.container_id else ""))
    if not f.any:
        lines.append("  no out-of-memory evidence")
    return "\n".join(lines)


def to_json(name: str, f: LogFindings) -> str:
    """One JSON object with the findings."""
    v = f.message
    message = None if v is None or v.message is None else {
        "kind": v.kind, "confidence": v.confidence, "framework": v.message.pattern.framework,
        "pattern": v.message.pattern.name, "text": v.message.text, "requested_bytes": v.message.requested_bytes,
    }
    kernel = [{"pid": k.pid, "command": k.command, "scope": k.scope, "anon_rss_bytes": k.anon_rss_bytes,
               "file_rss_bytes": k.file_rss_bytes, "shmem_rss_bytes": k.shmem_rss_bytes, "task_memcg": k.task_memcg,
               "pod_uid": k.pod_uid, "container_id": k.container_id} for k in f.kernel]
    return json.dumps({"file": name, "oom": f.any, "message": message, "kernel": kernel})
