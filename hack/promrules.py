"""Check the chart's alert rules and the Grafana dashboard's queries with promtool.

Renders the chart (helm template, the PrometheusRule enabled with the defaults),
writes the PrometheusRule's ``spec`` as a Prometheus rule file, and runs
``promtool check rules`` on it and on the dashboard's queries (each written as a
recording rule, Grafana's variables replaced by values), then ``promtool test rules``
on tests/promtool/*.test.yaml (their ``rule_files`` name ``alerts.yaml``).
promtool and helm are the binaries hack/cluster/build.sh caches (or $PROMTOOL, $HELM).
Usage: hack/promrules.py   (exit status 1 on any failure, with promtool's output)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "vramguard"
DASHBOARD = CHART / "dashboards" / "vramguard.json"
TESTS = ROOT / "tests" / "promtool"
CACHE = Path(os.environ.get("VG_CACHE", Path.home() / ".cache" / "vramguard"))
# Grafana's variables, replaced by values PromQL parses (a selector's regex, a range).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def cached(name: str, env: str) -> str:
    """The binary from $env, else the newest that build.sh cached, else PATH's; exits when none."""
    if os.environ.get(env):
        return os.environ[env]
    built = sorted(p for p in CACHE.glob(f"bin/{name}-*/{name}") if not p.parent.name.endswith(".tmp"))
    found = str(built[-1]) if built else shutil.which(name)
    if found is None:
        sys.exit(f"promrules: {name} not found: run hack/cluster/build.sh (or set ${env})")
    return found


def rendered_rules(helm: str) -> dict[str, Any]:
    """The PrometheusRule's spec ({groups: [...]}) from the chart with default values."""
    out = subprocess.run(
        [helm, "template", "vramguard", str(CHART), "--namespace", "vramguard-system", "--kube-version", "1.36.0",
         "--set", "metrics.prometheusRule.enabled=true"],
        capture_output=True, text=True, check=True,
    ).stdout
    for doc in yaml.safe_load_all(out):
        if doc and doc.get("kind") == "PrometheusRule":
            return dict(doc["spec"])
    sys.exit("promrules: the chart rendered no PrometheusRule")


def dashboard_exprs(path: Path = DASHBOARD) -> list[str]:
    """Every panel target's PromQL in the dashboard, Grafana's variables replaced."""
    exprs = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(path.read_text()))
    out = []
    for expr in exprs:
        for var, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(var, value)
        out.append(re.sub(r"\$\{?(\w+)(:\w+)?\}?", ".*", expr))  # template variables inside selectors' regexes
    return out


def main() -> int:
    helm, promtool = cached("helm", "HELM"), cached("promtool", "PROMTOOL")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "alerts.yaml").write_text(yaml.safe_dump(rendered_rules(helm), sort_keys=False))
        queries = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(dashboard_exprs())]
        (work / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": queries}]}))
        tests = sorted(TESTS.glob("*.test.yaml"))
        for t in tests:
            shutil.copy(t, work / t.name)
        steps = [
            [promtool, "check", "rules", "alerts.yaml", "dashboard.yaml"],
            [promtool, "test", "rules", *[t.name for t in tests]],
        ]
        for step in steps:
            proc = subprocess.run(step, cwd=work, capture_output=True, text=True)
            print(proc.stdout.strip() or proc.stderr.strip())
            if proc.returncode != 0:
                print(proc.stderr.strip(), file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
