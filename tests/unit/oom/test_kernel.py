"""Kernel OOM-killer lines from public issues (fixtures/kernel.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.oom.cases import kernel_cases
from vramguard_api.oom import parse_kernel_lines

FIELDS = ("pid", "command", "scope", "anon_rss_bytes", "pod_uid", "container_id")


@pytest.mark.parametrize("case", kernel_cases(), ids=lambda c: c["id"])
def test_kernel_lines(case: dict[str, Any]) -> None:
    kills = parse_kernel_lines(case["lines"])
    assert [{f: getattr(k, f) for f in FIELDS} for k in kills] == case["expect"]


def test_the_summary_and_the_kill_line_join_on_the_pid() -> None:
    # Constructed from the two formats above (gpud#70's summary, node-problem-detector#766's kill line).
    uid = "eded8c65_6e8e_4c6e_a889_3e427565c740"
    cid = "ec9ee26695deb4cc72bc665efff1cf3a03fdfb12f1303e02fe9252985e084a95"
    lines = [
        f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0,oom_memcg=/kubepods.slice/"
        f"kubepods-pod{uid}.slice,task_memcg=/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{cid}.scope,"
        "task=python,pid=42,uid=0",
        "Memory cgroup out of memory: Killed process 42 (python) total-vm:100kB, anon-rss:2048kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:0 pgtables:4kB oom_score_adj:0",
        "Memory cgroup out of memory: Killed process 43 (worker) total-vm:100kB, anon-rss:1kB, file-rss:0kB",
    ]
    first, second = parse_kernel_lines(lines)
    assert (first.pid, first.anon_rss_bytes, first.pod_uid, first.container_id) == (
        42, 2 << 20, uid.replace("_", "-"), cid)
    assert first.oom_memcg is not None and first.oom_memcg.endswith(f"kubepods-pod{uid}.slice")
    assert (second.pid, second.pod_uid) == (43, None)


def test_other_lines_are_ignored() -> None:
    assert parse_kernel_lines(["oom_reaper: reaped process 1 (x), now anon-rss:0kB", "hello", ""]) == []
    assert parse_kernel_lines(["oom-kill:constraint=CONSTRAINT_MEMCG,task=x,pid=notanumber"]) == []
