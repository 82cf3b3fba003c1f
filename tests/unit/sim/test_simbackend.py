"""The simulated backend: identities, the fake host it writes, and faults over time."""

from __future__ import annotations

import hashlib

import pytest

from tests.unit.agent.builders import GIB, MIB
from vramguard_agent.cgroups import Attribution, attribute_pid
from vramguard_agent.gpu import BackendUnavailable
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.pods import PodMeta
from vramguard_sim.scenario import Profile, Scenario
from vramguard_sim.simbackend import FIRST_PID, FakeHost, SimBackend, assign_pids, resolve


def scenario(cgroup=None, faults=(), mig=False, **pod_extra):
    gpu = {"model": "NVIDIA H100 80GB HBM3", "count": 2, "memory": "81559Mi", "reserved": "579Mi"}
    process = {"gpu": 1, "memory": {"linear": {"start": "1Gi", "perHour": "1Gi"}}}
    host = {"cgroup": "/user.slice/session-1.scope", "gpu": 0, "memory": "300Mi", "pid": 777}
    if mig:
        gpu = {
            "model": "NVIDIA A100-SXM4-40GB",
            "memory": "40960Mi",
            "reserved": "570Mi",
            "mig": [{"profile": "3g.20gb", "memory": "19968Mi"}, {"profile": "1g.5gb", "memory": "4864Mi"}],
        }
        process = {"gpu": 0, "mig": 1, "memory": "1Gi"}
        host["mig"] = 0
    pod = {
        "namespace": "ns",
        "name": "trainer",
        "containers": [
            {"name": "main", "ram": "2Gi", "pageCache": "1Gi", "oomKills": 2, "processes": [process]},
            {"name": "side", "ram": "100Mi"},
        ],
        **pod_extra,
    }
    node = {
        "name": "n1",
        "cgroup": cgroup or {},
        "gpus": [gpu],
        "pods": [pod],
        "hostProcesses": [host],
        "faults": list(faults),
    }
    return Scenario.model_validate({"nodes": [node]}).node("n1")


def test_pids_are_assigned_in_order_skipping_explicit_ones():
    node = scenario()
    assert sorted(assign_pids(node)) == [777, FIRST_PID]


def test_identities_come_from_the_api_when_the_pod_is_there():
    node = scenario()
    derived = resolve(node, {})[("ns", "trainer")]
    assert derived.uid == resolve(node, {})[("ns", "trainer")].uid  # stable
    assert derived.containers["main"] == hashlib.sha256(f"{derived.uid}/main".encode()).hexdigest()
    api = {"u-1": PodMeta("u-1", "ns", "trainer", containers={"f" * 64: "main"})}
    real = resolve(node, api)[("ns", "trainer")]
    assert real.uid == real.cgroup_uid == "u-1"
    assert real.containers["main"] == "f" * 64
    assert real.containers["side"] == hashlib.sha256(b"u-1/side").hexdigest()


def test_static_pods_use_the_config_hash():
    node = scenario(static=True)
    identity = resolve(node, {})[("ns", "trainer")]
    assert identity.cgroup_uid == hashlib.md5(b"ns/trainer").hexdigest()
    mirror = {"u-2": PodMeta("u-2", "ns", "trainer", config_hash="c" * 32)}
    assert resolve(node, mirror)[("ns", "trainer")].cgroup_uid == "c" * 32


@pytest.mark.parametrize(
    "cgroup",
    [
        {"version": 2, "driver": "systemd", "runtime": "containerd"},
        {"version": 1, "driver": "cgroupfs", "runtime": "containerd"},
        {"version": 2, "driver": "systemd", "runtime": "cri-o"},
        {"version": 1, "driver": "systemd", "runtime": "docker"},
    ],
)
def test_fake_host_reads_back_through_the_real_readers(tmp_path, cgroup):
    node = scenario(cgroup=cgroup, qos="besteffort")
    identities = resolve(node, {})
    identity = identities[("ns", "trainer")]
    host = FakeHost(tmp_path, node)
    host.write(identities, assign_pids(node), t=0.0)
    found = attribute_pid(FIRST_PID, host.proc_root)
    assert isinstance(found, Attribution)
    assert (found.pod_uid, found.container_id, found.qos) == (identity.uid, identity.containers["main"], "besteffort")
    assert found.runtime == ("unknown" if cgroup["driver"] == "cgroupfs" else cgroup["runtime"])
    assert not isinstance(attribute_pid(777, host.proc_root), Attribution)
    memory = CgroupMemoryReader(host.cgroup_root).read({identity.uid: set()})[identity.uid]
    assert memory.pod.working_set_bytes == 2 * GIB + 100 * MIB
    assert memory.containers[identity.containers["main"]].working_set_bytes == 2 * GIB
    assert memory.containers[identity.containers["main"]].oom_kills == 2
    assert memory.pod.oom_kills == 2


def test_backend_plays_memory_over_time_through_nvml():
    now = [0.0]
    backend = SimBackend(scenario(), clock=lambda: now[0])
    d0, d1 = backend.sample().devices
    assert [(p.pid, p.used_bytes) for p in d1.processes] == [(FIRST_PID, GIB)]
    assert [(p.pid, p.used_bytes) for p in d0.processes] == [(777, 300 * MIB)]
    now[0] = 1800.0
    assert backend.sample().devices[1].processes[0].used_bytes == GIB + 512 * MIB
    assert backend.sample().devices[1].memory.used == GIB + 512 * MIB  # v2 used: processes only


def test_processes_start_and_stop_with_their_window():
    node = scenario()
    node.pods[0].containers[0].processes[0].start = 60.0
    node.pods[0].containers[0].processes[0].until = 120.0
    now = [0.0]
    backend = SimBackend(node, clock=lambda: now[0])
    seen = []
    for t in (0.0, 60.0, 119.0, 120.0):
        now[0] = t
        seen.append(len(backend.sample().devices[1].processes))
    assert seen == [0, 1, 1, 0]


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ({"type": "gpu-lost", "gpu": 1}, lambda s: s.devices[1].health == "Lost" and s.devices[0].health == "Healthy"),
        ({"type": "not-available"}, lambda s: s.devices[1].processes[0].used_bytes is None),
        (
            {"type": "hide-processes", "gpu": 1},
            lambda s: s.devices[1].processes == [] and s.devices[1].memory.used >= GIB,
        ),
    ],
)
def test_gpu_faults_apply_inside_their_window(fault, check):
    now = [0.0]
    backend = SimBackend(scenario(faults=[{**fault, "from": "1m", "until": "2m"}]), clock=lambda: now[0])
    assert not check(backend.sample())
    now[0] = 90.0
    assert check(backend.sample())
    now[0] = 150.0
    assert not check(backend.sample())


def test_nvml_unavailable_fault_and_recovery():
    now = [0.0]
    backend = SimBackend(
        scenario(faults=[{"type": "nvml-unavailable", "from": "1m", "until": "2m"}]), clock=lambda: now[0]
    )
    backend.sample()
    now[0] = 61.0
    with pytest.raises(BackendUnavailable):
        backend.sample()
    now[0] = 121.0
    assert len(backend.sample().devices) == 2


def test_no_v3_fault_uses_the_v2_functions():
    backend = SimBackend(scenario(faults=[{"type": "no-v3"}]))
    assert backend.sample().devices[1].processes[0].pid == FIRST_PID
    assert backend.fake.calls.get("nvmlDeviceGetComputeRunningProcesses_v2", 0) >= 2


def test_mig_faults_degrade_the_instance_only():
    faults = [{"type": "mig-listing-not-supported", "mig": 1}, {"type": "mig-parent-no-permission"}]
    sample = SimBackend(scenario(mig=True, faults=faults)).sample()
    parent, big, small = sample.devices
    assert (big.mig_profile, [p.pid for p in big.processes]) == ("3g.20gb", [777])
    assert small.processes is None and "NoPermission" in small.process_error
    sample = SimBackend(scenario(mig=True, faults=faults[:1])).sample()  # privileged parent
    assert [p.pid for p in sample.devices[2].processes] == [FIRST_PID]


def test_pod_metas_stand_in_for_the_api():
    backend = SimBackend(scenario())
    (meta,) = backend.pod_metas().values()
    assert (meta.namespace, meta.name, meta.gpu, sorted(meta.containers.values())) == (
        "ns",
        "trainer",
        True,
        ["main", "side"],
    )
    assert set(backend.container_names().values()) == {"main", "side"}


def test_speed_plays_scenario_time_faster_than_the_clock():
    now = [0.0]
    backend = SimBackend(scenario(), clock=lambda: now[0], offset_s=600.0, speed=60.0)
    assert backend.now() == 600.0
    now[0] = 30.0  # half a minute of clock is half an hour of scenario
    assert backend.now() == 600.0 + 1800.0
    # linear 1Gi + 1Gi/h, at scenario time 40 min
    assert backend.sample().devices[1].processes[0].used_bytes == GIB + GIB * 2400 // 3600


@pytest.mark.parametrize("speed", [0.0, -1.0, float("inf"), float("nan")])
def test_speed_must_be_a_positive_number(speed):
    with pytest.raises(ValueError, match="sim speed"):
        SimBackend(scenario(), speed=speed)


def crowded(restart_policy="Always"):
    """Two pods on one 10Gi GPU: a steady server and a neighbour that grows past what is left."""
    gpu = {"model": "NVIDIA T4", "memory": "10Gi", "reserved": "1Gi"}
    server = {
        "namespace": "serving",
        "name": "chat",
        "containers": [{"name": "server", "processes": [{"gpu": 0, "memory": {"steps": [
            {"at": "0s", "value": "2Gi"}, {"at": "2m", "value": "4Gi"}]}}]}],
    }
    grower = {
        "namespace": "training",
        "name": "finetune",
        "restartPolicy": restart_policy,
        "containers": [
            {"name": "trainer", "processes": [{"gpu": 0, "memory": {"linear": {"start": "2Gi", "perHour": "6Gi"}}}]}
        ],
    }
    node = {"name": "n1", "gpus": [gpu], "pods": [server, grower]}
    return Scenario.model_validate({"nodes": [node]}).node("n1")


def held(backend):
    return {p.pid: p.used_bytes for p in backend.sample().devices[0].processes}


def test_what_does_not_fit_kills_the_process_that_allocates_and_frees_its_memory(caplog):
    now = [0.0]
    backend = SimBackend(crowded(), clock=lambda: now[0])
    server, grower = FIRST_PID, FIRST_PID + 1
    assert held(backend) == {server: 2 * GIB, grower: 2 * GIB}
    now[0] = 3600.0  # the grower wants 8Gi: 4Gi + 8Gi > 9Gi usable, so it dies
    assert held(backend) == {server: 4 * GIB}
    (kill,) = backend.oom_kills
    assert (kill.namespace, kill.pod, kill.container, kill.kill.pid) == ("training", "finetune", "trainer", grower)
    assert kill.restart_at_s == 3610.0  # CrashLoopBackOff: 10 s
    assert "pod training/finetune container trainer" in caplog.text and "CUDA out of memory" in caplog.text
    now[0] = 3610.0  # restarted: its profile plays from the beginning (2Gi)
    assert held(backend) == {server: 4 * GIB, grower: 2 * GIB}


def test_the_neighbour_that_stayed_put_dies_when_its_own_allocation_no_longer_fits():
    now = [0.0]
    node = crowded()
    node.pods[1].containers[0].processes[0].memory = Profile.parse("6Gi")  # holds 6 of 9 usable
    backend = SimBackend(node, clock=lambda: now[0])
    assert sum(held(backend).values()) == 8 * GIB
    now[0] = 130.0  # the server asks for 2Gi more with 1Gi free: the server dies
    assert held(backend) == {FIRST_PID + 1: 6 * GIB}
    assert [k.pod for k in backend.oom_kills] == ["chat"]


def test_restart_policy_never_leaves_the_container_down():
    now = [0.0]
    backend = SimBackend(crowded("Never"), clock=lambda: now[0])
    held(backend)
    now[0] = 3600.0
    held(backend)
    (kill,) = backend.oom_kills
    assert kill.restart_at_s is None and "the pod fails" in kill.message()
    now[0] = 7200.0
    assert FIRST_PID + 1 not in held(backend)


def test_a_pod_deleted_from_the_api_stops_and_frees_its_memory():
    """As the kubelet does: once the API has shown a pod and no longer does
    (an eviction), its containers stop for good; a pod not shown yet (the
    watch not synced) keeps running."""
    now = [0.0]
    metas = {
        f"uid-{n}": PodMeta(uid=f"uid-{n}", namespace=ns, name=n, gpu=True)
        for ns, n in (("serving", "chat"), ("training", "finetune"))
    }
    api = {}
    backend = SimBackend(crowded(), api_pods=lambda: api, clock=lambda: now[0])
    server, grower = FIRST_PID, FIRST_PID + 1
    assert held(backend) == {server: 2 * GIB, grower: 2 * GIB}  # nothing shown yet: both run
    api.update(metas)
    assert held(backend) == {server: 2 * GIB, grower: 2 * GIB}
    del api["uid-finetune"]  # evicted: gone from the API
    now[0] = 3600.0  # it would want 8Gi and die; it is gone, and the server grows into its memory
    assert held(backend) == {server: 4 * GIB}
    assert not backend.oom_kills
    now[0] = 7200.0
    assert held(backend) == {server: 4 * GIB}  # never restarted


def test_a_new_pod_under_a_deleted_pods_name_starts_afresh():
    """A StatefulSet's pod, or one re-created: the name is listed again, and
    its containers start again with their profiles from the beginning."""
    now = [0.0]
    chat = PodMeta(uid="uid-chat", namespace="serving", name="chat", gpu=True)
    api = {"uid-chat": chat}
    backend = SimBackend(crowded(), api_pods=lambda: api, clock=lambda: now[0])
    server, grower = FIRST_PID, FIRST_PID + 1
    assert held(backend) == {server: 2 * GIB, grower: 2 * GIB}
    del api["uid-chat"]
    now[0] = 600.0
    assert held(backend) == {grower: 3 * GIB}  # deleted: stopped, its memory freed
    now[0] = 1200.0
    assert held(backend) == {grower: 4 * GIB}  # still gone
    api["uid-chat-2"] = PodMeta(uid="uid-chat-2", namespace="serving", name="chat", gpu=True)
    now[0] = 1260.0
    sample = held(backend)
    assert sample[server] == 2 * GIB  # its profile from the beginning (4Gi from minute 2), not where it was
    now[0] = 1400.0
    assert held(backend)[server] == 4 * GIB
