"""End records from successive samples (agent/vramguard_agent/ends.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vramguard_agent.cgroups import Attribution
from vramguard_agent.ends import RECENT_KEPT, RING_SIZE, EndTracker
from vramguard_agent.gpu import DeviceSample, GPUProcess, GPUSample, MemoryInfo
from vramguard_agent.report import ContainerEntry, DeviceEntry, NodeReport, PodEntry
from vramguard_api.ends import MAX_END_RECORDS
from vramguard_api.usage import AgentInfo, DeviceMemory, GPUDevice, NodeGPUUsageStatus

GIB = 1 << 30
DEV = "GPU-00000000-0000-0000-0000-000000000000"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cid(n: int) -> str:
    return f"{n:064x}"


class Node:
    """A node's sample built by hand: pods {uid: {container id: (pid, bytes)}} on one device."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, tuple[int, int]]] = {}
        self.oom: dict[str, int] = {}
        self.free = 10 * GIB
        self.listed = True
        self.truncated = False

    def sample(self) -> tuple[GPUSample, dict[int, Attribution], NodeReport]:
        procs = [GPUProcess(pid, b) for c in self.pods.values() for pid, b in c.values()]
        gpu = GPUSample([DeviceSample(DEV, 0, memory=MemoryInfo(80 * GIB, 70 * GIB, self.free, 0),
                                      processes=procs if self.listed else None)])
        where = {pid: Attribution(uid, c, "containerd", "burstable", False, "/x")
                 for uid, cs in self.pods.items() for c, (pid, _) in cs.items()}
        entries = [PodEntry(uid, "ns", f"pod-{uid}", vram_bytes=sum(b for _, b in cs.values()),
                            ram_working_set_bytes=GIB, oom_kills=self.oom.get(uid, 0),
                            devices=[DeviceEntry(DEV, sum(b for _, b in cs.values()))],
                            containers=[ContainerEntry(c, "main", b, GIB // 2, 0) for c, (_, b) in cs.items()])
                   for uid, cs in self.pods.items()]
        device = GPUDevice(uuid=DEV, index=0, memory=DeviceMemory(totalBytes=80 * GIB, freeBytes=self.free,
                                                                  usableBytes=80 * GIB))
        agent = AgentInfo(version="t", backend="sim", sampleIntervalSeconds=10)
        return gpu, where, NodeReport(T0, agent, [], [device], entries, [], self.truncated)


def observe(tracker: EndTracker, node: Node, t: int) -> list:
    gpu, where, report = node.sample()
    return tracker.observe(gpu, where, report, T0 + timedelta(seconds=t))


def test_a_container_that_ends_becomes_one_record_with_its_last_view() -> None:
    node, tracker = Node(), EndTracker()
    node.pods = {"a": {cid(1): (100, 4 * GIB)}, "b": {cid(2): (200, 30 * GIB)}, "c": {cid(3): (300, 10 * GIB)}}
    assert observe(tracker, node, 0) == []
    node.pods["a"] = {cid(1): (100, 6 * GIB)}  # a grows by 2 GiB: its step
    node.free = GIB
    observe(tracker, node, 10)
    del node.pods["a"]
    (record,) = observe(tracker, node, 20)
    assert (record.kind, record.pod_uid, record.container_id, record.pids) == ("ContainerEnd", "a", cid(1), [100])
    (device,) = record.devices
    assert (device.pod_bytes, device.process_bytes, device.step_bytes, device.free_bytes) == (
        6 * GIB, 6 * GIB, 2 * GIB, GIB)
    assert [(n.uid, n.used_bytes) for n in device.neighbours] == [("b", 30 * GIB), ("c", 10 * GIB)]
    assert (record.ram_working_set_bytes, record.oom_kills_before, record.oom_kills_after) == (GIB // 2, 0, None)
    assert record.id == int((T0 + timedelta(seconds=20)).timestamp() * 1_000_000)


def test_a_process_that_exits_while_its_container_runs_is_a_process_exit() -> None:
    node, tracker = Node(), EndTracker()
    node.pods = {"a": {cid(1): (100, 4 * GIB)}}
    observe(tracker, node, 0)
    node.pods["a"] = {cid(1): (101, 4 * GIB)}  # the container's GPU process was replaced
    (record,) = observe(tracker, node, 10)
    assert (record.kind, record.pids, record.container_id) == ("ProcessExit", [100], cid(1))


def test_an_oom_kill_in_a_running_container_is_recorded_with_the_counter() -> None:
    node, tracker = Node(), EndTracker()
    node.pods = {"a": {cid(1): (100, 4 * GIB)}}
    observe(tracker, node, 0)
    node.oom["a"] = 1
    (record,) = observe(tracker, node, 10)
    assert (record.kind, record.oom_kills_before, record.oom_kills_after, record.oom_kills_delta) == (
        "CgroupOOMKill", 0, 1, 1)


def test_nothing_is_concluded_from_a_sample_that_could_not_see() -> None:
    node, tracker = Node(), EndTracker()
    node.pods = {"a": {cid(1): (100, 4 * GIB)}}
    observe(tracker, node, 0)
    node.pods, node.listed, node.truncated = {}, False, True
    assert observe(tracker, node, 10) == []


def test_steady_samples_make_no_record() -> None:
    node, tracker = Node(), EndTracker()
    node.pods = {"a": {cid(1): (100, 4 * GIB)}}
    assert [observe(tracker, node, t) for t in range(0, 100, 10)] == [[]] * 10


def test_acknowledged_records_stay_only_as_recent_ones_and_the_waiting_come_last() -> None:
    node, tracker = Node(), EndTracker()
    for i in range(3):
        node.pods = {"a": {cid(1): (100 + i, GIB)}}
        observe(tracker, node, i)
    first, second = tracker.published()
    assert first.id < second.id and tracker.pending(first.id)
    tracker.acknowledge(first.id)
    assert list(tracker.ring) == [second] and list(tracker.recent) == [first]
    assert tracker.published() == [first, second]
    tracker.acknowledge(second.id)
    assert not tracker.ring and not tracker.pending(second.id)


def test_recent_records_give_way_to_waiting_ones() -> None:
    node, tracker = Node(), EndTracker()
    for i in range(RECENT_KEPT + MAX_END_RECORDS + 5):
        node.pods = {"a": {cid(1): (1000 + i, GIB)}}
        observe(tracker, node, i)
        if i == RECENT_KEPT + 4:
            tracker.acknowledge(tracker.last_id)
    assert len(tracker.recent) == RECENT_KEPT
    published = tracker.published()
    assert len(published) == MAX_END_RECORDS and all(r.id > tracker.acknowledged for r in published)


def test_the_ring_is_bounded_and_publishes_at_most_the_api_bound() -> None:
    node, tracker = Node(), EndTracker()
    for i in range(RING_SIZE + 10):
        node.pods = {"a": {cid(1): (1000 + i, GIB)}}
        observe(tracker, node, i)
    assert len(tracker.ring) == RING_SIZE and tracker.dropped == RING_SIZE + 9 - RING_SIZE
    published = tracker.published()
    assert len(published) == MAX_END_RECORDS
    # The API model accepts what is published.
    NodeGPUUsageStatus(sampleTime=T0, ends=published)


def test_restore_takes_back_unacknowledged_records_and_ids_keep_growing() -> None:
    node, tracker = Node(), EndTracker()
    node.pods = {"a": {cid(1): (100, GIB)}}
    observe(tracker, node, 0)
    node.pods = {"a": {cid(1): (101, GIB)}}
    (old,) = observe(tracker, node, 10)
    fresh = EndTracker()
    fresh.restore([old], acknowledged=0)
    assert fresh.published() == [old] and list(fresh.ring) == [old]
    done = EndTracker()
    done.restore([old], acknowledged=old.id)
    assert list(done.recent) == [old] and not done.ring
    node.pods = {"a": {cid(1): (100, GIB)}}
    observe(fresh, node, 0)  # the clock went back: ids still grow
    node.pods = {"a": {cid(1): (102, GIB)}}
    (new,) = observe(fresh, node, 1)
    assert new.id > old.id
