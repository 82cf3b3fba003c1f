"""The dmem controller as a second VRAM source, on a fake cgroup v2 tree laid out as
Documentation/admin-guide/cgroup-v2.rst ("DMEM") documents it: ``dmem.capacity`` in the
root cgroup only, ``dmem.current``/``dmem.min``/``dmem.max`` in every other cgroup,
one ``<region> <bytes|max>`` line per region."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from vramguard_agent.dmem import DmemReader, nvidia_regions, parse_dmem, vram_source
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.metrics import AgentMetrics, Snapshot
from vramguard_api.usage import DmemRegion, NodeGPUUsageStatus, PodUsage

from .builders import GIB
from .test_memory import UID, pod_dir, v2_root, write_v2

GPU0, GPU1 = "nvidia/0000:3b:00.0/vidmem", "nvidia/0000:86:00.0/vidmem"
CAPACITY = f"{GPU0} 84934656000\ndrm/0000:03:00.0/vram0 8514437120\n{GPU1} 84934656000\n"


def test_dmem_files_parse_bytes_and_max():
    assert parse_dmem(f"{GPU0} 1073741824\n{GPU1} max\nbroken\n") == {GPU0: GIB, GPU1: None}


def test_only_nvidias_regions_are_kept_in_capacity_order():
    assert nvidia_regions(CAPACITY) == [GPU0, GPU1]


def region(current, maximum=None):
    return DmemRegion(region=GPU0, currentBytes=current, maxBytes=maximum)


def test_nvml_wins_when_it_attributes_a_process_else_dmem():
    assert vram_source(3 * GIB, True, [region(5 * GIB)]) == (3 * GIB, "NVML")
    # An MPS client: NVML lists the server, not the pod; the kernel charged the pod.
    assert vram_source(0, False, [region(5 * GIB)]) == (5 * GIB, "Dmem")
    assert vram_source(0, False, None) == (0, "NVML")
    assert vram_source(None, False, [region(None)]) == (None, None)  # unknown stays unknown


def fake_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = v2_root(tmp_path)
    (root / "dmem.capacity").write_text(CAPACITY)
    pod = pod_dir(root, UID)
    write_v2(pod, current=GIB, inactive=0)
    (pod / "dmem.current").write_text(f"{GPU0} 2147483648\n{GPU1} 0\ndrm/0000:03:00.0/vram0 4096\n")
    (pod / "dmem.min").write_text(f"{GPU0} 0\n{GPU1} 0\n")
    (pod / "dmem.max").write_text(f"{GPU0} 4294967296\n{GPU1} max\n")
    return root, pod


def test_a_pods_regions_are_read_from_its_cgroup(tmp_path):
    root, pod = fake_tree(tmp_path)
    memory = CgroupMemoryReader(root)
    memory.read({UID: set()})

    def directory(uid: str) -> Path | None:
        rel = memory.pod_cgroup_path(uid)
        return None if rel is None else root / rel.lstrip("/")

    regions = DmemReader(root).read([UID, "other"], directory)
    assert list(regions) == [UID]
    assert [(r.region, r.current_bytes, r.min_bytes, r.max_bytes) for r in regions[UID]] == [
        (GPU0, 2 * GIB, 0, 4 * GIB),
        (GPU1, 0, 0, None),
    ]


def test_no_controller_or_no_nvidia_region_reads_nothing(tmp_path):
    root, pod = fake_tree(tmp_path)
    (root / "dmem.capacity").write_text("drm/0000:03:00.0/vram0 8514437120\n")
    assert DmemReader(root).read([UID], lambda _: pod) == {}
    (root / "dmem.capacity").unlink()
    assert DmemReader(root).read([UID], lambda _: pod) == {}


def test_a_pod_whose_parent_did_not_enable_dmem_is_left_out(tmp_path):
    root, pod = fake_tree(tmp_path)
    (pod / "dmem.current").unlink()
    assert DmemReader(root).read([UID], lambda _: pod) == {}


def test_metrics_name_the_region():
    status = NodeGPUUsageStatus(
        sampleTime=datetime(2026, 1, 1, tzinfo=UTC),
        pods=[PodUsage(uid="u", namespace="ml", name="mps-client", dmem=[region(5 * GIB, 8 * GIB)])],
    )
    metrics = AgentMetrics("node-a")
    metrics.update(Snapshot("node-a", status))
    found = {
        (s.name, s.labels["region"]): s.value
        for f in text_string_to_metric_families(metrics.exposition().decode())
        for s in f.samples
        if s.name.startswith("vramguard_pod_dmem")
    }
    assert found == {
        ("vramguard_pod_dmem_current_bytes", GPU0): 5 * GIB,
        ("vramguard_pod_dmem_max_bytes", GPU0): 8 * GIB,
    }
