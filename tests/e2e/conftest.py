"""Session fixture for end-to-end tests: the local cluster (a real kube-apiserver,
etcd, controller-manager and scheduler started by kwokctl, with kwok simulating
the GPU nodes), started or reused through hack/cluster/up.sh, with the CRDs
installed and Established."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("VG_CACHE", Path.home() / ".cache" / "vramguard"))


@dataclass
class Cluster:
    """Handle on the local cluster for tests."""

    kubeconfig: str
    helm: str | None

    def env(self) -> dict[str, str]:
        """The process environment with KUBECONFIG pointing at the cluster."""
        return {**os.environ, "KUBECONFIG": self.kubeconfig}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster; raises CalledProcessError when check and it fails."""
        return subprocess.run(
            ["kubectl", *args], input=input, env=self.env(), capture_output=True, text=True, check=check, timeout=120
        )

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient for the cluster."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)


def _helm() -> str | None:
    """The helm binary that hack/cluster/build.sh built (its path comes from versions.sh)."""
    out = subprocess.run(
        ["bash", "-c", f"source {ROOT / 'hack/cluster/versions.sh'} && echo $HELM_BIN/helm"],
        capture_output=True, text=True, check=True,
    )
    path = Path(out.stdout.strip())
    return str(path) if path.exists() else None


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """Start or reuse the local cluster and install the CRDs (session-wide)."""
    up = subprocess.run([str(ROOT / "hack/cluster/up.sh")], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.fail(f"hack/cluster/up.sh failed:\n{up.stdout}\n{up.stderr}")
    kubeconfig = up.stdout.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")
    c = Cluster(kubeconfig=kubeconfig, helm=_helm())
    c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    names = [
        f"crd/{p.name.split('_', 1)[1].removesuffix('.yaml')}.vramguard.io" for p in (ROOT / "crds").glob("*.yaml")
    ]
    c.kubectl("wait", "--for=condition=Established", *names, "--timeout=60s")
    return c


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Any:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-") + "-" + digest
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
