"""Session fixture for end-to-end tests: the local cluster (a real kube-apiserver,
etcd, controller-manager and scheduler started by kwokctl, with kwok simulating
the GPU nodes), started or reused through hack/cluster/up.sh, with the CRDs
installed and Established; and the real node (a kubelet and containerd on this
machine, docs/real-node.md) where up.sh could start it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .realnode import RealNode, localkube, settings

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("VG_CACHE", Path.home() / ".cache" / "vramguard"))


@dataclass
class Cluster:
    """Handle on the local cluster for tests."""

    kubeconfig: str
    helm: str | None
    real_node_note: str = ""
    """What up.sh said about the real node ("up: real node: ..." lines)."""

    def env(self) -> dict[str, str]:
        """The process environment with KUBECONFIG pointing at the cluster."""
        return {**os.environ, "KUBECONFIG": self.kubeconfig}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster; raises CalledProcessError when check and it fails."""
        return subprocess.run(
            [localkube.kubectl_binary(), *args], input=input, env=self.env(), capture_output=True, text=True,
            check=check, timeout=120,
        )

    def wait(self, *args: str, timeout_s: float = 60.0) -> str:
        """``kubectl wait ARGS``, retried until ``timeout_s`` while the object is new (its status absent
        or null) or not there yet (localkube.wait); RuntimeError after it."""
        return localkube.wait(self.kubectl, *args, timeout_s=timeout_s)

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient for the cluster."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)


def _helm() -> str | None:
    """The helm binary that hack/cluster/build.sh built (its path comes from versions.sh)."""
    path = Path(localkube.settings("HELM_BIN")["HELM_BIN"], "helm")
    return str(path) if path.exists() else None


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """Start or reuse the local cluster and install the CRDs (session-wide)."""
    up = subprocess.run([str(ROOT / "hack/cluster/up.sh")], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.fail(f"hack/cluster/up.sh failed:\n{up.stdout}\n{up.stderr}")
    kubeconfig = up.stdout.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")
    note = "; ".join(line.removeprefix("up: real node: ") for line in up.stdout.splitlines()
                     if line.startswith("up: real node: "))
    c = Cluster(kubeconfig=kubeconfig, helm=_helm(), real_node_note=note)
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    names = [
        f"crd/{p.name.split('_', 1)[1].removesuffix('.yaml')}.vramguard.io" for p in (ROOT / "crds").glob("*.yaml")
    ]
    c.wait("--for=condition=Established", *names, timeout_s=60)
    return c


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> RealNode:
    """The real node, Ready and run by a real kubelet; the test is skipped, saying
    why, where up.sh did not start it (VG_REAL_NODE, docs/real-node.md)."""
    s = settings()
    node = cluster.kubectl("get", "node", s["REAL_NODE_NAME"], "-o", "json", check=False)
    if node.returncode != 0:
        pytest.skip(f"no real node in this cluster: {cluster.real_node_note or 'up.sh said nothing about it'}")
    obj = json.loads(node.stdout)
    ready = [c["status"] for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
    if ready != ["True"]:
        pytest.skip(f"real node {s['REAL_NODE_NAME']} is not Ready ({cluster.real_node_note})")
    return RealNode(
        name=s["REAL_NODE_NAME"], state=Path(s["REAL_NODE_STATE"]), ctr=f"{s['CONTAINERD_BIN']}/ctr",
        image=s["WORKLOAD_IMAGE"], kubelet_version=s["K8S_VERSION"], containerd_version=s["CONTAINERD_VERSION"],
        simgpu_dir=Path(s["SIMGPU_DIR"]), simgpu_socket=Path(s["SIMGPU_SOCKET"]),
    )


@pytest.fixture
def gpu_node(real_node: RealNode) -> RealNode:
    """The real node with its simulated GPU driver answering (docs/real-node.md); skipped, saying why, otherwise."""
    if not real_node.simgpu_socket.is_socket():
        pytest.skip(f"no simulated GPU driver at {real_node.simgpu_socket} (up.sh's output says why; needs make venv)")
    return real_node


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Any:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-") + "-" + digest
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
