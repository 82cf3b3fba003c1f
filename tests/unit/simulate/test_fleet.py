"""The simulated fleet's mechanics: what a driver, the kubelet and the workload
controllers do. Small hand-made fleets, a few ticks each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vramguard_operator.engine.types import ContainerFacts
from vramguard_sim.simulate.fleet import Fleet, OOMRecord
from vramguard_sim.simulate.nodes import NodeKind, SimNode
from vramguard_sim.simulate.workloads import Shape, WorkloadSpec

GIB = 1 << 30
TICK = 10.0


def node(gpus=1, replicas=2, memory=10 * GIB):
    """One node of ``gpus`` devices of ``memory`` bytes (nothing reserved), shared ``replicas`` ways."""
    kind = NodeKind("test", "Test GPU", "Test-GPU", gpus, memory, replicas=replicas, sharing="time-slicing")
    return SimNode(kind, "n0")


def steady(name, fraction, **kw):
    """A Job that wants a constant ``fraction`` of its share (a batch shape without bursts)."""
    shape = Shape("batch", fraction, high=fraction, period_s=1e9, burst_s=0.0)
    return WorkloadSpec(name, "batch", 0.0, shape, work_s=kw.pop("work_s", 1e9), **kw)


def fleet(*workloads, **node_kw):
    return Fleet([node(**node_kw)], workloads, seed=1, tick_s=TICK)


def run(f, until):
    t = f._tick * TICK
    while t < until:
        t += TICK
        f.step(t)
    return t


def pod(f, name):
    (found,) = [p for p in f.pods.values() if p.spec.name == name]
    return found


def test_the_share_is_the_nodes_usable_memory_over_its_replicas():
    n = node(memory=10 * GIB, replicas=4)
    assert n.gpus[0].share_bytes == 10 * GIB // 4


def test_a_neighbour_within_its_share_dies_when_a_hog_took_the_memory():
    # share 5Gi: the sawtooth stays within it (0.5 -> 0.95); the fine-tune plateaus at 1.3 shares
    train = WorkloadSpec("train", "training", 0.0, Shape("training", 0.5, high=0.95, period_s=300.0), work_s=1e9)
    hog = WorkloadSpec("hog", "finetune", 0.0, Shape("finetune", 1.3, high=1.3, period_s=60.0, ramp_s=1.0),
                       work_s=1e9)
    f = fleet(train, hog)
    run(f, 600)
    victims = [o for o in f.ooms if o.pod.startswith("train")]
    assert victims, "the sawtooth's allocation should have failed"
    v = victims[0]
    assert v.within_share and v.wanted_bytes <= v.share_bytes == 5 * GIB
    assert v.requested_bytes > v.free_bytes  # it did not fit: that is why it died
    assert all(o.within_share is False for o in f.ooms if o.pod.startswith("hog"))


def test_an_allocation_that_does_not_fit_kills_only_the_allocating_process_and_frees_its_memory():
    a = steady("a", 1.2)  # 6Gi of 10
    b = replace(steady("b", 1.0), arrival_s=120.0)  # 5Gi: does not fit next to a
    f = fleet(a, b)
    t = 0.0
    while not f.ooms:
        t += TICK
        f.step(t)
    (kill,) = f.ooms
    assert kill.pod.startswith("b-") and kill.t_s == t
    dead, alive = pod(f, "b"), pod(f, "a")
    assert not dead.up and dead.down_until == t + 10.0  # CrashLoopBackOff: 10 s
    dev = f.nodes[0].gpus[0].device
    assert dev.holding(dead.pid) == 0 and dev.used_bytes == alive.held() == 6 * GIB
    f.step(t + TICK)
    assert dead.up and dead.restarts == 1  # restarted, warming up again


def test_memory_is_freed_when_a_job_completes():
    f = fleet(steady("short", 0.5, work_s=120.0))
    run(f, 200)
    assert f.jobs_completed == 1 and not f.pods
    assert f.nodes[0].gpus[0].device.used_bytes == 0


def test_an_evicted_pod_holds_its_memory_until_its_grace_period_ends_then_is_replaced():
    spec = replace(steady("svc", 0.8, work_s=None), grace_s=60.0)  # a Deployment of one replica
    f = fleet(spec, replicas=1)
    t = run(f, 120)
    victim = pod(f, "svc")
    held = victim.held()
    assert held > 0
    f.evict(victim, t)
    assert victim.terminating and victim.facts.terminating
    (replacement,) = [p for p in f.pending]  # created at once, waiting for the replica
    while t < 120 + 60 - TICK:
        t += TICK
        f.step(t)
        assert victim.held() >= held  # still running: its memory is not free
        assert replacement.gpu is None
    f.step(t + TICK)  # the grace period is over: killed, memory freed, the replica given to the replacement
    assert victim.gone and victim.held() == 0
    assert replacement.gpu is victim.gpu and replacement.up


def test_a_throttled_pod_works_and_grows_in_proportion_to_its_cpu():
    f = fleet(steady("slow", 0.5))
    run(f, TICK)
    p = pod(f, "slow")
    before = p.replica.progress_s
    p.set_facts(replace(p.facts, containers=(ContainerFacts("main", "500m", "500m"),)))  # spec: 4 CPUs
    assert p.speed == pytest.approx(0.125)
    run(f, TICK * 11)
    assert p.replica.progress_s - before == pytest.approx(10 * TICK * 0.125)


def test_a_job_fails_after_its_backoff_limit():
    a = steady("a", 1.6)  # 8Gi of 10, there first
    b = replace(steady("b", 1.0), backoff_limit=2, arrival_s=120.0)  # cannot ever fit
    f = fleet(a, b)
    run(f, 3600)
    assert f.jobs_failed == 1
    assert len([o for o in f.ooms if o.pod.startswith("b")]) == 3  # backoffLimit 2: the third failure fails it


def test_a_pod_disruption_budget_allows_one_replica_down():
    spec = replace(steady("svc", 0.3, work_s=None), replicas=2, pdb=True)
    f = fleet(spec, gpus=2, replicas=1)
    t = run(f, 60)
    first, second = sorted(f.pods.values(), key=lambda p: p.uid)
    assert f.disruption_allowed(first) and f.disruption_allowed(second)
    f.evict(first, t)
    assert not f.disruption_allowed(second)


def test_oom_record_within_share_counts_what_the_process_asked_for():
    base = dict(t_s=0.0, namespace="ns", pod="p", kind="training", node="n", device="GPU-0", free_bytes=0)
    assert OOMRecord(**base, held_bytes=4 * GIB, requested_bytes=GIB, share_bytes=5 * GIB).within_share
    assert not OOMRecord(**base, held_bytes=4 * GIB, requested_bytes=2 * GIB, share_bytes=5 * GIB).within_share
