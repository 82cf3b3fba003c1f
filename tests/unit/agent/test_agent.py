"""The run loop: steady-state write rate, writes on real changes, survival of failures."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from kubernetes import client

from vramguard_agent.agent import Agent, AgentConfig, Components
from vramguard_agent.gpu import GPUSample
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.reporter import Reporter
from vramguard_agent.sampler import Sampler
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import SimBackend

from .stubapi import StubAPI, status_body

STATUS = r"/nodegpuusages/n1/status"


def node(memory):
    return Scenario.model_validate(
        {
            "nodes": [
                {
                    "name": "n1",
                    "gpus": [{"model": "NVIDIA A10", "memory": "23028Mi"}],
                    "pods": [
                        {
                            "namespace": "ml",
                            "name": "p",
                            "containers": [{"name": "c", "ram": "1Gi", "processes": [{"gpu": 0, "memory": memory}]}],
                        }
                    ],
                }
            ]
        }
    ).node("n1")


@pytest.fixture
def stub():
    s = StubAPI()
    yield s
    s.close()


def make_agent(stub, tmp_path, memory, now):
    backend = SimBackend(node(memory), host_root=tmp_path, clock=lambda: now[0])
    sampler = Sampler(
        backend,
        proc_root=tmp_path / "proc",
        memory=CgroupMemoryReader(tmp_path / "cgroup", clock=lambda: now[0]),
        pods=backend.pod_metas,
        container_names=backend.container_names,
        wall_clock=lambda: 1_700_000_000 + now[0],
    )
    reporter = Reporter(client.CustomObjectsApi(stub.api_client()), "n1", clock=lambda: now[0], jitter=0.0)
    cfg = AgentConfig(node_name="n1", backend="sim", metrics_address=None)
    return Agent(cfg, Components(sampler, backend, reporter=reporter), clock=lambda: now[0])


def patches(stub):
    return [q for q in stub.requests if q.method == "PATCH"]


def offsets(stub) -> list[int]:
    """Sample times of the written reports, seconds since the fake clock's zero."""
    base = datetime.fromtimestamp(1_700_000_000, tz=UTC)
    return [int((datetime.fromisoformat(q.body["status"]["sampleTime"]) - base).total_seconds()) for q in patches(stub)]


def run_for(agent, now, seconds, interval=10.0):
    for step in range(int(seconds / interval)):
        now[0] = step * interval
        agent.step()


def test_steady_state_writes_once_per_heartbeat(stub, tmp_path):
    now = [0.0]
    agent = make_agent(stub, tmp_path, {"sawtooth": {"low": "8Gi", "high": "8100Mi", "period": "40s"}}, now)
    run_for(agent, now, 600)
    assert len(patches(stub)) == 20  # t = 0, 30, ..., 570


def test_a_move_beyond_the_dead_band_is_written_at_once(stub, tmp_path):
    now = [0.0]
    agent = make_agent(stub, tmp_path, {"steps": [{"at": "0s", "value": "8Gi"}, {"at": "45s", "value": "12Gi"}]}, now)
    run_for(agent, now, 120)
    # 0 s (first), 30 s (heartbeat), 50 s (the step), 80 s and 110 s (heartbeats)
    assert offsets(stub) == [0, 30, 50, 80, 110]


def test_api_outage_keeps_sampling_and_recovers(stub, tmp_path):
    stub.respond("PATCH", STATUS, *[(503, status_body(503, "ServiceUnavailable"))] * 3)
    now = [0.0]
    agent = make_agent(stub, tmp_path, "8Gi", now)
    run_for(agent, now, 100)
    # 0, 10 and 20 s fail (backoff 1, 2, 4 s); 30 s succeeds; then heartbeats
    assert offsets(stub) == [0, 10, 20, 30, 60, 90]
    assert agent.last_written_at == 90.0
    assert agent.metrics.writes.labels("error")._value.get() == 3


def test_a_failing_sample_does_not_stop_the_loop(stub, tmp_path):
    now = [0.0]
    agent = make_agent(stub, tmp_path, "8Gi", now)
    real = agent.parts.sampler.backend.sample
    calls = [0]

    def flaky() -> GPUSample:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("bug")
        return real()

    agent.parts.sampler.backend.sample = flaky  # type: ignore[method-assign]
    assert agent.step() is None
    assert agent.step() is not None
    assert agent.metrics.samples.labels("error")._value.get() == 1


def test_a_report_the_api_model_refuses_is_counted_and_the_loop_goes_on(stub, tmp_path):
    now = [0.0]
    agent = make_agent(stub, tmp_path, "8Gi", now)
    sampler = agent.parts.sampler
    real = sampler.report

    def overlong_uid(*args, **kwargs):
        result = real(*args, **kwargs)
        result.report.pods[0].uid = "x" * 100  # the API allows 64 characters
        return result

    sampler.report = overlong_uid  # type: ignore[method-assign]
    assert agent.step() is not None
    assert agent.metrics.writes.labels("error")._value.get() == 1 and not patches(stub)
    sampler.report = real  # type: ignore[method-assign]
    now[0] = 10.0
    agent.step()
    assert len(patches(stub)) == 1


def test_run_stops_on_the_event(stub, tmp_path):
    now = [0.0]
    agent = make_agent(stub, tmp_path, "8Gi", now)
    agent.cfg.sample_interval_s = 0.01
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and agent.health.sampled
