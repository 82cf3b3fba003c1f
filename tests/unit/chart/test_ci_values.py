"""Every values file in charts/vramguard/ci/ starts a real operator process: the chart
rendered with it (helm template), the operator container's arguments and environment
taken from the Deployment, and ``vramguard`` run with them as the pod would run it.

Without cluster credentials the real process parses every flag and variable, builds
its settings, and then stops at the credentials check with exit status 1 and its
one-line message; a flag the operator does not take (the chart once passed
``--log-format=json`` before the operator had it) exits 2 naming the flag. The
end-to-end chart test (tests/e2e/test_chart_e2e.py) runs the operator against the
local cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helm import CHART, ROOT, find, find_helm, render

VALUES = sorted((CHART / "ci").glob("*.yaml"))

pytestmark = pytest.mark.skipif(find_helm() is None, reason="no helm (hack/cluster/build.sh builds it)")


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_the_operator_takes_every_argument_the_chart_gives_it(values: Path, tmp_path: Path):
    [deployment] = [d for d in find(render(values_files=[values]), "Deployment")
                    if d["metadata"]["name"].endswith("operator")]
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none"),
           "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("api", "operator", "agent"))}
    env.update({e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e})
    args = list(container["args"])
    # The pod's mounts (the state key Secret, the webhook's TLS Secret) as directories here,
    # each file the Secret would hold written with content of its kind.
    for mount in container.get("volumeMounts", []):
        here = tmp_path / mount["mountPath"].lstrip("/")
        here.mkdir(parents=True, exist_ok=True)
        (here / "state-key").write_bytes(os.urandom(32))
        args = [a.replace(mount["mountPath"], str(here)) for a in args]
    done = subprocess.run([sys.executable, "-m", "vramguard_operator", *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert "Traceback" not in done.stderr
    assert done.returncode == 1 and "no Kubernetes credentials" in done.stderr, (container["args"], done.stderr)
