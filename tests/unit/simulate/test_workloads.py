"""Workload kinds, the mix and node kinds: what they want, how they parse."""

from __future__ import annotations

import pytest

from vramguard_sim.simulate.nodes import NODE_KINDS, SimNode, parse_nodes
from vramguard_sim.simulate.workloads import KINDS, Shape, generate, parse_mix

MIB = 1 << 20


def test_mix_proportions_are_normalised_and_bad_ones_named():
    assert parse_mix("training=3,batch=1") == {**dict.fromkeys(KINDS, 0.0), "training": 0.75, "batch": 0.25}
    with pytest.raises(ValueError, match="--mix: training='-1' is not a proportion"):
        parse_mix("training=-1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("20", {"time-slicing": 20}), ("mps=2, mig=1", {"mps": 2, "mig": 1}), ("vgpu=1,vgpu=2", {"vgpu": 3})],
)
def test_nodes(text, expected):
    assert parse_nodes(text) == expected


@pytest.mark.parametrize("bad", ["time-slicing=x", "tpu=1", "mig=0", ""])
def test_bad_nodes_are_named(bad):
    with pytest.raises(ValueError, match="--nodes"):
        parse_nodes(bad)


@pytest.mark.parametrize(
    ("kind", "share_mib"),
    [
        ("time-slicing", (81559 - 579) // 4),  # usable / replicas
        ("mps", (81559 - 579) // 4),
        ("mig", 40192),  # the MIG profile's memory (GFD label)
        ("vgpu", (23028 - 1536) // 2),  # the vGPU's usable memory, not its nominal size
    ],
)
def test_each_node_kinds_share_comes_from_the_policy_code(kind, share_mib):
    node = SimNode(NODE_KINDS[kind], "n")
    assert abs(node.gpus[0].share_bytes - share_mib * MIB) < MIB


def test_what_each_kind_wants_relative_to_its_share():
    training = Shape("training", 0.5, high=0.9, period_s=100.0)
    assert max(training.wants(t) for t in range(0, 1000, 7)) <= 0.9  # a sawtooth within its share
    finetune = Shape("finetune", 0.5, high=2.0, period_s=60.0, ramp_s=600.0)
    assert finetune.wants(0) < 1.0 < finetune.wants(3600)  # grows over its share
    assert finetune.growth_bytes_per_hour(0, 100) == pytest.approx(1.5 / 600 * 3600 * 100)
    leak = Shape("leaking-inference", 0.4, growth_per_h=0.1)
    assert leak.wants(36000) - leak.wants(0) == pytest.approx(1.0, abs=0.03)
    batch = Shape("batch", 0.3, high=1.2, period_s=600.0, burst_s=60.0, phase_s=0.0)
    assert {batch.wants(30), batch.wants(300)} == {1.2, 0.3}


def test_the_mix_is_drawn_from_the_seed_alone():
    mix = parse_mix("training=1,inference=1,leaking-inference=1,finetune=1,batch=1")
    a, b = generate(5, mix, 128, 4.0, 0.9), generate(5, mix, 128, 4.0, 0.9)
    assert a == b and a != generate(6, mix, 128, 4.0, 0.9)
    started = [w for w in a if w.arrival_s < 1800 and w.is_job and w.done_s > 0]
    assert started  # the fleet starts full, jobs part-way through
    pods = sum(w.replicas for w in a if w.done_s > 0 or not w.is_job)
    assert pods == pytest.approx(0.9 * 128, abs=5)
