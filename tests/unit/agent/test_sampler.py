"""A whole sample over the simulated backend and its fake host, read through /proc and
the cgroup filesystem exactly as on a node."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramguard_agent import sampler as sampler_module
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.publish import digest
from vramguard_agent.sampler import Sampler
from vramguard_api.history import HistoryStore
from vramguard_api.usage import NodeGPUUsageStatus
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import FIRST_PID, SimBackend

from .builders import GIB, MIB

NODE = {
    "name": "n1",
    "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 2, "memory": "81559Mi", "reserved": "579Mi"}],
    "pods": [
        {
            "namespace": "ml",
            "name": "leaky",
            "containers": [
                {
                    "name": "server",
                    "ram": "3Gi",
                    "processes": [{"gpu": 0, "memory": {"linear": {"start": "4Gi", "perHour": "2Gi"}}}],
                }
            ],
        },
        {"namespace": "ml", "name": "idle", "containers": [{"name": "main", "ram": "1Gi"}]},
    ],
    "hostProcesses": [{"cgroup": "/user.slice/session-2.scope", "gpu": 1, "memory": "1Gi"}],
}


def make(
    tmp_path: Path, now: list[float], proc_root: Path | None = None, history: HistoryStore | None = None
) -> Sampler:
    node = Scenario.model_validate({"nodes": [NODE]}).node("n1")
    backend = SimBackend(node, host_root=tmp_path, clock=lambda: now[0])
    return Sampler(
        backend,
        proc_root=proc_root or tmp_path / "proc",
        memory=CgroupMemoryReader(tmp_path / "cgroup"),
        pods=backend.pod_metas,
        container_names=backend.container_names,
        wall_clock=lambda: 1_700_000_000 + now[0],
        history=history,
    )


def test_sample_attributes_names_and_measures(tmp_path):
    now = [0.0]
    result = make(tmp_path, now).sample()
    status = NodeGPUUsageStatus.model_validate(result.status.to_api())
    idle, leaky = status.pods
    assert (leaky.namespace, leaky.name, leaky.vram_bytes, leaky.ram_working_set_bytes) == (
        "ml",
        "leaky",
        4 * GIB,
        3 * GIB,
    )
    assert [(c.name, c.vram_bytes) for c in leaky.containers] == [("server", 4 * GIB)]
    assert (idle.name, idle.vram_bytes, idle.ram_working_set_bytes) == ("idle", 0, GIB)
    (host,) = status.unattributed
    assert host.used_bytes == GIB and host.reason.startswith("not in a pod")
    assert status.agent.backend == "sim" and status.agent.driver_version == "550.90.07"
    assert [(c.namespace, c.pod, c.container, c.used_bytes) for c in result.container_devices()] == [
        ("ml", "leaky", "server", 4 * GIB)
    ]


def test_the_plain_report_is_the_api_model_field_for_field(tmp_path):
    """What the publish decision and the metrics read (the plain report) is what
    is written (its API model): same digest, same values, pod by pod."""
    now = [0.0]
    sampler = make(tmp_path, now, history=HistoryStore(trend_interval_s=0.0))
    for step in range(5):
        now[0] = step * 60.0
        result = sampler.sample()
    report, status = result.report, result.status
    assert digest(report).shape == digest(status).shape and digest(report).amounts == digest(status).amounts
    assert report.to_status() is status  # built once
    for entry, pod in zip(report.pods, status.pods, strict=True):
        for name in ("uid", "namespace", "name", "qos_class", "attribution", "vram_bytes", "trend"):
            assert getattr(entry, name) == getattr(pod, name)
        assert [tuple(d) for d in entry.devices] == [
            (d.uuid, d.used_bytes, d.sm_utilization_percent) for d in pod.devices
        ]
        assert [(c.container_id, c.name, c.ram_working_set_bytes) for c in entry.containers] == [
            (c.container_id, c.name, c.ram_working_set_bytes) for c in pod.containers
        ]
    assert any(p.trend is not None for p in status.pods) and status.unattributed


def test_history_gives_the_leaking_pod_a_growth_rate(tmp_path):
    now = [0.0]
    sampler = make(tmp_path, now, history=HistoryStore(trend_interval_s=0.0))
    for step in range(120):  # two hours, a sample a minute
        now[0] = step * 60.0
        result = sampler.sample()
    leaky = next(p for p in result.status.pods if p.name == "leaky")
    idle = next(p for p in result.status.pods if p.name == "idle")
    assert leaky.trend is not None and leaky.trend.samples == 120 and leaky.trend.window_seconds == 119 * 60
    assert leaky.trend.growth_bytes_per_hour == pytest.approx(2 * GIB, rel=0.05)
    assert leaky.trend.leak is True
    assert idle.trend is not None and not idle.trend.leak  # zeros are recorded for idle GPU pods


def test_history_in_scenario_time_gives_scenario_rates_and_wall_sample_times(tmp_path):
    """At 60x, one clock second is a scenario minute: two clock minutes of samples
    hold two scenario hours, the growth is the scenario's 2Gi/h, and sampleTime is
    still the wall clock's."""
    now = [0.0]
    node = Scenario.model_validate({"nodes": [NODE]}).node("n1")
    backend = SimBackend(node, host_root=tmp_path, clock=lambda: now[0], speed=60.0)
    sampler = Sampler(
        backend,
        proc_root=tmp_path / "proc",
        memory=CgroupMemoryReader(tmp_path / "cgroup"),
        history=HistoryStore(trend_interval_s=0.0),
        pods=backend.pod_metas,
        container_names=backend.container_names,
        wall_clock=lambda: 1_700_000_000 + now[0],
        history_clock=backend.now,
    )
    for step in range(120):  # a sample every clock second
        now[0] = float(step)
        result = sampler.sample()
    leaky = next(p for p in result.status.pods if p.name == "leaky")
    assert leaky.trend is not None and leaky.trend.window_seconds == 119 * 60
    assert leaky.trend.growth_bytes_per_hour == pytest.approx(2 * GIB, rel=0.05)
    assert leaky.trend.leak is True
    assert result.status.sample_time.timestamp() == 1_700_000_119


def test_sampler_keeps_the_history_it_was_given(tmp_path):
    history = HistoryStore(window_s=60.0, max_points=6)
    sampler = Sampler(SimBackend(Scenario.model_validate({"nodes": [NODE]}).node("n1")), history=history)
    assert sampler.history is history


def test_attributions_are_cached_while_the_pid_lives(tmp_path, monkeypatch):
    reads = []
    real = sampler_module.attribute_pid

    def counting(pid, root):
        reads.append(pid)
        return real(pid, root)

    monkeypatch.setattr(sampler_module, "attribute_pid", counting)
    now = [0.0]
    sampler = make(tmp_path, now)
    for _ in range(3):
        sampler.sample()
    assert sorted(reads) == [FIRST_PID, FIRST_PID + 1]


def test_pods_learnt_from_the_api_later_are_picked_up(tmp_path):
    """The simulation starts before the pod list: uids are derived, then the API's."""
    from vramguard_agent.pods import PodMeta

    now, api = [0.0], {}
    node = Scenario.model_validate({"nodes": [NODE]}).node("n1")
    backend = SimBackend(node, api_pods=lambda: api, host_root=tmp_path, clock=lambda: now[0])
    sampler = Sampler(
        backend,
        proc_root=tmp_path / "proc",
        memory=CgroupMemoryReader(tmp_path / "cgroup", clock=lambda: now[0]),
        pods=lambda: api,
        container_names=backend.container_names,
        cache_key=lambda: backend.identity_version,
    )
    assert {p.name for p in sampler.sample().status.pods} == {None}
    api["0a0b0c0d-0000-4000-8000-000000000001"] = PodMeta(
        "0a0b0c0d-0000-4000-8000-000000000001", "ml", "leaky", gpu=True
    )
    now[0] = 10.0
    pods = sampler.sample().status.pods
    assert [(p.uid, p.name) for p in pods] == [("0a0b0c0d-0000-4000-8000-000000000001", "leaky")]
    assert pods[0].vram_bytes == 4 * GIB + 2 * GIB * 10 // 3600


def test_exited_pid_is_dropped_from_the_sample(tmp_path):
    now = [0.0]
    sampler = make(tmp_path, now)
    sampler.sample()
    sampler._attributions.clear()
    (tmp_path / "proc" / str(FIRST_PID + 1) / "cgroup").unlink()  # the host process exited
    status = sampler.sample().status
    assert status.unattributed == [] and [p.name for p in status.pods if p.vram_bytes] == ["leaky"]


def test_invisible_pid_namespace_is_reported_after_two_samples(tmp_path):
    now = [0.0]
    empty = tmp_path / "empty-proc"
    empty.mkdir()
    sampler = make(tmp_path / "host", now, proc_root=empty)
    assert sampler.sample().status.unattributed == []
    unattributed = sampler.sample().status.unattributed
    assert len(unattributed) == 2 and all("hostPID" in u.reason for u in unattributed)
    assert {u.used_bytes for u in unattributed} == {GIB, 4 * GIB}


def test_unreadable_cgroup_file_is_unattributed_with_the_error(tmp_path):
    now = [0.0]
    sampler = make(tmp_path, now)
    sampler.sample()
    sampler._attributions.clear()
    path = tmp_path / "proc" / str(FIRST_PID) / "cgroup"
    path.unlink()
    path.mkdir()  # reading a directory fails with an OSError other than "not found"
    status = sampler.sample().status
    assert any(u.pid == FIRST_PID and "cannot read" in u.reason for u in status.unattributed)


def test_ram_only_pod_memory_figures_in_mib(tmp_path):
    now = [0.0]
    status = make(tmp_path, now).sample().status
    figures = {p.name: p.ram_working_set_bytes for p in status.pods}
    # Both pods, the RAM-only one (idle, no GPU process) included, each with a figure:
    # an empty report or a missing figure fails here.
    assert set(figures) == {"leaky", "idle"} and None not in figures.values()
    assert all(f % MIB == 0 for f in figures.values())


def test_pods_on_a_lost_device_are_unknown_not_a_partial_sum(tmp_path):
    """GPU 1 is lost from 1m to 2m: the pod with a process on each GPU must not be
    reported as Measured with GPU 0's bytes only, nor the idle GPU pod as 0."""
    spec = {
        **NODE,
        "pods": [
            *NODE["pods"],
            {"namespace": "ml", "name": "wide", "containers": [{"name": "main", "processes": [
                {"gpu": 0, "memory": "2Gi"}, {"gpu": 1, "memory": "3Gi"}]}]},
        ],
        "faults": [{"type": "gpu-lost", "gpu": 1, "from": "1m", "until": "2m"}],
    }
    node = Scenario.model_validate({"nodes": [spec]}).node("n1")
    now = [0.0]
    backend = SimBackend(node, host_root=tmp_path, clock=lambda: now[0])
    sampler = Sampler(backend, proc_root=tmp_path / "proc", memory=CgroupMemoryReader(tmp_path / "cgroup"),
                      pods=backend.pod_metas, container_names=backend.container_names,
                      wall_clock=lambda: 1_700_000_000 + now[0])

    def pods() -> dict[str, tuple[str, int | None]]:
        status = sampler.sample().status
        return {p.name or "": (p.attribution, p.vram_bytes) for p in status.pods}

    assert pods() == {"leaky": ("Measured", 4 * GIB), "idle": ("Measured", 0), "wide": ("Measured", 5 * GIB)}
    now[0] = 90.0
    status = sampler.sample().status
    by_name = {p.name: p for p in status.pods}
    assert (by_name["wide"].attribution, by_name["wide"].vram_bytes) == ("Unknown", None)
    assert (by_name["idle"].attribution, by_name["idle"].vram_bytes) == ("Unknown", None)
    assert (by_name["leaky"].attribution, by_name["leaky"].vram_bytes) == ("Measured", 4 * GIB + 90 * 2 * GIB // 3600)
    lost = status.devices[1]
    assert lost.health == "Lost" and lost.processes_complete is False
    assert {d.uuid: d.used_bytes for d in by_name["wide"].devices}[lost.uuid] is None
    now[0] = 150.0  # the device is back: measured again
    assert pods()["wide"] == ("Measured", 5 * GIB)


def test_ram_history_gives_a_loader_whose_working_set_grows_a_ram_leak_and_page_cache_none(tmp_path):
    """The same detector on the cgroup's working set: RSS growing 1Gi/h is a RAM
    leak with flat VRAM; page cache growing as fast is not working set."""
    loader = {"name": "loader", "ram": {"linear": {"start": "2Gi", "perHour": "1Gi"}},
              "processes": [{"gpu": 0, "memory": "8Gi"}]}
    reader = {"name": "reader", "ram": "2Gi", "pageCache": {"linear": {"start": "1Gi", "perHour": "1Gi"}},
              "processes": [{"gpu": 1, "memory": "8Gi"}]}
    node = {**NODE, "pods": [{"namespace": "ml", "name": "loader", "containers": [loader]},
                             {"namespace": "ml", "name": "reader", "containers": [reader]}]}
    now = [0.0]
    backend = SimBackend(Scenario.model_validate({"nodes": [node]}).node("n1"), host_root=tmp_path, clock=lambda: now[0])
    sampler = Sampler(
        backend,
        proc_root=tmp_path / "proc",
        memory=CgroupMemoryReader(tmp_path / "cgroup", refresh_s=0.0),
        history=HistoryStore(trend_interval_s=0.0),
        ram_history=HistoryStore(trend_interval_s=0.0),
        pods=backend.pod_metas,
        wall_clock=lambda: 1_700_000_000 + now[0],
    )
    for step in range(90):  # an hour and a half, a sample a minute
        now[0] = step * 60.0
        result = sampler.sample()
    pods = {p.name: p for p in result.status.pods}
    loader_ram, loader_vram = pods["loader"].ram_trend, pods["loader"].trend
    assert loader_ram is not None and loader_ram.leak is True
    assert loader_ram.growth_bytes_per_hour == pytest.approx(GIB, rel=0.05)
    assert loader_vram is not None and loader_vram.leak is False
    reader_ram = pods["reader"].ram_trend
    assert reader_ram is not None and reader_ram.leak is False and reader_ram.growth_bytes_per_hour < 16 * MIB


def test_a_gpu_pod_nvml_cannot_attribute_takes_its_vram_from_dmem(tmp_path):
    """An MPS client: no process of its own in NVML's lists, but the kernel's dmem
    controller charged its cgroup; the leak detector's history follows that figure."""
    now = [0.0]
    sampler = make(tmp_path, now, history=HistoryStore(trend_interval_s=0.0))
    first = {p.name: p for p in sampler.sample().status.pods}
    assert first["idle"].vram_bytes == 0 and first["idle"].vram_source == "NVML" and first["idle"].dmem is None
    region = "nvidia/0000:3b:00.0/vidmem"
    root = tmp_path / "cgroup"
    assert sampler.memory.version == 2
    (root / "dmem.capacity").write_text(f"{region} 84934656000\n")
    uid = next(u for u, m in sampler.pods().items() if m.name == "idle")
    idle_dir = root / sampler.memory.pod_cgroup_path(uid).lstrip("/")
    (idle_dir / "dmem.current").write_text(f"{region} {5 * GIB}\n")
    recorded: list[dict[str, int | None]] = []
    add = sampler.history.add
    sampler.history.add = lambda t, values: (recorded.append(dict(values)), add(t, values))[1]  # type: ignore[method-assign]
    now[0] = 60.0
    pods = {p.name: p for p in sampler.sample().status.pods}
    assert (pods["idle"].vram_bytes, pods["idle"].vram_source) == (5 * GIB, "Dmem")
    assert pods["leaky"].vram_source == "NVML"
    assert recorded[-1][uid] == 5 * GIB
