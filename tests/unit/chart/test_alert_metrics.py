"""Every metric the chart's alert rules and Grafana dashboard name is one the code
exports: the names are read from the agent's and the operator's registries as they
expose them (counters with ``_total``), not from a list kept by hand."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vramguard_agent.metrics import AgentMetrics, Snapshot
from vramguard_api.usage import NodeGPUUsageStatus
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.controller.oom import oom_counter

from .helm import CHART

METRIC = re.compile(r"\bvramguard_[a-z0-9_]+")
# Named by the rules before the code that exports it lands: the per-pod diagnosis
# (issue 30 item 5, built on the `ramleak` branch as vramguard_pod_diagnosis{namespace,pod,diagnosis}).
PENDING = {"vramguard_pod_diagnosis"}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


def exposed(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
    return names


def code_metrics() -> set[str]:
    agent = AgentMetrics("node")
    agent.update(Snapshot("node", NodeGPUUsageStatus(sampleTime=datetime(2026, 1, 1, tzinfo=UTC))))
    operator = CollectorRegistry()
    Metrics(operator)
    oom_counter(operator)  # registered beside Metrics by the operator's startup
    return exposed(agent.exposition().decode()) | exposed(generate_latest(operator).decode())


def named(path: Path) -> set[str]:
    return set(METRIC.findall(path.read_text()))


def test_every_metric_the_alerts_and_the_dashboard_name_is_exported():
    rules = named(CHART / "templates" / "prometheusrule.yaml")
    dashboard = named(CHART / "dashboards" / "vramguard.json")
    assert "vramguard_node_swap_in_bytes_per_second" in rules and "vramguard_budget_usage_ratio" in dashboard
    missing = (rules | dashboard) - code_metrics() - PENDING
    assert not missing, f"named by the chart but exported by no code: {sorted(missing)}"


def test_the_check_itself_sees_a_misspelt_name():
    assert "vramguard_gpu_memory_used_bytez" not in code_metrics()
    assert "vramguard_oom_kills_total" in code_metrics()  # a counter, as the rules write it
