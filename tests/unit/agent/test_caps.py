"""Pods' driver-enforced memory limits: what the agent sets, clears, reads back and reports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pynvml
import pytest

from vramguard_agent.caps import CapEnforcer
from vramguard_agent.limits_plan import Step, decide
from vramguard_agent.nvml import NVMLBackend
from vramguard_agent.nvml_limits import HeldLimits, NVMLMemoryLimits
from vramguard_agent.pods import PodMeta
from vramguard_api import memlimits as ML
from vramguard_api.memlimits import DeviceMemoryLimit, format_memory_limits
from vramguard_sim.fakenvml import FakeNVML

from .builders import GIB, gpu, mig_gpu, nvml

MAX = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX
G0, G1 = gpu(0).uuid, gpu(1).uuid
A, B = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"


def rel(uid: str) -> str:
    return f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice"


def ns(uid: str) -> str:
    return "/sys/fs/cgroup" + rel(uid)


def annotation(**limits: DeviceMemoryLimit) -> str:
    return format_memory_limits({{"g0": G0, "g1": G1}[k]: v for k, v in limits.items()})


def pod(uid: str, limits: str | None = None, gpu_pod: bool = True) -> PodMeta:
    return PodMeta(uid=uid, namespace="ml", name=f"pod-{uid[:4]}", gpu=gpu_pod, memory_limits=limits)


@dataclass
class Node:
    """A fake driver, the node's pods and their cgroups, and an enforcer over them."""

    fake: FakeNVML
    enforce: bool = True
    pods: dict[str, PodMeta] = field(default_factory=dict)
    cgroups: dict[str, str] = field(default_factory=dict)
    now: list[float] = field(default_factory=lambda: [0.0])
    synced: list[bool] = field(default_factory=lambda: [True])
    calls: list[tuple[str, str]] = field(default_factory=list)
    caps: CapEnforcer = field(init=False)

    def __post_init__(self) -> None:
        self.caps = self.restart()

    def restart(self) -> CapEnforcer:
        """A new agent process: nothing remembered, the driver keeps what it holds."""
        self.caps = CapEnforcer(
            NVMLMemoryLimits(self.fake),
            enforce=self.enforce,
            clock=lambda: self.now[0],
            pods_synced=lambda: self.synced[0],
            on_operation=lambda op, result: self.calls.append((op, result)),
        )
        return self.caps

    def add(self, meta: PodMeta, cgroup: bool = True) -> None:
        self.pods[meta.uid] = meta
        if cgroup:
            self.cgroups[meta.uid] = rel(meta.uid)

    def reconcile(self) -> dict[str, list[tuple[str, str, str]]]:
        if not hasattr(self, "backend"):
            self.backend = NVMLBackend(self.fake)  # one per node: it remembers a lost GPU's UUID
        sample = self.backend.sample()
        self.devices = {d.uuid: d for d in sample.devices}
        result = self.caps.reconcile(sample, self.pods, self.cgroups.get, cgroup_v2=True)
        self.result = result
        return {uid: [(e.uuid, e.state, e.reason) for e in p.entries] for uid, p in result.items()}

    def held(self, uuid: str = G0) -> Mapping[str, tuple[int, int]]:
        return self.fake.memory_limits.get(uuid, {})

    def sets(self) -> int:
        return self.fake.calls.get("nvmlDeviceSetMemoryLimits_v1", 0)


@pytest.fixture
def node() -> Node:
    fake = nvml(gpu(0, (100, 3 * GIB)), gpu(1), privileged=True)
    fake.driver_version = "615.12.03"
    return Node(fake)


# --- the pure decision ------------------------------------------------------------


def test_decide_sets_what_is_not_held_and_clears_what_is_not_wanted():
    hard20, hard10 = DeviceMemoryLimit(hard_limit=20 * GIB), DeviceMemoryLimit(hard_limit=10 * GIB)
    wanted = {(A, G0): hard20, (A, G1): hard10, (B, G0): hard10}
    held = {(A, G0): HeldLimits(0, 20 * GIB), (A, G1): HeldLimits(0, 20 * GIB), (B, G1): HeldLimits(0, 5 * GIB)}
    steps = decide(wanted, held, [G0, G1], {A: ns(A), B: ns(B)})
    assert steps == [Step("set", (A, G1), hard10), Step("set", (B, G0), hard10), Step("clear", (B, G1))]


def test_decide_does_nothing_on_unsupported_devices_or_without_a_cgroup():
    wanted = {(A, G0): DeviceMemoryLimit(hard_limit=GIB), (B, G1): DeviceMemoryLimit(hard_limit=GIB)}
    assert decide(wanted, {}, [G0], {B: ns(B)}) == []
    assert decide({}, {(A, G0): HeldLimits(0, MAX)}, [G0], {A: ns(A)}) == []  # held clear: nothing to clear


# --- applying ------------------------------------------------------------------------


def test_wanted_limits_are_set_on_the_pods_cgroup_and_read_back(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(soft_limit=GIB, hard_limit=20 * GIB))))
    assert node.reconcile() == {A: [(G0, "Applied", ML.REASON_APPLIED)]}
    assert node.held() == {ns(A): (GIB, 20 * GIB)}
    (entry,) = node.result[A].entries
    assert (entry.hard_limit_bytes, entry.soft_limit_bytes) == (20 * GIB, GIB)
    api = entry.to_api()
    assert (api.state, api.hard_limit_bytes, api.soft_limit_bytes) == ("Applied", 20 * GIB, GIB)
    assert ("set", "ok") in node.calls
    node.reconcile()
    assert node.sets() == 1  # held: not set again


def test_device_support_is_recorded_on_the_sample(node):
    node.reconcile()
    support = node.devices[G0].memory_limits
    assert support is not None and support.supported and support.reason == ML.REASON_PROBE_SUCCEEDED


def test_removed_annotation_clears_the_limits(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    node.add(pod(A))
    assert node.reconcile() == {}
    assert node.held() == {} and ("clear", "ok") in node.calls


def test_deleted_pod_is_cleared_while_its_cgroup_remains_and_forgotten_after(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    del node.pods[A]
    node.reconcile()
    assert node.held() == {}
    node.add(pod(B, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    del node.pods[B], node.cgroups[B]  # the cgroup went with the pod: the driver dropped its limits
    sets = node.sets()
    assert node.reconcile() == {}
    assert node.sets() == sets and node.caps.held == {}


def test_changed_annotation_is_applied(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=10 * GIB), g1=DeviceMemoryLimit(soft_limit=GIB))))
    assert node.reconcile() == {A: [(G0, "Applied", ML.REASON_APPLIED), (G1, "Applied", ML.REASON_APPLIED)]}
    assert node.held(G0) == {ns(A): (0, 10 * GIB)} and node.held(G1) == {ns(A): (GIB, MAX)}


def test_a_bad_annotation_is_refused_whole_and_other_pods_are_applied(node):
    node.add(pod(A, f'{{"{G0}":{{"hardLimit":20}}}}'))
    node.add(pod(B, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    entries = node.reconcile()
    assert entries[A] == [] and "hardLimit: 20 bytes" in (node.result[A].error or "")
    assert entries[B] == [(G0, "Applied", ML.REASON_APPLIED)]
    assert node.held() == {ns(B): (0, 20 * GIB)}


def test_bad_annotation_leaves_what_is_held(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    node.add(pod(A, "not json"))
    node.reconcile()
    # The pod's wants are unknown, not gone: the cap the driver holds stays and is reported.
    assert node.held() == {ns(A): (0, 20 * GIB)}
    assert node.result[A].error and node.result[A].entries[0].reason == ML.REASON_ANNOTATION_REFUSED


# --- restarts ------------------------------------------------------------------------


def test_restart_neither_loses_nor_duplicates_a_cap(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    sets = node.sets()
    node.restart()
    assert node.reconcile() == {A: [(G0, "Applied", ML.REASON_APPLIED)]}
    assert node.sets() == sets  # found held at start: not set again
    assert node.held() == {ns(A): (0, 20 * GIB)}


def test_restart_clears_caps_whose_annotation_went_while_the_agent_was_down(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    node.restart()
    node.add(pod(A))  # the operator removed the annotation meanwhile
    assert node.reconcile() == {}
    assert node.held() == {}


def test_restart_fixes_a_cap_that_differs(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.fake.memory_limits = {G0: {ns(A): (0, 30 * GIB)}}
    node.reconcile()
    assert node.held() == {ns(A): (0, 20 * GIB)}


def test_nothing_is_changed_before_the_pods_are_listed(node):
    node.fake.memory_limits = {G0: {ns(A): (0, 30 * GIB)}}
    node.add(pod(A))
    node.synced[0] = False
    node.reconcile()
    assert node.held() == {ns(A): (0, 30 * GIB)} and node.sets() == 0
    node.synced[0] = True
    node.reconcile()
    assert node.held() == {}


# --- enforcement off, unsupported devices, failures ----------------------------------


def test_enforcement_off_reports_and_applies_nothing():
    fake = nvml(gpu(0), privileged=True)
    fake.driver_version = "615.12.03"
    node = Node(fake, enforce=False)
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    assert node.reconcile() == {A: [(G0, "Disabled", ML.REASON_ENFORCEMENT_DISABLED)]}
    assert node.sets() == 0 and node.devices[G0].memory_limits.supported


def test_old_driver_makes_every_device_unsupported_and_nothing_is_called_to_set():
    fake = nvml(gpu(0), privileged=True)  # driver 550
    node = Node(fake)
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    assert node.reconcile() == {A: [(G0, "Unsupported", ML.REASON_DEVICE_UNSUPPORTED)]}
    assert ML.REASON_DRIVER_TOO_OLD in (node.result[A].entries[0].message or "")
    assert node.devices[G0].memory_limits.reason == ML.REASON_DRIVER_TOO_OLD and node.sets() == 0


def test_mig_enabled_gpu_is_unsupported():
    fake = nvml(mig_gpu([(200, GIB)]), privileged=True)
    fake.driver_version = "615.12.03"
    node = Node(fake)
    parent = fake.gpus[0].uuid
    node.add(pod(A, format_memory_limits({parent: DeviceMemoryLimit(hard_limit=2 * GIB)})))
    assert node.reconcile() == {A: [(parent, "Unsupported", ML.REASON_DEVICE_UNSUPPORTED)]}
    assert node.devices[parent].memory_limits.reason == ML.REASON_MIG_ENABLED


def test_no_permission_to_set_marks_the_device_unsupported_until_the_next_probe(node):
    node.fake.privileged = False
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    assert node.caps.support[G0].reason == ML.REASON_NO_PERMISSION
    assert ("set", "error") in node.calls
    node.reconcile()
    assert node.sets() == 1  # not retried on every sample
    assert node.result[A].entries[0].state == "Unsupported"
    node.fake.privileged = True
    node.now[0] += node.caps.probe_interval_s
    assert node.reconcile() == {A: [(G0, "Applied", ML.REASON_APPLIED)]}


def test_a_hard_limit_below_use_is_reported_not_held_and_retried(node):
    node.fake.refuse_max_below_usage = True
    node.fake.pid_cgroups = {100: ns(A) + "/cri-containerd-1.scope"}  # 3 GiB in pod A
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=2 * GIB))))
    assert node.reconcile() == {A: [(G0, "Failed", ML.REASON_NOT_HELD)]}
    message = node.result[A].entries[0].message or ""
    assert "uses 3.00Gi, above the hard limit" in message
    node.fake.gpus[0].processes[0].used_bytes = GIB  # use falls below the cap
    assert node.reconcile() == {A: [(G0, "Applied", ML.REASON_APPLIED)]}


def test_a_failed_set_is_reported_and_retried(node):
    node.fake.cgroups = {"/sys/fs/cgroup"}  # NVML: NOT_FOUND for the pod's nameSpace (the probe's is there)
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    (entry,) = node.result[A].entries
    assert (entry.state, entry.reason) == ("Failed", ML.REASON_SET_FAILED) and "NotFound" in (entry.message or "")
    node.fake.cgroups = None
    assert node.reconcile() == {A: [(G0, "Applied", ML.REASON_APPLIED)]}


def test_unknown_device_and_missing_cgroup_are_pending(node):
    other = "GPU-99999999-0000-0000-0000-000000000000"
    node.add(pod(A, format_memory_limits({other: DeviceMemoryLimit(hard_limit=GIB)})))
    node.add(pod(B, annotation(g0=DeviceMemoryLimit(hard_limit=GIB))), cgroup=False)
    assert node.reconcile() == {
        A: [(other, "Pending", ML.REASON_DEVICE_NOT_FOUND)],
        B: [(G0, "Pending", ML.REASON_CGROUP_NOT_FOUND)],
    }
    assert node.sets() == 0


def test_limits_changed_behind_the_agents_back_are_restored_after_the_verify_interval(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    node.fake.memory_limits[G0][ns(A)] = (0, 40 * GIB)
    node.reconcile()
    assert node.held() == {ns(A): (0, 40 * GIB)}  # not read again yet
    node.now[0] += node.caps.verify_interval_s
    node.reconcile()  # read back: differs
    node.reconcile()  # and set again
    assert node.held() == {ns(A): (0, 20 * GIB)}


def test_no_sample_changes_nothing_and_keeps_the_last_entries(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    first = node.reconcile()
    assert node.caps.reconcile(None, node.pods, node.cgroups.get, cgroup_v2=True) is node.result
    assert first[A][0][1] == "Applied"


def test_held_limits_beyond_the_apis_byte_bound_are_reported_as_none():
    from vramguard_agent.limits_plan import LimitEntry
    from vramguard_api.units import MAX_BYTES

    entry = LimitEntry(G0, "Pending", ML.REASON_CLEARING, held=HeldLimits(MAX_BYTES + 1, MAX, MAX_BYTES + 1))
    assert (entry.hard_limit_bytes, entry.soft_limit_bytes, entry.current_used_bytes) == (None, None, None)
    api = LimitEntry(G0, "Applied", ML.REASON_APPLIED, held=HeldLimits(GIB, MAX_BYTES, 2 * GIB)).to_api()
    assert (api.hard_limit_bytes, api.soft_limit_bytes, api.current_used_bytes) == (MAX_BYTES, GIB, 2 * GIB)


def test_the_probe_reads_the_agents_own_pod_cgroup_else_its_process_cgroup(node):
    node.fake.cgroups = {"/sys/fs/cgroup/system.slice/agent.service"}
    node.caps.own_cgroup = "/system.slice/agent.service"
    node.reconcile()
    assert node.caps.support[G0].supported
    node.add(pod(B))
    node.caps.own_pod_uid, node.now[0] = B, node.now[0] + node.caps.probe_interval_s
    node.reconcile()  # B's cgroup is not one NVML knows here: the probe asked there
    assert node.caps.support[G0].reason == ML.REASON_PROBE_FAILED


def test_own_cgroup_of_a_process(tmp_path):
    from vramguard_agent.agent import own_cgroup

    f = tmp_path / "cgroup"
    f.write_text("0::/system.slice/vramguard-agent.service\n")
    assert own_cgroup(f) == "/system.slice/vramguard-agent.service"
    f.write_text("12:memory:/x\n0::/\n")  # hybrid: no single unified line
    assert own_cgroup(f) is None
    assert own_cgroup(tmp_path / "missing") is None


def test_a_device_that_answers_only_later_is_read_then_and_its_stale_limits_cleared(node):
    node.fake.memory_limits = {G0: {ns(A): (0, 30 * GIB)}}
    node.fake.gpus[0].memory_limits_error = pynvml.NVML_ERROR_UNKNOWN  # the probe fails at start
    node.add(pod(A))
    node.reconcile()
    assert not node.caps.support[G0].supported and node.held() == {ns(A): (0, 30 * GIB)}
    node.fake.gpus[0].memory_limits_error = None
    node.now[0] += node.caps.probe_interval_s
    node.reconcile()
    assert node.held() == {}


def test_a_lost_gpu_keeps_what_it_holds_in_mind(node):
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    node.fake.gpus[0].lost = True
    assert node.reconcile() == {A: [(G0, "Pending", ML.REASON_DEVICE_NOT_FOUND)]}
    assert (A, G0) in node.caps.held
    node.fake.gpus[0].lost = False
    node.add(pod(A))  # the annotation went while the GPU was lost
    node.reconcile()
    assert node.held() == {}


def test_one_refusal_for_the_device_stops_the_other_pods_sets_in_that_pass(node):
    node.fake.privileged = False
    node.add(pod(A, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.add(pod(B, annotation(g0=DeviceMemoryLimit(hard_limit=20 * GIB))))
    node.reconcile()
    assert node.sets() == 1
    assert {e.state for p in node.result.values() for e in p.entries} == {"Unsupported"}
