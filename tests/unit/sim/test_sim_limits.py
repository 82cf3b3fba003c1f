"""The simulated driver enforces the memory limits the agent sets through the fake
NVML: an allocation above a pod's hard limit fails in that pod only, under
pressure the pod furthest above its soft limit goes first, a hard limit below
the pod's use is not applied (dmem), and the limits outlive an agent restart
with a driver-state file."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.unit.agent.builders import GIB
from vramguard_agent.agent import Components
from vramguard_agent.caps import CapEnforcer
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.nvml_limits import NVMLMemoryLimits
from vramguard_agent.sampler import Sampler
from vramguard_api.memlimits import DeviceMemoryLimit, format_memory_limits
from vramguard_api.usage import NodeGPUUsageStatus
from vramguard_sim.gpumem import REASON_HARD_LIMIT, REASON_SOFT_LIMIT
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import FIRST_PID, SimBackend, gpu_uuid
from vramguard_sim.simcgroups import DriverState

UUID = gpu_uuid("n1", 0)


def node(grower: Any, neighbour: Any, memory: str = "81559Mi") -> Any:
    pods = [
        {"namespace": "ml", "name": "grower", "containers": [{"name": "main", "processes": [{"gpu": 0, "memory": grower}]}]},
        {"namespace": "ml", "name": "neighbour",
         "containers": [{"name": "main", "processes": [{"gpu": 0, "memory": neighbour}]}]},
    ]
    gpus = [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": memory, "reserved": "0"}]
    spec = {"nodes": [{"name": "n1", "driverVersion": "615.12.03", "gpus": gpus, "pods": pods}]}
    return Scenario.model_validate(spec).node("n1")


class Agent:
    """The agent's parts (sampler, memory-limit enforcer) over a simulated node whose pods carry
    the given annotations (``wants``: pod name -> limits), at the time in ``now``."""

    def __init__(self, tmp_path: Path, sim_node: Any, wants: dict[str, DeviceMemoryLimit], state: Path | None = None):
        self.now = [0.0]
        self.calls: list[tuple[str, str]] = []
        self.backend = SimBackend(sim_node, host_root=tmp_path / "host", clock=lambda: self.now[0], driver_state=state)
        self.wants = wants
        caps = CapEnforcer(NVMLMemoryLimits(self.backend.nvml.library), enforce=True,
                           on_operation=lambda op, result: self.calls.append((op, result)))
        sampler = Sampler(
            self.backend, proc_root=tmp_path / "host" / "proc", memory=CgroupMemoryReader(tmp_path / "host" / "cgroup"),
            pods=self._pods, container_names=self.backend.container_names, cgroups_needed=caps.cgroups_needed,
        )  # fmt: skip
        self.parts = Components(sampler, self.backend, caps)

    def _pods(self) -> dict[str, Any]:
        return {
            u: replace(m, memory_limits=format_memory_limits({UUID: self.wants[m.name]})) if m.name in self.wants else m
            for u, m in self.backend.pod_metas().items()
        }

    def at(self, t: float) -> dict[str, Any]:
        """The agent's step at scenario time ``t``: pod name -> its report entry."""
        self.now[0] = t
        status = NodeGPUUsageStatus.model_validate(self.parts.tick().status.to_api())
        return {p.name: p for p in status.pods}

    def sets(self) -> int:
        return sum(1 for op, result in self.calls if op == "set" and result == "ok")


def steps(*values: tuple[str, str]) -> dict[str, Any]:
    return {"steps": [{"at": at, "value": v} for at, v in values]}


def test_an_allocation_above_the_hard_limit_fails_in_that_pod_only(tmp_path):
    agent = Agent(tmp_path, node(steps(("0s", "4Gi"), ("1m", "8Gi")), "20Gi"), {"grower": DeviceMemoryLimit(0, 6 * GIB)})
    pods = agent.at(0)  # the limit is set during this step ...
    (limit,) = pods["grower"].memory_limits
    assert (limit.state, limit.hard_limit_bytes, limit.current_used_bytes) == ("Applied", 6 * GIB, 4 * GIB)
    pods = agent.at(60)  # ... and enforced when the pod asks for 8Gi: 72Gi are free, the limit says no
    (kill,) = agent.backend.oom_kills
    assert (kill.pod, kill.kill.reason, kill.kill.requested_bytes) == ("grower", REASON_HARD_LIMIT, 4 * GIB)
    assert "at its pod's hard limit" in kill.message()
    assert pods["grower"].vram_bytes == 0 and pods["neighbour"].vram_bytes == 20 * GIB
    pods = agent.at(70)  # restarted after the back-off: its profile from the start, under the limit
    assert pods["grower"].vram_bytes == 4 * GIB and len(agent.backend.oom_kills) == 1


def test_under_pressure_the_pod_furthest_above_its_soft_limit_goes_first(tmp_path):
    # a 10Gi GPU: the grower (soft 3Gi) holds 6Gi; the neighbour (soft 5Gi) asks for 5Gi with 4Gi free
    sim = node(steps(("0s", "6Gi")), steps(("0s", "0"), ("1m", "5Gi")), memory="10Gi")
    wants = {"grower": DeviceMemoryLimit(3 * GIB, None), "neighbour": DeviceMemoryLimit(5 * GIB, None)}
    agent = Agent(tmp_path, sim, wants)
    agent.at(0)
    pods = agent.at(60)
    (kill,) = agent.backend.oom_kills
    assert (kill.pod, kill.kill.reason) == ("grower", REASON_SOFT_LIMIT) and "soft limit" in kill.message()
    assert pods["neighbour"].vram_bytes == 5 * GIB


def test_without_soft_limits_the_allocating_neighbour_dies_as_before(tmp_path):
    sim = node(steps(("0s", "6Gi")), steps(("0s", "0"), ("1m", "5Gi")), memory="10Gi")
    agent = Agent(tmp_path, sim, {})
    agent.at(0)
    agent.at(60)
    assert [(k.pod, k.kill.reason) for k in agent.backend.oom_kills] == [("neighbour", "device-full")]


def test_a_hard_limit_below_the_pods_use_is_not_applied_until_it_frees_memory(tmp_path):
    agent = Agent(tmp_path, node(steps(("0s", "8Gi"), ("1m", "4Gi")), "1Gi"), {"grower": DeviceMemoryLimit(0, 6 * GIB)})
    (limit,) = agent.at(0)["grower"].memory_limits
    assert (limit.state, limit.reason, limit.hard_limit_bytes) == ("Failed", "NotHeld", None)
    assert not agent.backend.oom_kills  # nothing bites while the driver holds no limit
    (limit,) = agent.at(60)["grower"].memory_limits  # 4Gi now: the retry takes
    assert (limit.state, limit.hard_limit_bytes) == ("Applied", 6 * GIB)


def test_a_restarted_agent_finds_the_limits_the_driver_kept(tmp_path):
    state = tmp_path / "driver.json"
    sim: Callable[[], Any] = lambda: node("4Gi", "2Gi")  # noqa: E731
    first = Agent(tmp_path / "a", sim(), {"grower": DeviceMemoryLimit(GIB, 6 * GIB)}, state)
    assert first.at(0)["grower"].memory_limits[0].state == "Applied" and first.sets() == 1
    first.backend.close()
    saved = json.loads(state.read_text())
    assert [list(v.values())[0] for v in saved.values()] == [[GIB, 6 * GIB]]
    second = Agent(tmp_path / "a", sim(), {"grower": DeviceMemoryLimit(GIB, 6 * GIB)}, state)
    (limit,) = second.at(5)["grower"].memory_limits
    assert (limit.state, limit.hard_limit_bytes) == ("Applied", 6 * GIB)
    assert second.sets() == 0  # read back as held: neither lost nor set twice
    second.wants = {}  # the annotation went while the agent was down: cleared
    assert second.at(10)["grower"].memory_limits is None
    second.at(15)  # saved at the next sample (and at close)
    assert json.loads(state.read_text()) in ({}, {UUID: {}})


def test_a_driver_state_that_is_no_limits_json_is_refused_naming_the_file(tmp_path):
    bad = tmp_path / "driver.json"
    bad.write_text('{"GPU-1": 7}')
    with pytest.raises(ValueError, match="sim driver state .*driver.json: not limits JSON"):
        DriverState(bad).load()


def test_the_fake_counts_a_pods_processes_for_current_used(tmp_path):
    agent = Agent(tmp_path, node("4Gi", "2Gi"), {"neighbour": DeviceMemoryLimit(GIB, None)})
    (limit,) = agent.at(0)["neighbour"].memory_limits
    assert limit.current_used_bytes == 2 * GIB
    assert set(agent.backend.fake.pid_cgroups) == {FIRST_PID, FIRST_PID + 1}
