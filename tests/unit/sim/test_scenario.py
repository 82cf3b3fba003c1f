"""Scenario files: memory profiles, windows, validation errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.unit.agent.builders import GIB, MIB
from vramguard_sim.scenario import Profile, Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("spec", "t", "value"),
    [
        ("2Gi", 1e6, 2 * GIB),
        ({"constant": "512Mi"}, 0, 512 * MIB),
        ({"linear": {"start": "1Gi", "perHour": "2Gi"}}, 1800, 2 * GIB),
        ({"linear": {"start": "1Gi", "perHour": "2Gi", "max": "2Gi"}}, 7200, 2 * GIB),
        ({"ramp": {"from": "1Gi", "to": "3Gi", "over": "10m", "after": "5m"}}, 300, GIB),
        ({"ramp": {"from": "1Gi", "to": "3Gi", "over": "10m", "after": "5m"}}, 600, 2 * GIB),
        ({"ramp": {"from": "1Gi", "to": "3Gi", "over": "10m"}}, 3600, 3 * GIB),
        ({"sawtooth": {"low": "1Gi", "high": "2Gi", "period": "1m"}}, 90, GIB + 512 * MIB),
        ({"steps": [{"at": "1m", "value": "2Gi"}, {"at": "0s", "value": "1Gi"}]}, 30, GIB),
        ({"steps": [{"at": "1m", "value": "2Gi"}, {"at": "0s", "value": "1Gi"}]}, 60, 2 * GIB),
        ({"sum": ["1Gi", {"linear": {"perHour": "1Gi"}}]}, 3600, 2 * GIB),
    ],
)
def test_profiles(spec, t, value):
    assert Profile.parse(spec).at(t) == value


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("12Zi", "memory: invalid quantity"),
        ({"wobble": {}}, "unknown profile 'wobble'"),
        ({"constant": "1Gi", "linear": {}}, "one profile kind"),
        ({"sawtooth": {"low": "1Gi", "high": "2Gi", "period": "soon"}}, "memory.sawtooth.period: invalid duration"),
    ],
)
def test_bad_profiles_name_the_field(spec, message):
    with pytest.raises(ValueError, match=message):
        Profile.parse(spec)


def _node(**extra):
    node = {"name": "n", "gpus": [{"model": "X", "memory": "16Gi"}]}
    node.update(extra)
    return {"nodes": [node]}


def test_process_on_a_missing_gpu_is_refused():
    pods = [{"namespace": "a", "name": "b", "containers": [{"name": "c", "processes": [{"gpu": 3, "memory": "1Gi"}]}]}]
    with pytest.raises(ValidationError, match="gpu 3 does not exist"):
        Scenario.model_validate(_node(pods=pods))


def test_mig_index_must_match_the_gpu():
    pods = [
        {
            "namespace": "a",
            "name": "b",
            "containers": [{"name": "c", "processes": [{"gpu": 0, "mig": 0, "memory": "1Gi"}]}],
        }
    ]
    with pytest.raises(ValidationError, match="does not match"):
        Scenario.model_validate(_node(pods=pods))


def test_fault_windows():
    scenario = Scenario.model_validate(_node(faults=[{"type": "gpu-lost", "gpu": 0, "from": "1m", "until": "2m"}]))
    node = scenario.node("n")
    assert [len(node.faults_at(t)) for t in (59, 60, 119, 120)] == [0, 1, 1, 0]
    with pytest.raises(KeyError, match="nodes: n"):
        scenario.node("other")


def test_unknown_fault_type_is_refused():
    with pytest.raises(ValidationError, match="type"):
        Scenario.model_validate(_node(faults=[{"type": "meteor"}]))


def test_the_demo_scenario_loads_with_its_three_nodes():
    scenario = load_scenario(ROOT / "examples" / "scenarios" / "demo.yaml")
    assert [n.name for n in scenario.nodes] == ["gpu-h100-ts", "gpu-a100-mig", "gpu-a10-vgpu"]
    h100 = scenario.node("gpu-h100-ts").gpu_list()
    assert len(h100) == 8 and h100[0].memory == 81559 * MIB
    a10 = scenario.node("gpu-a10-vgpu").gpus[0]
    assert a10.memory == 23028 * MIB and a10.reserved > 0 and a10.virtualization == "VGPU"
    assert scenario.node("gpu-a100-mig").gpus[0].mig is not None
