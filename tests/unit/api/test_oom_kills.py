"""A budget's ``status.oomKills`` (vramguard_api.budget.OOMKills): one counter per verdict."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vramguard_api.budget import GPUMemoryBudgetStatus, OOMKills

T0, T1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


@pytest.mark.parametrize(("kind", "blame", "field"), [
    ("GPUOutOfMemory", "Innocent", "innocent"),
    ("GPUOutOfMemory", "Own", "own"),
    ("GPUOutOfMemory", "Unknown", "unknown"),
    ("HostOutOfMemory", None, "host"),
    ("CapKill", "Own", "cap"),
    ("CapKill", "Innocent", "cap"),
])
def test_each_verdict_counts_in_its_own_field(kind, blame, field):
    counts = OOMKills().counted(kind, blame, T0)
    assert counts.to_api() == {**{f: 0 for f in ("innocent", "own", "unknown", "host", "cap")}, field: 1,
                               "lastKillTime": "2026-01-01T00:00:00Z"}


def test_counting_keeps_the_others_and_the_latest_time():
    counts = OOMKills(innocent=2, host=1, lastKillTime=T1).counted("GPUOutOfMemory", "Innocent", T0)
    assert (counts.innocent, counts.host, counts.last_kill_time) == (3, 1, T1)  # a late record moves no time back


@pytest.mark.parametrize(("kind", "blame"), [("NotMemory", None), ("GPUOutOfMemory", None)])
def test_what_is_no_counted_kill_is_refused_by_name(kind, blame):
    with pytest.raises(ValueError, match=f"kind='{kind}'"):
        OOMKills().counted(kind, blame, T0)


def test_the_status_reads_its_counters_from_the_api_form():
    status = GPUMemoryBudgetStatus.model_validate({"oomKills": {"innocent": 1, "lastKillTime": "2026-01-01T00:00:00Z"}})
    assert status.oom_kills is not None and status.oom_kills.innocent == 1 and status.oom_kills.own == 0
    with pytest.raises(ValueError, match="innocent"):
        GPUMemoryBudgetStatus.model_validate({"oomKills": {"innocent": -1}})
