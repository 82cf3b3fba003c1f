"""Pure report assembly: per-pod sums, unknown values, idle GPU pods, names, bounds,
the processes cross-check and conditions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vramguard_agent.aggregation import MISSING_MIN_BYTES, aggregate, processes_short
from vramguard_agent.cgroups import Attribution, NotInPod
from vramguard_agent.gpu import DeviceSample, GPUProcess, GPUSample, MemoryInfo
from vramguard_agent.memory import CgroupMemory, PodMemory
from vramguard_agent.pods import PodMeta
from vramguard_agent.report import Bounds, PodInputs, build_report
from vramguard_api.trend import TrendFeatures
from vramguard_api.usage import AgentInfo, NodeGPUUsageStatus

from .builders import GIB, MIB

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
AGENT = AgentInfo(version="t", backend="sim", sampleIntervalSeconds=10)
A, B = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
C_ = "cccccccc-0000-0000-0000-000000000003"
CA, CA2, CB = "a" * 64, "c" * 64, "b" * 64


def device(uuid, *processes, used=None, reserved=0, total=80 * GIB, **kw):
    known = sum(p.used_bytes or 0 for p in processes)
    memory = MemoryInfo(total=total, used=known if used is None else used, free=0, reserved=reserved)
    return DeviceSample(uuid=uuid, index=kw.pop("index", 0), memory=memory, processes=list(processes), **kw)


def attr(uid, cid, qos="burstable"):
    return Attribution(uid, cid, "containerd", qos, static_pod="-" not in uid, cgroup_path="/x")


def status(sample, attributions, inputs=None, previous=None, bounds=None, error=None, now=NOW):
    agg = aggregate(sample, attributions)
    return build_report(sample, error, agg, inputs or PodInputs(), AGENT, now, previous, bounds or Bounds()).to_status()


def test_pods_sum_their_processes_per_device_and_container():
    sample = GPUSample(
        [
            device("GPU-0", GPUProcess(1, 2 * GIB), GPUProcess(2, GIB), GPUProcess(3, 4 * GIB)),
            device("GPU-1", GPUProcess(4, 3 * GIB), index=1),
        ]
    )
    attributions = {1: attr(A, CA), 2: attr(A, CA2), 3: attr(B, CB), 4: attr(A, CA)}
    meta = {A: PodMeta(A, "ns", "alpha", "burstable", {CA: "main", CA2: "side"}, gpu=True)}
    s = status(sample, attributions, PodInputs(pods=meta))
    alpha, beta = s.pods  # sorted: named pods first, unnamed last
    assert (alpha.name, alpha.vram_bytes, alpha.attribution) == ("alpha", 6 * GIB, "Measured")
    assert [(d.uuid, d.used_bytes) for d in alpha.devices] == [("GPU-0", 3 * GIB), ("GPU-1", 3 * GIB)]
    assert [(c.name, c.vram_bytes) for c in alpha.containers] == [("main", 5 * GIB), ("side", GIB)]
    assert (beta.uid, beta.name, beta.vram_bytes, beta.qos_class) == (B, None, 4 * GIB, "burstable")
    assert s.devices[0].process_bytes == 7 * GIB and s.devices[0].processes_complete


def test_unknown_process_memory_makes_the_pod_unknown_not_zero():
    sample = GPUSample([device("GPU-0", GPUProcess(1, GIB), GPUProcess(2, None), used=3 * GIB)])
    s = status(sample, {1: attr(A, CA), 2: attr(A, CA2)})
    (pod,) = s.pods
    assert pod.attribution == "Unknown" and pod.vram_bytes is None
    assert pod.devices[0].used_bytes is None
    assert {c.container_id: c.vram_bytes for c in pod.containers} == {CA: GIB, CA2: None}
    assert s.devices[0].processes_complete is False and s.devices[0].process_bytes is None
    # Unknown is not "missing": no ProcessSumBelowUsed.
    missing = next(c for c in s.conditions if c.type == "ProcessesMissing")
    assert missing.status == "False"


def test_unattributed_processes_carry_their_reason_and_gone_pids_are_dropped():
    sample = GPUSample([device("GPU-0", GPUProcess(1, GIB), GPUProcess(2, 2 * GIB), GPUProcess(3, GIB))])
    s = status(sample, {1: NotInPod("not in a pod: host"), 2: attr(A, CA)})  # pid 3 exited
    assert [(u.pid, u.used_bytes, u.reason) for u in s.unattributed] == [(1, GIB, "not in a pod: host")]
    assert [p.uid for p in s.pods] == [A]
    assert s.devices[0].process_bytes == 4 * GIB


def test_idle_gpu_pods_are_reported_with_zero_vram_and_their_ram():
    meta = {B: PodMeta(B, "ns", "idle", "besteffort", {CB: "main"}, gpu=True)}
    memory = {B: PodMemory(CgroupMemory(5 * GIB, 0), {CB: CgroupMemory(4 * GIB, 1)})}
    s = status(GPUSample([device("GPU-0")]), {}, PodInputs(pods=meta, memory=memory, gpu_pods=[B]))
    (pod,) = s.pods
    assert (pod.name, pod.vram_bytes, pod.ram_working_set_bytes, pod.attribution) == ("idle", 0, 5 * GIB, "Measured")
    assert [(c.name, c.vram_bytes, c.ram_working_set_bytes, c.oom_kills) for c in pod.containers] == [
        ("main", 0, 4 * GIB, 1)
    ]


def test_idle_gpu_pods_are_unknown_when_a_listing_failed():
    failed = DeviceSample(uuid="MIG-1", index=0, processes=None, process_error="NoPermission")
    s = status(GPUSample([failed]), {}, PodInputs(pods={B: PodMeta(B, "ns", "idle", gpu=True)}, gpu_pods=[B]))
    assert s.pods[0].vram_bytes is None and s.pods[0].attribution == "Unknown"
    missing = next(c for c in s.conditions if c.type == "ProcessesMissing")
    assert (missing.status, missing.reason) == ("True", "DeviceErrors") and "NoPermission" in missing.message


def test_static_pod_is_reported_under_its_mirror_pods_uid():
    config_hash = "03671a0313f5acf27bef3683009923f8"
    mirror = PodMeta(A, "kube-system", "etcd-node", config_hash=config_hash)
    sample = GPUSample([device("GPU-0", GPUProcess(1, GIB))])
    s = status(sample, {1: attr(config_hash, CA)}, PodInputs(pods={A: mirror, config_hash: mirror}))
    assert [(p.uid, p.name) for p in s.pods] == [(A, "etcd-node")]


def test_container_names_fall_back_to_the_extra_names():
    sample = GPUSample([device("GPU-0", GPUProcess(1, GIB))])
    s = status(sample, {1: attr(A, CA)}, PodInputs(container_names={CA: "sim-name"}))
    assert s.pods[0].containers[0].name == "sim-name"


def test_trend_is_attached_by_cgroup_uid():
    trend = TrendFeatures(windowSeconds=60, samples=7, growthBytesPerHour=1.0)
    s = status(GPUSample([device("GPU-0", GPUProcess(1, GIB))]), {1: attr(A, CA)}, PodInputs(trends={A: trend}))
    assert s.pods[0].trend == trend


def test_processes_short_threshold():
    assert not processes_short(10 * GIB, 0, 10 * GIB)
    assert not processes_short(10 * GIB, GIB, 9 * GIB - 512 * MIB)  # within 1 GiB
    assert processes_short(4 * GIB, 0, 4 * GIB - MISSING_MIN_BYTES - 1)
    assert not processes_short(4 * GIB, 0, 4 * GIB - MISSING_MIN_BYTES)
    assert not processes_short(100 * GIB, 0, 81 * GIB)  # within 20%
    assert processes_short(100 * GIB, 0, 79 * GIB)
    assert not processes_short(GIB, 2 * GIB, 0)  # reserved above used: nothing expected


def test_hidden_processes_raise_processes_missing():
    hidden = device("GPU-0", used=30 * GIB, reserved=GIB)  # memory used, no process listed
    s = status(GPUSample([hidden, device("GPU-1", GPUProcess(1, GIB), index=1)]), {1: attr(A, CA)})
    assert s.devices[0].processes_complete is False and s.devices[1].processes_complete is True
    missing = next(c for c in s.conditions if c.type == "ProcessesMissing")
    assert (missing.status, missing.reason) == ("True", "ProcessSumBelowUsed") and "GPU-0" in missing.message


def test_mig_parent_sums_its_instances():
    parent = DeviceSample(
        uuid="GPU-P", index=0, mig_enabled=True, processes=[], memory=MemoryInfo(40 * GIB, 3 * GIB, 0, 0)
    )
    m0 = device("MIG-0", GPUProcess(1, GIB), parent_uuid="GPU-P")
    m1 = device("MIG-1", GPUProcess(2, 2 * GIB), parent_uuid="GPU-P")
    s = status(GPUSample([parent, m0, m1]), {1: attr(A, CA), 2: attr(B, CB)})
    assert s.devices[0].process_bytes == 3 * GIB and s.devices[0].processes_complete
    assert {p.uid: [d.uuid for d in p.devices] for p in s.pods} == {A: ["MIG-0"], B: ["MIG-1"]}


def test_lost_device_is_unhealthy_and_its_processes_absent():
    lost = DeviceSample(uuid="GPU-1", index=1, processes=None, health="Lost", error="NVMLError_GpuIsLost: GPU is lost")
    s = status(GPUSample([device("GPU-0", GPUProcess(1, GIB)), lost]), {1: attr(A, CA)})
    assert s.devices[1].health == "Lost" and s.devices[1].processes_complete is False
    healthy = next(c for c in s.conditions if c.type == "AgentHealthy")
    assert (healthy.status, healthy.reason) == ("False", "DeviceErrors") and "GpuIsLost" in healthy.message
    assert s.pods[0].vram_bytes == GIB


def test_pods_seen_on_a_device_whose_listing_failed_are_unknown():
    """Pods seen on GPU-1 in the last good listing become Unknown while it is lost
    (their sum over GPU-0 alone would be a partial one); GPU pods without a
    process anywhere are Unknown too; a pod never seen there stays Measured."""
    lost = DeviceSample(uuid="GPU-1", index=1, processes=None, health="Lost", error="NVMLError_GpuIsLost")
    sample = GPUSample([device("GPU-0", GPUProcess(1, GIB), GPUProcess(3, 2 * GIB)), lost])
    meta = {C_: PodMeta(C_, "ns", "idle", gpu=True)}
    agg = aggregate(sample, {1: attr(A, CA), 3: attr(B, CB)}, last_seen={"GPU-1": {A, C_}, "GPU-0": {B}})
    s = build_report(sample, None, agg, PodInputs(pods=meta, gpu_pods=[C_]), AGENT, NOW).to_status()
    by_uid = {p.uid: p for p in s.pods}
    assert (by_uid[A].attribution, by_uid[A].vram_bytes) == ("Unknown", None)
    assert {d.uuid: d.used_bytes for d in by_uid[A].devices} == {"GPU-0": GIB, "GPU-1": None}
    assert (by_uid[B].attribution, by_uid[B].vram_bytes) == ("Measured", 2 * GIB)
    assert (by_uid[C_].attribution, by_uid[C_].vram_bytes) == ("Unknown", None)
    assert s.devices[1].processes_complete is False and s.devices[1].process_bytes is None
    missing = next(c for c in s.conditions if c.type == "ProcessesMissing")
    assert missing.status == "True" and "GPU-1" in missing.message
    assert agg.seen == {"GPU-0": {A, B}}  # what the sampler keeps as the last good listing


def test_backend_unavailable_reports_no_devices_and_the_reason():
    s = status(None, {}, error="nvmlInit failed: NVMLError_LibraryNotFound")
    assert s.devices == [] and s.pods == []
    # GPU pods are Unknown then, not Measured 0
    s = status(None, {}, PodInputs(pods={B: PodMeta(B, "ns", "idle", gpu=True)}, gpu_pods=[B]), error="x")
    assert (s.pods[0].attribution, s.pods[0].vram_bytes) == ("Unknown", None)
    healthy = next(c for c in s.conditions if c.type == "AgentHealthy")
    assert (healthy.status, healthy.reason) == ("False", "NVMLUnavailable")


def test_condition_transition_time_is_kept_while_status_holds():
    sample = GPUSample([device("GPU-0")])
    first = status(sample, {})
    later = status(sample, {}, previous=first.conditions, now=NOW + timedelta(minutes=5))
    assert all(c.last_transition_time == NOW for c in later.conditions)
    broken = status(None, {}, previous=later.conditions, error="x", now=NOW + timedelta(minutes=6))
    healthy = next(c for c in broken.conditions if c.type == "AgentHealthy")
    assert healthy.last_transition_time == NOW + timedelta(minutes=6)


def test_bounds_keep_the_largest_pods_and_mark_truncated():
    processes = [GPUProcess(i, (i + 1) * GIB) for i in range(6)]
    attributions = {i: attr(f"0000000{i}-0000-0000-0000-000000000000", f"{i}" * 64) for i in range(6)}
    attributions[6] = NotInPod("not in a pod")
    attributions[7] = NotInPod("not in a pod")
    sample = GPUSample([device("GPU-0", *processes, GPUProcess(6, GIB), GPUProcess(7, 3 * GIB))])
    s = status(sample, attributions, bounds=Bounds(max_pods=3, max_unattributed=1))
    assert s.truncated
    assert sorted(p.vram_bytes for p in s.pods) == [4 * GIB, 5 * GIB, 6 * GIB]
    assert [u.pid for u in s.unattributed] == [7]
    NodeGPUUsageStatus.model_validate(s.to_api())  # still valid against the API model


def test_unbounded_report_is_not_truncated():
    s = status(GPUSample([device("GPU-0", GPUProcess(1, GIB))]), {1: attr(A, CA)})
    assert not s.truncated
