"""The dead-band and heartbeat decision."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from vramguard_agent.publish import PublishPolicy, decide, digest, significant_change
from vramguard_api.trend import TrendFeatures
from vramguard_api.usage import (
    AgentInfo,
    ContainerUsage,
    DeviceMemory,
    DeviceUsage,
    GPUDevice,
    NodeGPUUsageStatus,
    PodUsage,
    UnattributedProcess,
)

from .builders import GIB, MIB

POLICY = PublishPolicy()  # defaults: heartbeat 30 s, min interval 5 s, 64 MiB / 2 %


def report(vram=10 * GIB, ram=4 * GIB, used=12 * GIB, **pod_fields) -> NodeGPUUsageStatus:
    pod = PodUsage(
        uid="u1",
        namespace="ns",
        name="p",
        vramBytes=vram,
        ramWorkingSetBytes=ram,
        devices=[DeviceUsage(uuid="GPU-0", usedBytes=vram)],
        containers=[ContainerUsage(name="c", containerID="a" * 64, vramBytes=vram, ramWorkingSetBytes=ram)],
        **pod_fields,
    )
    memory = DeviceMemory(totalBytes=80 * GIB, usedBytes=used, usableBytes=80 * GIB)
    return NodeGPUUsageStatus(
        sampleTime=datetime(2025, 1, 1, tzinfo=UTC),
        agent=AgentInfo(version="t", backend="sim", sampleIntervalSeconds=10),
        devices=[GPUDevice(uuid="GPU-0", index=0, memory=memory)],
        pods=[pod],
    )


def test_first_report_is_written():
    assert decide(None, None, digest(report()), 0.0).write


def test_heartbeat_forces_a_write_of_an_unchanged_report():
    last = report()
    assert not decide(digest(last), 0.0, digest(report()), 29.9, POLICY).write
    decision = decide(digest(last), 0.0, digest(report()), 30.0, POLICY)
    assert decision.write and decision.reason == "heartbeat"


def test_changes_wait_for_the_minimum_interval():
    last = report()
    assert decide(digest(last), 0.0, digest(report(vram=20 * GIB)), 4.9, POLICY).reason == "minimum interval"
    assert decide(digest(last), 0.0, digest(report(vram=20 * GIB)), 5.0, POLICY).write


@pytest.mark.parametrize(
    ("before", "after", "write"),
    [
        (10 * GIB, 10 * GIB + 65 * MIB, False),  # beyond 64 MiB but inside 2 % (~209 MiB)
        (10 * GIB, 10 * GIB + 205 * MIB, False),
        (10 * GIB, 10 * GIB + 215 * MIB, True),
        (10 * GIB, 10 * GIB - 215 * MIB, True),
        (100 * MIB, 165 * MIB, True),  # small pods: the 64 MiB absolute band applies
        (100 * MIB, 160 * MIB, False),
    ],
)
def test_dead_band_on_vram(before, after, write):
    last = report(vram=before, used=20 * GIB)
    assert decide(digest(last), 0.0, digest(report(vram=after, used=20 * GIB)), 10.0, POLICY).write is write


def test_ram_and_device_used_moves_count_too():
    assert decide(digest(report()), 0.0, digest(report(ram=5 * GIB)), 10.0, POLICY).write
    assert decide(digest(report()), 0.0, digest(report(used=14 * GIB)), 10.0, POLICY).write


def test_shape_changes_are_written_whatever_their_size():
    base = report()
    unknown = report(vram=None)
    unknown.pods[0].devices[0].used_bytes = None
    assert significant_change(digest(base), digest(unknown), POLICY) == "shape changed"
    more = report()
    more.unattributed = [UnattributedProcess(pid=1, device="GPU-0", usedBytes=1, reason="not in a pod")]
    assert significant_change(digest(base), digest(more), POLICY) == "shape changed"
    oom = report(oomKills=1)
    assert significant_change(digest(base), digest(oom), POLICY) == "shape changed"
    lost = report()
    lost.devices[0].health = "Lost"
    assert significant_change(digest(base), digest(lost), POLICY) == "shape changed"


def test_trend_and_sample_time_alone_do_not_trigger_a_write():
    changed = report(trend=TrendFeatures(windowSeconds=600, samples=60, growthBytesPerHour=1e9))
    changed.sample_time = datetime(2025, 1, 2, tzinfo=UTC)
    assert not decide(digest(report()), 0.0, digest(changed), 20.0, POLICY).write


def test_steady_state_writes_once_per_heartbeat():
    """A node whose pods wobble inside the dead-band for an hour, sampled every 10 s."""
    last, last_t, writes = None, None, 0
    for step in range(360):
        t = step * 10.0
        current = digest(report(vram=10 * GIB + (step % 3) * 32 * MIB))
        decision = decide(last, last_t, current, t, POLICY)
        if decision.write:
            last, last_t, writes = current, t, writes + 1
    assert writes == 120  # one per 30 s heartbeat


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError, match="min_interval_s"):
        PublishPolicy(heartbeat_s=5, min_interval_s=10)
    with pytest.raises(ValueError, match="deadband_fraction"):
        PublishPolicy(deadband_fraction=1.5)


def test_a_moved_amount_is_named():
    change = significant_change(digest(report()), digest(report(ram=6 * GIB)), POLICY)
    assert change == f"pod/u1/ram moved from {4 * GIB} to {6 * GIB} bytes"
    change = significant_change(digest(report()), digest(report(used=20 * GIB)), POLICY)
    assert change == f"device/GPU-0/used moved from {12 * GIB} to {20 * GIB} bytes"


def test_a_moved_container_is_named_after_its_pod_and_id():
    before = report()
    after = report()
    after.pods[0].containers[0].ram_working_set_bytes = 8 * GIB
    change = significant_change(digest(before), digest(after), POLICY)
    assert change == f"pod/u1/{'a' * 64}/ram moved from {4 * GIB} to {8 * GIB} bytes"
