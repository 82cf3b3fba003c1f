"""The chart's operator and agent at work under their own ServiceAccounts, for
the RBAC proof of ``test_chart_e2e``.

kwok plays the kubelet, so the chart's operator and agent containers never
run. Here the same programs run on the host instead, each with a token of its
ServiceAccount bound to the pod the chart made for it (the token the kubelet
would mount): the operator with the command line of the chart's Deployment,
the agent in simulated mode (the NVML backend is the only part it replaces;
its API calls are the same code). A short scenario then drives every path
that needs a grant, and the API server's audit log (hack/cluster/up.sh turns
it on) says what each token asked for.

The local API server cannot reach a Service (no kube-proxy, no pod network),
so for this run the chart's webhook configurations point at the operator on
the host (``url`` and the CA it generated); ``Webhooks.restore`` puts them back.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.operator_harness import ROOT, OperatorProcess, free_port
from tests.unit.chart.rbac import read_events

UP = ROOT / "hack" / "cluster" / "up.sh"
WEBHOOK_KINDS = ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")


# --- the audit log -----------------------------------------------------------------------


class AuditLog:
    """The local cluster's audit log (a file the API server appends to)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def of_local_cluster(cls) -> AuditLog:
        """The log of the cluster hack/cluster/up.sh manages (same VG_CLUSTER_NAME,
        KWOK_WORKDIR); fails the test, saying how to fix it, when there is none."""
        out = subprocess.run([str(UP), "--print-audit-log"], capture_output=True, text=True, check=True)
        path = Path(out.stdout.strip())
        if not path.is_file():
            pytest.fail(
                f"the local cluster writes no audit log ({path} is missing): it was made before "
                "hack/cluster/up.sh turned the audit log on, or by other means. hack/cluster/up.sh "
                "recreates such a cluster; or run hack/cluster/down.sh, then hack/cluster/up.sh "
                "(with the same VG_CLUSTER_NAME and KWOK_WORKDIR)."
            )
        return cls(path)

    def offset(self) -> int:
        """The current end of the file: read from here to see only later requests."""
        return self.path.stat().st_size

    def events(self, offset: int) -> list[dict[str, Any]]:
        """The audit events written after ``offset``."""
        return list(read_events(self.path, offset))


# --- tokens and kubeconfigs ---------------------------------------------------------------


def bound_token(cluster: Any, namespace: str, account: str, pod: str) -> str:
    """A token of ``account`` bound to ``pod``, as the kubelet mounts it."""
    return str(cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h",
                               "--bound-object-kind", "Pod", "--bound-object-name", pod).stdout.strip())


def token_kubeconfig(admin_kubeconfig: str, token: str, path: Path) -> str:
    """Write a kubeconfig with the admin kubeconfig's cluster (server, CA) and
    ``token`` as its only credential; returns its path."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])["cluster"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
    }))
    return str(path)


# --- the chart's webhook configurations, pointed at the host ------------------------------


@dataclass
class Webhooks:
    """The chart's webhook configurations as they were before ``point_at``."""

    cluster: Any
    name: str
    saved: dict[str, list[dict[str, Any]]]

    @classmethod
    def point_at(cls, cluster: Any, name: str, port: int, ca_pem: bytes) -> Webhooks:
        """Make every webhook of the configurations ``name`` call
        ``https://127.0.0.1:<port><its path>`` with ``ca_pem`` as its CA bundle."""
        saved = {}
        for kind in WEBHOOK_KINDS:
            obj = json.loads(cluster.kubectl("get", kind, name, "-o", "json").stdout)
            saved[kind] = [copy.deepcopy(h["clientConfig"]) for h in obj["webhooks"]]
            ops = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                    "value": {"url": f"https://127.0.0.1:{port}{cc['service']['path']}",
                              "caBundle": base64.b64encode(ca_pem).decode()}}
                   for i, cc in enumerate(saved[kind])]
            cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(ops))
        return cls(cluster, name, saved)

    def restore(self) -> None:
        """Put the saved client configurations back."""
        for kind, configs in self.saved.items():
            ops = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig", "value": cc}
                   for i, cc in enumerate(configs)]
            self.cluster.kubectl("patch", kind, self.name, "--type=json", "-p", json.dumps(ops))


# --- the components ---------------------------------------------------------------------------


class ChartOperator(OperatorProcess):
    """The operator with the chart's Deployment's arguments, then what differs
    on the host: local ports, the webhook TLS directory (a CA and certificate
    generated for 127.0.0.1, a state key file in place of the mounted Secret), and test timings (an evaluation every second, a
    blocked eviction retried every second). None of these changes which API
    calls it makes."""

    def __init__(self, deployment: dict[str, Any], kubeconfig: str, tls_dir: Path) -> None:
        super().__init__(kubeconfig, [])
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = list(container["args"])
        assert args[0] == "operator", args
        self.webhook_port = free_port()
        self.ca = tls_dir / "ca.crt"
        key = tls_dir.parent / "state-key"  # the chart mounts its Secret; here a key of the same form
        key.write_text(os.urandom(24).hex())
        chart_args = [f"--state-key-file={key}" if a.startswith("--state-key-file=") else a for a in args[1:]]
        self.extra = [
            *chart_args,
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            f"--metrics-port={self.metrics_port}", "--metrics-address=127.0.0.1",
            f"--webhook-port={self.webhook_port}", f"--webhook-tls-dir={tls_dir}",
            "--evaluation-period=1s", "--debounce=10ms", "--eviction-retry=1s",
        ]


class Agent:
    """``vramguard-agent run --backend sim`` for one node, as a subprocess."""

    def __init__(self, node: str, scenario: dict[str, Any], kubeconfig: str, workdir: Path) -> None:
        self.scenario = workdir / "scenario.yaml"
        self.scenario.write_text(yaml.safe_dump(scenario))
        self.log = workdir / "agent.log"
        self.command = [
            sys.executable, "-m", "vramguard_agent", "run", "--backend", "sim", "--scenario", str(self.scenario),
            "--node", node, "--kubeconfig", kubeconfig, "--sample-interval", "1s",
            "--min-report-interval", "1s", "--heartbeat", "3s", "--metrics-address", "",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("api", "agent", "sim"))}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command, env=env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def sim_scenario(node: str, pods: Iterable[tuple[str, str, str]]) -> dict[str, Any]:
    """A simulated node with one 80 GB GPU and ``(namespace, name, vram)`` pods,
    each one container ``main`` with one process of constant VRAM."""
    return {"nodes": [{
        "name": node,
        "gpus": [{"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory": "81559Mi", "reserved": "579Mi"}],
        "pods": [{"namespace": ns, "name": name, "containers": [
            {"name": "main", "ram": "1Gi", "processes": [{"gpu": 0, "memory": vram}]}]}
                 for ns, name, vram in pods],
    }]}
