"""An agent that can read no GPU fails loudly: not ready, AgentHealthy False with the
reason in its report, a Warning Event once (and a Normal one when a device answers
again), healthyDevices 0 and its metric, and ``once`` exits 1."""

from __future__ import annotations

import re

from kubernetes import client

from vramguard_agent.agent import Agent, AgentConfig, Components
from vramguard_agent.gpu import BackendUnavailable, GPUSample
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.reporter import Reporter
from vramguard_agent.sampler import Sampler
from vramguard_sim.simbackend import SimBackend

from .stubapi import StubAPI
from .test_agent import STATUS, node

EVENTS = r"/api/v1/namespaces/default/events"


class FlakyBackend(SimBackend):
    """The simulated node, with NVML gone while ``down[0]`` is set (as on a node whose runtime class hides it)."""

    down = [True]

    def sample(self) -> GPUSample:
        if self.down[0]:
            raise BackendUnavailable("nvmlInit failed: NVMLError_LibraryNotFound: NVML Shared Library Not Found")
        return super().sample()


def make_agent(stub: StubAPI, tmp_path, now) -> Agent:
    backend = FlakyBackend(node("4Gi"), host_root=tmp_path, clock=lambda: now[0])
    sampler = Sampler(backend, proc_root=tmp_path / "proc",
                      memory=CgroupMemoryReader(tmp_path / "cgroup", clock=lambda: now[0]),
                      pods=backend.pod_metas, container_names=backend.container_names,
                      wall_clock=lambda: 1_700_000_000 + now[0])
    api = stub.api_client()
    reporter = Reporter(client.CustomObjectsApi(api), "n1", core_v1=client.CoreV1Api(api), clock=lambda: now[0],
                        jitter=0.0)
    return Agent(AgentConfig(node_name="n1", backend="sim", metrics_address=None),
                 Components(sampler, backend, reporter=reporter), clock=lambda: now[0])


def test_no_readable_device_fails_readiness_reports_why_and_explains_it_once(tmp_path):
    stub, now = StubAPI(), [0.0]
    FlakyBackend.down[0] = True
    try:
        agent = make_agent(stub, tmp_path, now)
        for step in range(3):  # a write per heartbeat at most; the Event only once
            now[0] = step * 60.0
            agent.step()
        ok, message = agent.health.ready()
        assert not ok and message.startswith("no GPU device can be read: NVMLUnavailable: nvmlInit failed")
        status = [q.body["status"] for q in stub.requests if q.method == "PATCH" and re.search(STATUS, q.path)][-1]
        healthy = next(c for c in status["conditions"] if c["type"] == "AgentHealthy")
        assert (healthy["status"], healthy["reason"], status["healthyDevices"]) == ("False", "NVMLUnavailable", 0)
        events = [q.body for q in stub.requests if q.method == "POST" and q.path.endswith(EVENTS)]
        assert [(e["type"], e["reason"]) for e in events] == [("Warning", "NoReadableDevice")]
        assert events[0]["involvedObject"] == {"apiVersion": "vramguard.io/v1alpha1", "kind": "NodeGPUUsage",
                                               "name": "n1"}
        assert "nothing on this node is measured or enforced" in events[0]["message"]
        assert 'vramguard_agent_healthy_devices{node="n1"} 0.0' in agent.metrics.exposition().decode()

        FlakyBackend.down[0] = False
        now[0] = 200.0
        agent.step()
        assert agent.health.ready() == (True, "ok")
        events = [q.body for q in stub.requests if q.method == "POST" and q.path.endswith(EVENTS)]
        assert [(e["type"], e["reason"]) for e in events][-1] == ("Normal", "DevicesReadable")
        assert 'vramguard_agent_healthy_devices{node="n1"} 1.0' in agent.metrics.exposition().decode()
    finally:
        FlakyBackend.down[0] = True
        stub.close()


def test_a_healthy_first_report_posts_no_event(tmp_path):
    stub, now = StubAPI(), [0.0]
    FlakyBackend.down[0] = False
    try:
        agent = make_agent(stub, tmp_path, now)
        agent.step()
        assert agent.health.ready() == (True, "ok")
        assert not [q for q in stub.requests if q.path.endswith(EVENTS)]
    finally:
        FlakyBackend.down[0] = True
        stub.close()
