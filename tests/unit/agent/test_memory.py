"""RAM working set and OOM kills from cgroup v1 and v2 trees."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from vramguard_agent.memory import (
    RESCAN_MIN_INTERVAL_S,
    CgroupMemoryReader,
    detect_version,
    working_set,
)

UID = "7fda01c4-0ece-403d-88b4-c371d66d132a"
CID = "e58a24d4a722c99712cff74ef69d93311089584eb32617b3890e0dcb996133f1"
CID2 = "5ec84d8dbc74254770f58904dba41ecccc3fc1626e53a13043b026c48bbf33fe"
SYSTEMD_POD = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice"


def write_v2(directory: Path, current: int, inactive: int, oom: int | None = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "memory.current").write_text(f"{current}\n")
    (directory / "memory.stat").write_text(f"anon 1\nfile {inactive}\nactive_file 0\ninactive_file {inactive}\n")
    if oom is not None:
        (directory / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 2\noom_kill {oom}\n")


def write_v1(directory: Path, usage: int, inactive: int, oom: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (directory / "memory.stat").write_text(f"cache {inactive}\ninactive_file 5\ntotal_inactive_file {inactive}\n")
    (directory / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom}\n")


def v2_root(tmp_path: Path) -> Path:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    return tmp_path


def test_working_set_is_usage_minus_inactive_file_floored_at_zero():
    assert working_set(1000, 300) == 700
    assert working_set(100, 300) == 0
    assert working_set(100, None) == 100


def test_v1_uses_total_inactive_file_and_odd_stat_lines_are_ignored(tmp_path):
    pod_dir = tmp_path / "memory" / "kubepods" / f"pod{UID}"
    write_v1(pod_dir, usage=8_000, inactive=2_000, oom=0)
    stat = pod_dir / "memory.stat"
    stat.write_text("garbage\n" + stat.read_text() + "inactive_file_extra 9\n")
    pod = CgroupMemoryReader(tmp_path).read({UID: set()})[UID]
    assert pod.pod.working_set_bytes == 6_000  # total_inactive_file, not the local inactive_file (5)
    assert pod.pod.oom_kills == 0


def test_detect_version(tmp_path):
    assert detect_version(tmp_path) is None
    (tmp_path / "cgroup.controllers").write_text("")
    assert detect_version(tmp_path) == 2
    (tmp_path / "memory").mkdir()  # hybrid: a v1 memory hierarchy next to the unified one
    assert detect_version(tmp_path) == 1


def test_v2_pod_and_containers(tmp_path):
    root = v2_root(tmp_path)
    write_v2(root / SYSTEMD_POD, current=10_000, inactive=1_000, oom=2)
    write_v2(root / SYSTEMD_POD / f"cri-containerd-{CID}.scope", current=6_000, inactive=500, oom=2)
    write_v2(root / SYSTEMD_POD / f"cri-containerd-{CID2}.scope", current=3_000, inactive=0, oom=0)
    (root / "system.slice" / "containerd.service").mkdir(parents=True)
    result = CgroupMemoryReader(root).read({UID: {CID}})
    pod = result[UID]
    assert (pod.pod.working_set_bytes, pod.pod.oom_kills) == (9_000, 2)  # v2 events are hierarchical
    assert pod.containers[CID].working_set_bytes == 5_500
    assert pod.containers[CID2].working_set_bytes == 3_000


def test_v2_kind_nesting_is_found(tmp_path):
    root = v2_root(tmp_path)
    node = "system.slice/docker-" + "f" * 64 + ".scope/kubelet.slice/kubelet-kubepods.slice"
    pod_dir = (
        root
        / node
        / "kubelet-kubepods-besteffort.slice"
        / f"kubelet-kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
    )
    write_v2(pod_dir, 4_000, 1_000)
    write_v2(pod_dir / f"cri-containerd-{CID}.scope", 4_000, 1_000)
    pod = CgroupMemoryReader(root).read({UID: {CID}})[UID]
    assert pod.pod.working_set_bytes == 3_000 and pod.containers[CID].working_set_bytes == 3_000


def test_v1_cgroupfs_pod_oom_is_its_own_plus_its_containers(tmp_path):
    pod_dir = tmp_path / "memory" / "kubepods" / "burstable" / f"pod{UID}"
    write_v1(pod_dir, usage=8_000, inactive=2_000, oom=1)
    write_v1(pod_dir / CID, usage=5_000, inactive=1_000, oom=3)
    (tmp_path / "unified").mkdir()
    reader = CgroupMemoryReader(tmp_path)
    pod = reader.read({UID: {CID}})[UID]
    assert reader.version == 1
    assert pod.pod.working_set_bytes == 6_000 and pod.pod.oom_kills == 4
    assert pod.containers[CID].working_set_bytes == 4_000 and pod.containers[CID].oom_kills == 3


def test_unreadable_files_give_none_not_zero(tmp_path):
    root = v2_root(tmp_path)
    pod_dir = root / SYSTEMD_POD
    write_v2(pod_dir, 1_000, 0, oom=None)
    (pod_dir / "memory.stat").unlink()
    pod = CgroupMemoryReader(root).read({UID: set()})[UID]
    assert pod.pod.working_set_bytes is None and pod.pod.oom_kills is None


def test_unknown_pods_are_left_out(tmp_path):
    assert CgroupMemoryReader(v2_root(tmp_path)).read({UID: set()}) == {}
    assert CgroupMemoryReader(tmp_path / "absent").read({UID: set()}) == {}


def test_v2_container_oom_counts_are_reread_only_when_the_pods_count_moves(tmp_path):
    root = v2_root(tmp_path)
    container = root / SYSTEMD_POD / f"cri-containerd-{CID}.scope"
    write_v2(root / SYSTEMD_POD, 1_000, 0, oom=1)
    write_v2(container, 1_000, 0, oom=1)
    reader = CgroupMemoryReader(root, refresh_s=0)
    assert reader.read({UID: {CID}})[UID].containers[CID].oom_kills == 1
    (container / "memory.events").write_text("oom_kill 7\n")  # not how the kernel behaves: proves no re-read
    assert reader.read({UID: {CID}})[UID].containers[CID].oom_kills == 1
    (root / SYSTEMD_POD / "memory.events").write_text("oom_kill 2\n")
    pod = reader.read({UID: {CID}})[UID]
    assert (pod.pod.oom_kills, pod.containers[CID].oom_kills) == (2, 7)


def test_rescans_for_a_new_container_at_most_every_interval(tmp_path):
    now = [0.0]
    root = v2_root(tmp_path)
    write_v2(root / SYSTEMD_POD, 1_000, 0)
    write_v2(root / SYSTEMD_POD / f"cri-containerd-{CID}.scope", 1_000, 0)
    reader = CgroupMemoryReader(root, clock=lambda: now[0])
    assert set(reader.read({UID: {CID}})[UID].containers) == {CID}
    write_v2(root / SYSTEMD_POD / f"cri-containerd-{CID2}.scope", 500, 0)
    now[0] = RESCAN_MIN_INTERVAL_S / 2
    assert set(reader.read({UID: {CID, CID2}})[UID].containers) == {CID}
    now[0] = RESCAN_MIN_INTERVAL_S + 1
    assert set(reader.read({UID: {CID, CID2}})[UID].containers) == {CID, CID2}


def pod_dir(root: Path, uid: str) -> Path:
    return root / f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice"


def test_a_reading_is_kept_until_the_refresh_interval_has_passed(tmp_path):
    root = v2_root(tmp_path)
    write_v2(root / SYSTEMD_POD, 1_000, 0)
    reader = CgroupMemoryReader(root, refresh_s=30)
    assert reader.read({UID: set()}, now=0)[UID].pod.working_set_bytes == 1_000
    write_v2(root / SYSTEMD_POD, 2_000, 0)
    # The first reading comes due within the interval (a per-pod share of it): kept until then.
    kept = [t for t in range(31) if reader.read({UID: set()}, now=t)[UID].pod.working_set_bytes == 1_000]
    assert kept == list(range(len(kept))) and len(kept) < 31
    write_v2(root / SYSTEMD_POD, 3_000, 0)
    first_due = len(kept)  # the refresh happened at the first whole second at or after the due time
    assert reader.read({UID: set()}, now=first_due + 28.9)[UID].pod.working_set_bytes == 2_000
    assert reader.read({UID: set()}, now=first_due + 30)[UID].pod.working_set_bytes == 3_000


def test_refreshes_keep_their_rate_when_ticks_wake_late(tmp_path):
    """A run loop wakes a little late by varying amounts: every third 10-s tick
    still re-reads (not every fourth, as ages measured from the last read would)."""
    root = v2_root(tmp_path)
    reader = CgroupMemoryReader(root, refresh_s=30)
    reads = []
    for step in range(40):
        write_v2(root / SYSTEMD_POD, 1_000 + step, 0)
        late = 0.002 * ((step * 7) % 5)  # 0-8 ms late, varying
        if reader.read({UID: set()}, now=step * 10.0 + late)[UID].pod.working_set_bytes == 1_000 + step:
            reads.append(step)
    assert {b - a for a, b in zip(reads, reads[1:], strict=False)} == {3}


def test_a_clock_that_steps_back_re_reads_at_once(tmp_path):
    root = v2_root(tmp_path)
    write_v2(root / SYSTEMD_POD, 1_000, 0, oom=0)
    reader = CgroupMemoryReader(root, refresh_s=30)
    reader.read({UID: set()}, now=10_000)
    write_v2(root / SYSTEMD_POD, 2_000, 0, oom=1)
    pod = reader.read({UID: set()}, now=10_000 - 3600)[UID].pod  # NTP stepped the clock back an hour
    assert (pod.working_set_bytes, pod.oom_kills) == (2_000, 1)
    write_v2(root / SYSTEMD_POD, 3_000, 0, oom=1)
    assert reader.read({UID: set()}, now=10_000 - 3600 + 10)[UID].pod.working_set_bytes == 2_000  # kept again


def test_refreshes_are_spread_so_each_sample_reads_a_share_of_the_pods(tmp_path):
    root = v2_root(tmp_path)
    uids = [str(uuid.UUID(int=i * 7919 + 1)) for i in range(90)]
    reader = CgroupMemoryReader(root, refresh_s=30)
    shares, last_read = [], dict.fromkeys(uids, 0.0)
    for step in range(12):  # two minutes of 10-s samples; each sample writes new figures
        for uid in uids:
            write_v2(pod_dir(root, uid), 1_000 + step, 0)
        result = reader.read({uid: set() for uid in uids}, now=step * 10.0)
        fresh = [uid for uid in uids if result[uid].pod.working_set_bytes == 1_000 + step]
        for uid in fresh:
            last_read[uid] = step * 10.0
        assert all(step * 10.0 - t <= 30 for t in last_read.values())  # nobody's RAM is older than 30 s
        if step:
            shares.append(len(fresh))
    assert all(15 <= n <= 45 for n in shares), shares  # about a third each time, not all at once


def test_a_new_container_is_read_at_once_and_gone_pods_are_forgotten(tmp_path):
    root = v2_root(tmp_path)
    write_v2(root / SYSTEMD_POD, 1_000, 0)
    write_v2(root / SYSTEMD_POD / f"cri-containerd-{CID}.scope", 1_000, 0)
    reader = CgroupMemoryReader(root, clock=lambda: 0.0, refresh_s=30)
    assert set(reader.read({UID: {CID}}, now=0)[UID].containers) == {CID}
    write_v2(root / SYSTEMD_POD / f"cri-containerd-{CID2}.scope", 500, 0)
    reader._last_scan = -RESCAN_MIN_INTERVAL_S  # the rescan is due
    assert reader.read({UID: {CID, CID2}}, now=1)[UID].containers[CID2].working_set_bytes == 500
    assert reader.read({}, now=2) == {}
    write_v2(root / SYSTEMD_POD, 4_000, 0)
    assert reader.read({UID: {CID, CID2}}, now=3)[UID].pod.working_set_bytes == 4_000


def test_a_negative_refresh_interval_is_refused(tmp_path):
    with pytest.raises(ValueError, match="RAM refresh interval must be >= 0 seconds, got -1"):
        CgroupMemoryReader(tmp_path, refresh_s=-1)
