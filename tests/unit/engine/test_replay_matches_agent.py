"""One history: a usage series through the agent (simulated backend, sampler and
history with the agent's defaults, as ``vramguard_agent.agent.build`` assembles
them) and through ``vramguard replay`` gives the same trend features at every
sample and the same engine decisions.

The agent's reports are evaluated as the operator would evaluate them live (the
engine on each report, its output applied as by a successful actions layer);
the replay reads the VRAM series the agent reported, as a CSV.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from vramguard_agent.agent import AgentConfig
from vramguard_agent.memory import CgroupMemoryReader
from vramguard_agent.sampler import Sampler
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.history import HistoryStore
from vramguard_api.usage import NodeGPUUsage, NodeGPUUsageStatus
from vramguard_operator.cli.replay import ReplayEvent, parse_usage, replay
from vramguard_operator.cli.replay_run import EPOCH, NODE, apply_output, labels_for, pod_uid, replay_steps
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.report_checks import report_problem
from vramguard_operator.engine.types import ContainerFacts, EffectivePolicy, EngineInput, PodFacts
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import SimBackend

NAMESPACE = "serve"
SAMPLE_S = 30  # the agent's interval is a setting; 30 s keeps the test short
HOURS = 3.5
SAW = {"sawtooth": {"low": "10Gi", "high": "14Gi", "period": "5m"}}


def process(start: str, until: str | None, per_hour: str) -> dict[str, Any]:
    memory = {"sum": [SAW, {"linear": {"start": 0, "perHour": per_hour}}]}
    return {"gpu": 0, "memory": memory, "from": start, **({"until": until} if until else {})}


PODS = {
    "leaky": [process("0s", "80m", "1500Mi"), process("83m", None, "1500Mi")],
    "steady": [process("0s", None, "0")],
    "late": [process("40m", None, "800Mi")],
}
# A leak that restarts (VRAM 0 for 3 minutes), a flat training loop, a leak that
# starts late, and a minute of NVML outage (every pod Unknown: nothing recorded).
SCENARIO = {
    "nodes": [
        {
            "name": NODE,
            "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": "81559Mi", "reserved": "579Mi"}],
            "pods": [
                {
                    "namespace": NAMESPACE,
                    "name": name,
                    "uid": pod_uid(NAMESPACE, name),  # the uid replay gives the pod: the same stagger
                    "containers": [{"name": "main", "processes": procs}],
                }
                for name, procs in PODS.items()
            ],
            "faults": [{"type": "nvml-unavailable", "from": "150m", "until": "151m"}],
        }
    ]
}

BUDGET = GPUMemoryBudget.model_validate(
    {
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GPUMemoryBudget",
        "metadata": {"name": "serve", "namespace": NAMESPACE, "uid": "replay-serve", "generation": 1},
        "spec": {
            "selector": {"matchLabels": {"app": "serve"}},
            "limits": {"perPod": {"vram": "40Gi"}},
            "warningThreshold": 1.0,
            "leakDetection": {"enabled": True, "minGrowthPerHour": "200Mi", "minWindow": "30m"},
            "enforcement": {"escalation": [{"action": "Annotate"}, {"action": "Throttle", "after": "20m"}]},
        },
    }
)
DEVICE_BYTES = (81559 - 579) << 20


def agent_reports(tmp_path: Path) -> list[NodeGPUUsageStatus]:
    """The agent's status at every sample, its clock and scenario time both at
    ``t`` seconds (so sampleTime is EPOCH + t, as replay's)."""
    now = [0.0]
    node = Scenario.model_validate(SCENARIO).node(NODE)
    backend = SimBackend(node, host_root=tmp_path, clock=lambda: now[0])
    cfg = AgentConfig(node_name=NODE)  # the agent's defaults for the history and trends
    sampler = Sampler(
        backend,
        proc_root=tmp_path / "proc",
        memory=CgroupMemoryReader(tmp_path / "cgroup", clock=lambda: now[0]),
        history=HistoryStore(cfg.history_window_s, cfg.history_points, cfg.trend_interval_s),
        pods=backend.pod_metas,
        container_names=backend.container_names,
        wall_clock=lambda: now[0],
        history_clock=backend.now,  # as build() does for the simulated backend
    )
    statuses = []
    for step in range(int(HOURS * 3600 / SAMPLE_S)):
        now[0] = float(step * SAMPLE_S)
        statuses.append(sampler.sample().status)
    return statuses


def usage_csv(statuses: list[NodeGPUUsageStatus]) -> str:
    """The VRAM each pod was reported with, as replay's usage CSV (empty: Unknown)."""
    lines = ["t_seconds,pod,vram_bytes"]
    for st in statuses:
        t = int(st.sample_time.timestamp())
        lines += [f"{t},{p.name},{'' if p.vram_bytes is None else p.vram_bytes}" for p in st.pods]
    return "\n".join(lines) + "\n"


def operator_decisions(statuses: list[NodeGPUUsageStatus]) -> list[tuple[Any, ...]]:
    """The engine on each of the agent's reports, as the operator runs it live."""
    labels = labels_for(BUDGET.spec.selector)
    container = (ContainerFacts("main", cpu_limit="1", cpu_request="1"),)
    pods = [PodFacts(NAMESPACE, n, pod_uid(NAMESPACE, n), labels, NODE, "Running", container) for n in PODS]
    budgets = [BUDGET]
    decisions = []
    for st in statuses:
        report = NodeGPUUsage.model_validate(
            {"metadata": {"name": NODE}, "spec": {"nodeName": NODE}, "status": st.to_api()}
        )
        out = evaluate(
            EngineInput(
                budgets=tuple(budgets),
                pods=tuple(pods),
                reports={NODE: report},
                now=st.sample_time,
                policy=EffectivePolicy(exempt_namespaces=frozenset()),
            )
        )
        t = (st.sample_time - EPOCH).total_seconds()
        decisions += [
            (t, d.pod.name if d.pod else None, d.action, d.violation.kind, d.observed_bytes, d.limit_bytes)
            for d in out.decisions
        ]
        budgets, pods = apply_output(out, budgets, pods)
    return decisions


def event_key(e: ReplayEvent) -> tuple[Any, ...]:
    return (e.t_seconds, e.pod, e.action, e.violation, e.observed_bytes, e.limit_bytes)


def test_replay_gives_the_agents_trend_features_and_decisions(tmp_path):
    statuses = agent_reports(tmp_path)
    # the agent's own reports break no rule of engine/report_checks (issue 32)
    assert [(i, report_problem(st)) for i, st in enumerate(statuses) if report_problem(st)] == []
    samples = parse_usage(io.StringIO(usage_csv(statuses)))
    agent_trends = [{p.name: p.trend for p in st.pods} for st in statuses]
    replay_trends = [
        {p.name: p.trend for p in step.report.status.pods}
        for step in replay_steps(BUDGET, samples, DEVICE_BYTES)
    ]
    assert len(replay_trends) == len(agent_trends)
    for t, (agent, replayed) in enumerate(zip(agent_trends, replay_trends, strict=True)):
        assert replayed == agent, f"trend features differ at t={t * SAMPLE_S}s"

    # The series exercised what the history does: the adaptive schedule, staggered
    # per pod (every 5 minutes while quiet, every minute or sooner while rising),
    # a full history of one-minute points, zeros, unknowns.
    first_refresh, gaps = {}, {}
    for name in PODS:
        series = [a[name] for a in agent_trends]
        grew = [i * SAMPLE_S for i in range(1, len(series)) if series[i].samples != series[i - 1].samples]
        settled = [g for g in grew if g >= 600]  # the first minutes' points move the floor by the sawtooth
        gaps[name] = {b - a for a, b in zip(settled, settled[1:], strict=False)}
        first_refresh[name] = grew[0]
        assert series[-1].samples == 120
    assert gaps["steady"] == {300}
    assert min(gaps["leaky"]) <= 60 and min(gaps["late"]) <= 60 and max(gaps["late"]) <= 300
    assert len(set(first_refresh.values())) > 1
    assert any(p.vram_bytes == 0 for st in statuses for p in st.pods if p.name == "leaky")  # the restart
    assert any(p.vram_bytes is None for st in statuses for p in st.pods)  # the NVML outage

    live = operator_decisions(statuses)
    replayed_events = [event_key(e) for e in replay(BUDGET, samples, DEVICE_BYTES)]
    assert replayed_events == live
    leaks = {(d[1], d[2]) for d in live if d[3] == "Leak"}
    assert ("leaky", "Annotate") in leaks and ("late", "Annotate") in leaks
    assert not any(d[1] == "steady" for d in live)
