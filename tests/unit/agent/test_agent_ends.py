"""End records through the agent's loop: a process killed by the simulated driver's
out-of-memory is written at once, carried until the operator acknowledges it, taken
back after an agent restart (the real kubernetes client against a scripted API server)."""

from __future__ import annotations

from kubernetes import client

from vramguard_agent.agent import Agent, AgentConfig, Components
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.reporter import Reporter
from vramguard_agent.sampler import Sampler
from vramguard_api.ends import ACK_ANNOTATION
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import SimBackend

from .stubapi import StubAPI
from .test_agent import offsets, patches, stub  # noqa: F401 - the fixture

NODE = "/nodegpuusages/n1"


def scenario():
    grow = {"linear": {"start": "4Gi", "perHour": "36000Gi"}}  # +10 GiB a second: fills the A10 at once
    return Scenario.model_validate({"nodes": [{
        "name": "n1",
        "gpus": [{"model": "NVIDIA A10", "memory": "23028Mi"}],
        "pods": [
            {"namespace": "ml", "name": "steady", "containers": [
                {"name": "c", "ram": "1Gi", "processes": [{"gpu": 0, "memory": "8Gi"}]}]},
            {"namespace": "ml", "name": "greedy", "containers": [
                {"name": "c", "ram": "1Gi", "processes": [{"gpu": 0, "memory": grow}]}]},
        ],
    }]}).node("n1")


def make(api: StubAPI, tmp_path, now: list[float]) -> Agent:
    backend = SimBackend(scenario(), host_root=tmp_path, clock=lambda: now[0])
    sampler = Sampler(
        backend, proc_root=tmp_path / "proc", memory=CgroupMemoryReader(tmp_path / "cgroup", clock=lambda: now[0]),
        pods=backend.pod_metas, container_names=backend.container_names, wall_clock=lambda: 1_700_000_000 + now[0],
    )
    reporter = Reporter(client.CustomObjectsApi(api.api_client()), "n1", clock=lambda: now[0], jitter=0.0)
    cfg = AgentConfig(node_name="n1", backend="sim", metrics_address=None)
    return Agent(cfg, Components(sampler, backend, reporter=reporter), clock=lambda: now[0])


def written_ends(api: StubAPI) -> list[list[dict]]:
    return [q.body["status"].get("ends", []) for q in patches(api)]


def test_an_oom_killed_process_is_written_at_once_and_kept_as_recent_once_acknowledged(stub, tmp_path):  # noqa: F811
    now = [0.0]
    agent = make(stub, tmp_path, now)
    for t in (0.0, 1.0, 2.0):  # at 2 s greedy outgrew the device: the simulated driver killed it
        now[0] = t
        agent.step()
    ends = written_ends(stub)[-1]
    assert [(e["name"], e["kind"]) for e in ends] == [("greedy", "ProcessExit")]
    (device,) = ends[0]["devices"]
    assert [n["name"] for n in device["neighbours"]] == ["steady"]
    assert device["podBytes"] == 14 << 30 and device["freeBytes"] < 10 << 30
    assert offsets(stub)[-1] == 2  # written at once
    # The operator acknowledges: the answer to the next write carries the annotation.
    last = ends[0]["id"]
    stub.respond("PATCH", NODE + "/status", (200, {"metadata": {"annotations": {ACK_ANNOTATION: str(last)}}}))
    now[0] = 20.0
    agent.step()  # greedy restarted (a change): written, still carrying the record; the answer acknowledges it
    assert written_ends(stub)[-1] == ends
    assert not agent.parts.sampler.ends.ring  # nothing waits: the record stays only as a recent one
    now[0] = 30.0
    agent.step()  # killed again: the new record is written after the recent one
    assert [e["id"] > last for e in written_ends(stub)[-1]] == [False, True]


def test_a_restarted_agent_takes_back_the_unacknowledged_records(stub, tmp_path):  # noqa: F811
    now = [0.0]
    first = make(stub, tmp_path / "a", now)
    for t in (0.0, 1.0, 2.0):
        now[0] = t
        first.step()
    ends = written_ends(stub)[-1]
    assert ends
    # The API server still holds them: the first write of the new agent leaves them there and gets them back.
    stub.respond("PATCH", NODE + "/status", (200, {"metadata": {"annotations": {}}, "status": {"ends": ends}}))
    now[0] = 0.0
    second = make(stub, tmp_path / "b", now)
    second.step()
    assert "ends" not in patches(stub)[-1].body["status"]
    now[0] = 30.0
    second.step()
    assert [e["id"] for e in written_ends(stub)[-1]][: len(ends)] == [e["id"] for e in ends]
