"""Memory limits end to end in the agent: the agent's step over the simulated node applies a
pod's annotation (a sample alone never does), and the NodeGPUUsage status and the metrics
show support and what is held."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from vramguard_agent.agent import Agent, AgentConfig, Components
from vramguard_agent.caps import CapEnforcer
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.metrics import AgentMetrics, Snapshot
from vramguard_agent.nvml_limits import NVMLMemoryLimits
from vramguard_agent.sampler import Sampler
from vramguard_api.memlimits import DeviceMemoryLimit, format_memory_limits
from vramguard_api.usage import NodeGPUUsageStatus
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import SimBackend, gpu_uuid

from .builders import GIB

NODE = {
    "name": "n1",
    "driverVersion": "615.12.03",
    "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": "81559Mi", "reserved": "579Mi"}],
    "pods": [
        {
            "namespace": "ml",
            "name": "capped",
            "containers": [{"name": "main", "processes": [{"gpu": 0, "memory": "4Gi"}]}],
        },
        {
            "namespace": "ml",
            "name": "free",
            "containers": [{"name": "main", "processes": [{"gpu": 0, "memory": "2Gi"}]}],
        },
    ],
}


def make(tmp_path: Path, enforce: bool = True, driver: str = "615.12.03") -> tuple[Components, SimBackend]:
    """The agent's parts over the simulated node, ``capped`` annotated with limits."""
    node = Scenario.model_validate({"nodes": [{**NODE, "driverVersion": driver}]}).node("n1")
    backend = SimBackend(node, host_root=tmp_path, clock=lambda: 0.0)
    want = format_memory_limits({gpu_uuid("n1", 0): DeviceMemoryLimit(soft_limit=GIB, hard_limit=6 * GIB)})

    def pods():  # the operator's annotation on "capped"
        return {u: replace(m, memory_limits=want) if m.name == "capped" else m for u, m in backend.pod_metas().items()}

    caps = CapEnforcer(NVMLMemoryLimits(backend.nvml.library), enforce=enforce)
    sampler = Sampler(
        backend,
        proc_root=tmp_path / "proc",
        memory=CgroupMemoryReader(tmp_path / "cgroup"),
        pods=pods,
        container_names=backend.container_names,
        cgroups_needed=caps.cgroups_needed,
    )
    return Components(sampler, backend, caps), backend


def test_a_sample_never_writes_the_agents_step_does(tmp_path):
    parts, backend = make(tmp_path)
    status = parts.sampler.sample().status
    assert backend.fake.calls.get("nvmlDeviceSetMemoryLimits_v1", 0) == 0 and backend.fake.memory_limits == {}
    assert {p.name: p for p in status.pods}["capped"].memory_limits is None  # no limits stage, nothing reported
    status = parts.tick().status
    assert backend.fake.calls["nvmlDeviceSetMemoryLimits_v1"] == 1 and backend.fake.memory_limits
    assert {p.name: p for p in status.pods}["capped"].memory_limits[0].state == "Applied"


def test_status_reports_support_and_the_applied_limits(tmp_path):
    parts, backend = make(tmp_path)
    result = parts.tick()
    status = NodeGPUUsageStatus.model_validate(result.status.to_api())
    (device,) = status.devices
    assert (device.memory_limits, device.memory_limits_reason) == ("Supported", "ProbeSucceeded")
    by_name = {p.name: p for p in status.pods}
    (limit,) = by_name["capped"].memory_limits
    assert (limit.uuid, limit.state, limit.hard_limit_bytes, limit.soft_limit_bytes) == (
        device.uuid,
        "Applied",
        6 * GIB,
        GIB,
    )
    assert by_name["free"].memory_limits is None and status.agent.enforce_caps is True
    # On the pod's cgroup, under the host's cgroup root as NVML names it.
    (namespace,) = backend.fake.memory_limits[device.uuid]
    assert namespace.startswith("/sys/fs/cgroup/kubepods.slice/") and namespace.endswith(".slice")
    assert by_name["capped"].uid.replace("-", "_") in namespace


def test_the_plain_report_and_the_api_model_agree(tmp_path):
    parts, _ = make(tmp_path)
    result = parts.tick()
    plain = {p.name: p for p in result.report.pods}["capped"].memory_limits[0]
    api = {p.name: p for p in result.status.pods}["capped"].memory_limits[0]
    for name in ("uuid", "state", "reason", "hard_limit_bytes", "soft_limit_bytes", "current_used_bytes"):
        assert getattr(plain, name) == getattr(api, name)


def test_old_driver_reports_unsupported_and_the_pod_entry_says_so(tmp_path):
    parts, backend = make(tmp_path, driver="550.90.07")
    status = parts.tick().status
    (device,) = status.devices
    assert (device.memory_limits, device.memory_limits_reason) == ("Unsupported", "DriverTooOld")
    assert "550.90.07" in (device.memory_limits_message or "")
    (limit,) = {p.name: p for p in status.pods}["capped"].memory_limits
    assert limit.state == "Unsupported" and limit.hard_limit_bytes is None
    assert backend.fake.memory_limits == {}


def test_metrics_export_support_and_held_limits(tmp_path):
    parts, _ = make(tmp_path)
    result = parts.tick()
    metrics = AgentMetrics("n1")
    metrics.update(Snapshot("n1", result.report, result.container_devices))
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    (support,) = families["vramguard_gpu_memory_limits_supported"].samples
    assert support.value == 1 and support.labels["reason"] == "ProbeSucceeded"
    held = {s.labels["limit"]: s.value for s in families["vramguard_pod_gpu_memory_limit_bytes"].samples}
    assert held == {"hard": 6 * GIB, "soft": GIB}
    (applied,) = families["vramguard_pod_gpu_memory_limits_applied"].samples
    assert (applied.labels["pod"], applied.labels["state"], applied.value) == ("capped", "Applied", 1)


def test_enforcement_off_reports_disabled_and_sets_nothing(tmp_path):
    parts, backend = make(tmp_path, enforce=False)
    status = parts.tick().status
    (limit,) = {p.name: p for p in status.pods}["capped"].memory_limits
    assert (limit.state, limit.reason) == ("Disabled", "EnforcementDisabled")
    assert status.devices[0].memory_limits == "Supported" and status.agent.enforce_caps is False
    assert backend.fake.calls.get("nvmlDeviceSetMemoryLimits_v1", 0) == 0


def test_the_agent_counts_memory_limit_calls(tmp_path):
    parts, _ = make(tmp_path)
    agent = Agent(AgentConfig(node_name="n1", backend="sim", metrics_address=None), parts)
    agent.step()
    families = {f.name: f for f in text_string_to_metric_families(agent.metrics.exposition().decode())}
    calls = {
        (s.labels["operation"], s.labels["result"]): s.value
        for s in families["vramguard_agent_memory_limit_calls"].samples
        if s.name.endswith("_total")
    }
    assert calls[("set", "ok")] == 1 and calls[("get", "ok")] >= 2  # probe, start read, read-back


def test_a_change_of_limits_is_a_change_of_the_reports_shape(tmp_path):
    """The operator waits on the applied state: it is written at once, not at the next heartbeat."""
    from vramguard_agent.publish import PublishPolicy, decide, digest

    parts, _ = make(tmp_path, enforce=False)
    first = parts.tick()
    parts.caps.enforce = True  # type: ignore[union-attr]
    second = parts.tick()
    policy = PublishPolicy()
    decision = decide(digest(first.report), 0.0, digest(second.report), policy.min_interval_s, policy)
    assert decision.write
    assert digest(second.report).shape != digest(first.report).shape
    assert digest(parts.tick().report).shape == digest(second.report).shape  # steady: no write
