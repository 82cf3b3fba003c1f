"""The chart as shipped on the real node (issue 27, docs/install.md "Images"):
the images that hack/images/build.sh wrote as OCI archives, imported into the
real node's containerd, and ``helm install`` with the README's command and
only image, pull-policy and placement values changed (plus the test-only
``agent.simulatedDriverDir``). Shared by tests/e2e/test_shipped_e2e.py and
the benchmark tests/bench/test_shipped_bench.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from .conftest import CACHE, Cluster
from .realnode import ROOT, TAINT, RealNode
from .test_real_node_e2e import until

NAMESPACE = "vramguard-system"
RELEASE = "vramguard"
CHART = ROOT / "charts" / "vramguard"
TAG = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
SIM_TAG = f"{TAG}-sim"
POD_EXTRA = "authentication.kubernetes.io/pod-name"


def archive(component: str, tag: str) -> Path:
    """The OCI archive hack/images/build.sh writes for ``vramguard/<component>:<tag>``."""
    out = Path(os.environ.get("VG_IMAGES_OUT", CACHE / "images"))
    return out / f"vramguard-{component}-{tag}.oci.tar"


def missing_images() -> str | None:
    """Why the images cannot be used (None: both archives are there)."""
    wanted = [archive("operator", TAG), archive("agent", SIM_TAG)]
    absent = [str(p) for p in wanted if not p.is_file()]
    return f"no image archives {absent}: run hack/images/build.sh --with-sim (make test does)" if absent else None


def real_node_values(node: RealNode) -> dict[str, Any]:
    """What a user changes for the real node: pull policy (the images are
    imported, never pulled), the agent's tag with the simulators, placement
    on real-node-1 (its hostname label and its taint) and the test-only
    simulated driver directory."""
    toleration = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    on_node = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node.name]}]}
    return {
        "operator": {"image": {"pullPolicy": "Never"},
                     "nodeSelector": {"kubernetes.io/hostname": node.name}, "tolerations": toleration},
        "agent": {"image": {"tag": SIM_TAG, "pullPolicy": "Never"},
                  "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [on_node]}},
                  "tolerations": toleration, "simulatedDriverDir": str(node.simgpu_dir)},
    }


def rfc3339(value: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (the API's ``2026-01-01T00:00:00Z``,
    the audit log's ``...00.123456Z``)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass
class Release:
    """The chart installed on the real node: helm, the cluster, the values file."""

    cluster: Cluster
    node: RealNode
    helm: str
    values: Path
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
        """Run a command with the cluster's KUBECONFIG and helm first on PATH; fails on a non-zero exit."""
        env = {**self.cluster.env(), "PATH": f"{Path(self.helm).parent}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"`{' '.join(args)}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def import_images(self, *archives: Path) -> float:
        """``ctr -n k8s.io images import`` of each archive into the real node's containerd; seconds taken."""
        t0 = time.monotonic()
        for path in archives:
            self.run(self.node.ctr, "--address", str(self.node.state / "run/containerd.sock"), "-n", "k8s.io",
                     "images", "import", str(path))
        return time.monotonic() - t0

    def install(self) -> float:
        """The README's install commands with the values file; seconds until both pods are Ready."""
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        self.cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
        t0 = time.monotonic()
        self.run(self.helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout", "5m",
                 "--values", str(self.values))
        self.run("kubectl", "-n", NAMESPACE, "rollout", "status", "deployment/vramguard-operator", "--timeout", "2m")
        self.run("kubectl", "-n", NAMESPACE, "rollout", "status", "daemonset/vramguard-agent", "--timeout", "2m")
        return time.monotonic() - t0

    def uninstall(self) -> None:
        """helm uninstall (if installed) and the namespace deleted, waiting for both."""
        listed = self.run(self.helm, "list", "-n", NAMESPACE, "-q").stdout.split()
        if RELEASE in listed:
            self.run(self.helm, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "2m")
        self.cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s", check=False)

    def pod(self, component: str) -> dict[str, Any]:
        """The one running pod of ``operator`` or ``agent``."""
        out = self.cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l",
                                   f"app.kubernetes.io/component={component}", "-o", "json").stdout
        pods = [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 1, f"{component}: {[p['metadata']['name'] for p in pods]}"
        return pods[0]

    def host_pid(self, pod: dict[str, Any]) -> int:
        """The host PID of the pod's first container, from containerd's task list."""
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        return until(f"containerd task of {pod['metadata']['name']}", lambda: self.node.host_pid(cid), timeout=10)

    def logs(self) -> str:
        """The last lines of both containers' logs, for failure messages."""
        parts = []
        for component in ("operator", "agent"):
            out = self.cluster.kubectl("logs", "-n", NAMESPACE, "-l", f"app.kubernetes.io/component={component}",
                                       "--tail=30", "--previous=false", check=False)
            parts.append(f"--- {component} ---\n{out.stdout}{out.stderr}")
        return "\n".join(parts)


def started_at(pod: dict[str, Any]) -> float:
    """When the pod's first container started (the kubelet's containerStatuses, whole seconds)."""
    return rfc3339(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])


def pod_requests(events: list[dict[str, Any]], pod_name: str) -> list[dict[str, Any]]:
    """The audit events of requests made with the token bound to ``pod_name``
    (the API server records the pod a ServiceAccount token is bound to in the
    user's extra ``authentication.kubernetes.io/pod-name``)."""
    return [ev for ev in events if pod_name in ((ev.get("user") or {}).get("extra") or {}).get(POD_EXTRA, ())]


def first_write(events: list[dict[str, Any]], resource: str, subresource: str | None = None) -> float | None:
    """The stage time of the first successful write to ``resource`` (and ``subresource``) among ``events``."""
    times = [rfc3339(ev["stageTimestamp"]) for ev in events
             if ev.get("verb") in ("create", "update", "patch")
             and (ev.get("objectRef") or {}).get("resource") == resource
             and (ev.get("objectRef") or {}).get("subresource") == subresource
             and (ev.get("responseStatus") or {}).get("code", 0) < 300]
    return min(times) if times else None
