"""The demo's workload on the real node (hack/demo/run.py, docs/demo.md "The real node").

Where the local cluster has its real node (docs/real-node.md: a kubelet and
containerd on this machine, and a simulated GPU driver that real processes
use), the demo also runs one real workload there, in a namespace of its own
(``vg-demo-realnode``, so that the scenario's expectations are untouched):
``simcuda`` holding 4Gi of the simulated H100, then 8Gi after 30 s, under a
budget of 6Gi per pod that annotates it and then throttles it to 100m CPU.
A real agent (``vramguard-agent run --backend simdriver --simgpu-socket``, in real time) reads it
through NVML and /proc/<pid>/cgroup; the throttle is a real ``pods/resize``
that the real kubelet applies to the container's cgroup. The summary says
which parts of the run were real, with what was read back from the kernel.

``--real-node auto`` (the default) runs it where the node is Ready and its
driver answers, and says why not otherwise; ``on`` makes that an error;
``off`` leaves it out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import localkube  # hack/cluster/localkube.py (run.py puts hack/cluster on sys.path)

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "vg-demo-realnode"
POD = "real-embedder"
GI = 1 << 30
GROWS_AFTER_S = 30
THROTTLE_TO = "100m"


def settings() -> dict[str, str]:
    """The real node's names and paths, from hack/cluster/versions.sh (as up.sh sees them)."""
    return localkube.settings("REAL_NODE_NAME", "WORKLOAD_IMAGE", "SIMGPU_DIR", "SIMGPU_SOCKET", "K8S_VERSION",
                              "CONTAINERD_VERSION")


def objects(s: Mapping[str, str]) -> list[dict[str, Any]]:
    """The namespace, the budget and the pod (a Burstable pod with a 500m CPU limit)."""
    taint = "vramguard.io/real-node"
    schedule = [str(4 * GI)] * GROWS_AFTER_S + [str(8 * GI)]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryBudget",
         "metadata": {"name": POD, "namespace": NAMESPACE},
         "spec": {"selector": {"matchLabels": {"app": POD}}, "limits": {"perPod": {"vram": "6Gi"}},
                  "enforcement": {"mode": "Enforce", "escalation": [
                      {"action": "Annotate", "after": "0s"},
                      {"action": "Throttle", "after": "20s", "cpuLimit": THROTTLE_TO}]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NAMESPACE, "labels": {"app": POD}},
         "spec": {
             "nodeSelector": {taint: "true"},
             "tolerations": [{"key": taint, "operator": "Exists", "effect": "NoSchedule"}],
             "automountServiceAccountToken": False,
             "containers": [{
                 "name": "main", "image": s["WORKLOAD_IMAGE"], "imagePullPolicy": "Never",
                 "command": ["/bin/simcuda", "--every", "1s", *schedule],
                 "resources": {"requests": {"cpu": "100m", "memory": "16Mi"},
                               "limits": {"cpu": "500m", "memory": "64Mi"}},
                 "volumeMounts": [{"name": "simgpu", "mountPath": "/run/simgpu"}],
             }],
             "volumes": [{"name": "simgpu", "hostPath": {"path": s["SIMGPU_DIR"], "type": "Directory"}}],
         }},
    ]


def cpu_quota(pid: int) -> tuple[str, Path] | None:
    """The CFS quota of ``pid``'s cgroup as the kernel has it (v1 ``cpu.cfs_quota_us`` in microseconds per
    100 ms period, v2 ``cpu.max``) and the file it came from; None when unreadable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):  # v1: mounted as cpu,cpuacct or as cpu
            files = [Path("/sys/fs/cgroup", d, path.lstrip("/"), "cpu.cfs_quota_us") for d in (controllers, "cpu")]
        elif controllers == "":  # v2
            files = [Path("/sys/fs/cgroup", path.lstrip("/"), "cpu.max")]
        else:
            continue
        for f in files:
            if f.exists():
                return f.read_text().strip(), f
    return None


class RealNodePart:
    """The real node's workload in one demo run; ``say`` prints a progress line."""

    def __init__(self, mode: str, kubectl: Callable[..., subprocess.CompletedProcess[str]],
                 say: Callable[[str], None]) -> None:
        self.mode = mode
        self.kubectl = kubectl
        self.say = say
        self.s: dict[str, str] = {}
        self.active = False
        self.pid: int | None = None
        self.quotas: list[str] = []  # each distinct quota read, in order
        self.quota_file: Path | None = None

    def why_not(self) -> str | None:
        """Why the real node cannot take part, or None when it can."""
        self.s = settings()
        node = self.kubectl("get", "node", self.s["REAL_NODE_NAME"], "-o", "json", check=False)
        if node.returncode != 0:
            return f"no node {self.s['REAL_NODE_NAME']} (hack/cluster/up.sh's output says why)"
        ready = [c["status"] for c in json.loads(node.stdout)["status"].get("conditions", []) if c["type"] == "Ready"]
        if ready != ["True"]:
            return f"node {self.s['REAL_NODE_NAME']} is not Ready"
        if not Path(self.s["SIMGPU_SOCKET"]).is_socket():
            return f"no simulated GPU driver at {self.s['SIMGPU_SOCKET']}"
        return None

    def start(self) -> None:
        """Create its objects when the real node can take part (RuntimeError for ``on`` when it cannot)."""
        if self.mode == "off":
            self.say("real node: off (--real-node off)")
            return
        why = self.why_not()
        if why is not None:
            if self.mode == "on":
                raise RuntimeError(f"real node: {why} (--real-node on)")
            self.say(f"real node: skipped: {why}")
            return
        self.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s")
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                            "items": objects(self.s)}))
        localkube.wait(self.kubectl, "-n", NAMESPACE, f"pod/{POD}", "--for=condition=Ready", timeout_s=120)
        self.active = True
        self.say(f"real node: pod {NAMESPACE}/{POD} runs on {self.s['REAL_NODE_NAME']} (real kubelet and "
                 f"containerd), holding 4Gi of the simulated GPU, 8Gi after {GROWS_AFTER_S} s; budget 6Gi")

    def agent_argv(self, kubeconfig: str) -> list[str]:
        """The real node's agent: backend simdriver (its NVML calls answered by the simulated driver), in real time."""
        return [sys.executable, "-m", "vramguard_agent", "run", "--node", self.s["REAL_NODE_NAME"],
                "--kubeconfig", kubeconfig, "--backend", "simdriver", "--simgpu-socket", self.s["SIMGPU_SOCKET"],
                "--sample-interval", "2s", "--min-report-interval", "1s", "--heartbeat", "10s", "--metrics-address", ""]

    def observe(self) -> None:
        """Read the process's host PID (from the driver's state) and its CPU quota (from the kernel)."""
        if not self.active:
            return
        if self.pid is None:
            from vramguard_sim.drivernvml import query

            try:
                procs = query(self.s["SIMGPU_SOCKET"])["devices"][0]["processes"]
            except (OSError, ValueError):
                return
            self.pid = procs[0]["pid"] if len(procs) == 1 else None
        read = cpu_quota(self.pid) if self.pid is not None else None
        if read is not None:
            self.quota_file = read[1]
            if not self.quotas or self.quotas[-1] != read[0]:
                self.quotas.append(read[0])

    def namespaces(self, scenario: Iterable[str]) -> list[str]:
        """The scenario's namespaces, and the real node's when it takes part."""
        return [*scenario, *([NAMESPACE] if self.active else [])]

    def summary(self, events_of: Callable[[list[str]], list[dict[str, Any]]]) -> list[str]:
        """What was real in this run, and what the real workload went through (``events_of``
        lists the Events of namespaces)."""
        events = events_of([NAMESPACE]) if self.active else []
        lines = ["== What was real ==",
                 "real: kube-apiserver, etcd, kube-scheduler, kube-controller-manager; the operator and the agents "
                 "(this checkout's code, as host processes, not containers: make test runs the images)"]
        if self.active:
            s = self.s
            ours = sorted((e for e in events if (e.get("source") or {}).get("component") == "vramguard"),
                          key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
            reasons = [e.get("reason") for e in ours]
            lines += [
                f"real on {s['REAL_NODE_NAME']}: kubelet {s['K8S_VERSION']}, containerd {s['CONTAINERD_VERSION']}, runc; "
                f"pod {NAMESPACE}/{POD} as host PID {self.pid}, attributed by the agent through /proc/{self.pid}/cgroup",
                f"  vramguard's Events on it: {', '.join(dict.fromkeys(r for r in reasons if r)) or 'none'}",
                "  its CPU quota as the kernel had it: " + (" -> ".join(self.quotas) or "not read")
                + (f" ({self.quota_file})" if self.quota_file else ""),
            ]
        lines.append("simulated: every GPU (the kwok nodes' by the agents' sim backend at the scenario's speed"
                     + ("; real-node-1's by the simulated driver, in real time, its memory asked for by the real "
                        "process" if self.active else "") + "); the kwok nodes' kubelets (kwok, and the demo's "
                     "stand-in for their resize status)")
        return lines

    def remove(self) -> None:
        if self.active:
            self.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
            self.kubectl("delete", "nodegpuusages.vramguard.io", self.s["REAL_NODE_NAME"], "--ignore-not-found",
                         check=False)
