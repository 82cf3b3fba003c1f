"""Swap and memory pressure: the node's from /proc, each pod's from its cgroup.

The fake trees follow the kernel's documented layouts: PSI files as in
Documentation/accounting/psi.rst ("some"/"full" lines, avg10/avg60/avg300 in
percent, total in microseconds), /proc/vmstat's "name value" lines (pswpin,
pswpout in pages), and cgroup v2's memory.swap.current and memory.pressure as in
Documentation/admin-guide/cgroup-v2.rst; v1's memory.memsw.usage_in_bytes counts
memory plus swap (Documentation/admin-guide/cgroup-v1/memory.rst).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vramguard_agent.hostmem import HostMemoryReader, parse_pressure, parse_vmstat_swap, swap_rate
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.metrics import AgentMetrics, Snapshot
from vramguard_api.usage import HostMemory, NodeGPUUsageStatus, PodUsage

from .test_memory import UID, pod_dir, v2_root, write_v1, write_v2

PSI = (
    "some avg10=12.50 avg60=3.25 avg300=0.75 total=4200000\n"
    "full avg10=1.00 avg60=0.20 avg300=0.05 total=350000\n"
)
VMSTAT = "nr_free_pages 12345\npgpgin 99\npswpin {pin}\npswpout {pout}\npgfault 7\n"


def test_psi_lines_are_parsed_as_percentages_and_microseconds():
    psi = parse_pressure(PSI)
    assert psi is not None and psi.some is not None and psi.full is not None
    assert (psi.some.avg10, psi.some.avg60, psi.some.avg300) == (12.5, 3.25, 0.75)
    assert psi.some.total_microseconds == 4_200_000 and psi.full.total_microseconds == 350_000


def test_a_psi_file_without_a_full_line_keeps_some_and_garbage_gives_none():
    psi = parse_pressure(PSI.splitlines()[0])
    assert psi is not None and psi.full is None and psi.some is not None
    assert parse_pressure("some avg10=x total=1\n") is None
    assert parse_pressure("") is None


def test_vmstat_swap_counters_need_both_lines():
    assert parse_vmstat_swap(VMSTAT.format(pin=10, pout=20)) == (10, 20)
    assert parse_vmstat_swap("pswpin 3\n") is None
    assert parse_vmstat_swap("xpswpin 3\npswpout 4\n") is None  # a line that only ends in the name


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (None, (10.0, 5), None),  # no previous reading
        ((0.0, 100), (10.0, 150), 50 * 4096 / 10),
        ((10.0, 100), (10.0, 150), None),  # no time passed
        ((0.0, 100), (10.0, 50), None),  # the counter went back
    ],
)
def test_swap_rate(before, after, expected):
    assert swap_rate(before, after, 4096) == expected


def write_proc(root: Path, pin: int, pout: int, psi: str | None = PSI) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "vmstat").write_text(VMSTAT.format(pin=pin, pout=pout))
    if psi is not None:
        (root / "pressure").mkdir(exist_ok=True)
        (root / "pressure" / "memory").write_text(psi)


def test_node_rates_come_from_the_second_reading(tmp_path):
    clock = iter([100.0, 110.0]).__next__
    reader = HostMemoryReader(tmp_path, clock=clock, page_size=4096)
    write_proc(tmp_path, pin=1_000, pout=2_000)
    first = reader.read()
    assert first.swap_in_bytes_per_second is None and first.swap_out_bytes_per_second is None
    assert first.pressure is not None and first.pressure.some is not None
    write_proc(tmp_path, pin=1_256, pout=2_000)
    second = reader.read()
    assert second.swap_in_bytes_per_second == 256 * 4096 / 10
    assert second.swap_out_bytes_per_second == 0


def test_a_node_without_psi_or_swap_reports_them_absent(tmp_path):
    (tmp_path / "vmstat").write_text("nr_free_pages 1\n")
    host = HostMemoryReader(tmp_path, clock=lambda: 1.0).read()
    assert host.pressure is None and host.swap_in_bytes_per_second is None


def test_v2_pod_swap_and_pressure_are_read_and_containers_are_not(tmp_path):
    root = v2_root(tmp_path)
    pod = pod_dir(root, UID)
    write_v2(pod, current=8_000, inactive=1_000)
    (pod / "memory.swap.current").write_text("65536\n")
    (pod / "memory.pressure").write_text(PSI)
    memory = CgroupMemoryReader(root, refresh_s=0).read({UID: set()})[UID].pod
    assert memory.swap_bytes == 65_536
    assert memory.pressure is not None and memory.pressure.full is not None
    assert memory.pressure.full.avg10 == 1.0


def test_v1_pod_swap_is_memsw_less_memory(tmp_path):
    pod = tmp_path / "memory" / "kubepods" / f"pod{UID}"
    write_v1(pod, usage=8_000, inactive=1_000, oom=0)
    (pod / "memory.memsw.usage_in_bytes").write_text("11000\n")
    memory = CgroupMemoryReader(tmp_path, refresh_s=0).read({UID: set()})[UID].pod
    assert memory.swap_bytes == 3_000
    assert memory.pressure is None  # v1 has no memory.pressure


def test_without_swap_accounting_swap_is_unknown_not_zero(tmp_path):
    pod = tmp_path / "memory" / "kubepods" / f"pod{UID}"
    write_v1(pod, usage=8_000, inactive=1_000, oom=0)  # no memsw files: swapaccount=0
    assert CgroupMemoryReader(tmp_path, refresh_s=0).read({UID: set()})[UID].pod.swap_bytes is None


def test_metrics_name_swap_and_pressure_as_node_exporter_and_cadvisor_do():
    psi = parse_pressure(PSI)
    status = NodeGPUUsageStatus(
        sampleTime=datetime(2026, 1, 1, tzinfo=UTC),
        pods=[
            PodUsage(uid="u1", namespace="ml", name="train", swapBytes=4096, memoryPressure=psi),
            PodUsage(uid="u2", namespace="ml", name="idle"),  # nothing known: no series
        ],
        hostMemory=HostMemory(swapInBytesPerSecond=2048.0, pressure=psi),
    )
    metrics = AgentMetrics("node-a")
    metrics.update(Snapshot("node-a", status))
    samples = {
        (s.name, s.labels.get("pod")): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
    }
    assert samples[("vramguard_pod_memory_swap_bytes", "train")] == 4096
    assert ("vramguard_pod_memory_swap_bytes", "idle") not in samples
    assert samples[("vramguard_node_swap_in_bytes_per_second", None)] == 2048
    assert ("vramguard_node_swap_out_bytes_per_second", None) not in samples  # unknown, not 0
    assert samples[("vramguard_node_pressure_memory_waiting_seconds_total", None)] == 4.2
    assert samples[("vramguard_pod_pressure_memory_stalled_seconds_total", "train")] == 0.35
