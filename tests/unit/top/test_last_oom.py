"""``vramguard top`` shows each pod's last OOM from the reports' end records."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from vramguard_operator.cli.top.model import Snapshot
from vramguard_operator.cli.top.render import render

from .test_rows import NOW, pod, report, rows_of, stamp, usage


def end(id_: int, name: str, age_s: float, oom_after: int) -> dict[str, Any]:
    return {"id": id_, "time": stamp(NOW - timedelta(seconds=age_s)), "kind": "CgroupOOMKill",
            "podUID": f"uid-{name}", "namespace": "ml", "name": name, "oomKillsBefore": 0, "oomKillsAfter": oom_after}


def test_the_latest_memory_kill_of_each_pod_with_its_age():
    r = report([usage("a", 1 << 30), usage("b", 1 << 30)])
    # a: two OOM kills, the later one shown; b: an end that is no memory kill.
    r["status"]["ends"] = [end(1, "a", 600, 1), end(2, "a", 120, 2), end(3, "b", 60, 0)]
    snap = Snapshot(pods=[pod("a"), pod("b")], reports=[r], now=NOW)
    rows = rows_of(snap)
    assert rows["a"].last_oom == "HostOutOfMemory 2m ago"
    assert rows["b"].last_oom is None
    text = render(list(rows.values()), wide=True)
    assert "LAST OOM" in text.splitlines()[0] and "HostOutOfMemory 2m ago" in text
