"""The demo's workload on the real node (hack/demo/realnode.py): its objects and its summary."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "hack" / "cluster"))  # localkube, as hack/demo/run.py does
_spec = importlib.util.spec_from_file_location("demo_realnode", ROOT / "hack" / "demo" / "realnode.py")
assert _spec is not None and _spec.loader is not None
R = importlib.util.module_from_spec(_spec)
sys.modules["demo_realnode"] = R
_spec.loader.exec_module(R)

SETTINGS = {"REAL_NODE_NAME": "real-node-1", "WORKLOAD_IMAGE": "vramguard.local/busybox:1",
            "SIMGPU_DIR": "/state/simgpu", "SIMGPU_SOCKET": "/state/simgpu/driver.sock",
            "K8S_VERSION": "v1.36.3", "CONTAINERD_VERSION": "v2.2.9"}


def test_the_pod_runs_on_the_real_node_with_the_driver_mounted_and_outgrows_its_budget():
    ns, budget, pod = R.objects(SETTINGS)
    assert ns["metadata"]["name"] == R.NAMESPACE == budget["metadata"]["namespace"] == pod["metadata"]["namespace"]
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"vramguard.io/real-node": "true"}
    assert spec["volumes"] == [{"name": "simgpu", "hostPath": {"path": "/state/simgpu", "type": "Directory"}}]
    container = spec["containers"][0]
    assert container["imagePullPolicy"] == "Never" and container["command"][:3] == ["/bin/simcuda", "--every", "1s"]
    sizes = [int(x) for x in container["command"][3:]]
    # Within the budget's 6Gi for GROWS_AFTER_S seconds, then above it.
    assert sizes[: R.GROWS_AFTER_S] == [4 * R.GI] * R.GROWS_AFTER_S and sizes[-1] == 8 * R.GI
    assert budget["spec"]["limits"] == {"perPod": {"vram": "6Gi"}}
    assert budget["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
    steps = budget["spec"]["enforcement"]["escalation"]
    assert [s["action"] for s in steps] == ["Annotate", "Throttle"] and steps[1]["cpuLimit"] == R.THROTTLE_TO
    assert container["resources"]["limits"]["cpu"] == "500m"


def _kubectl(*args: str, **_: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["kubectl", *args], 1, "", "NotFound")


def test_off_and_a_missing_node_say_so_and_the_summary_says_what_was_simulated():
    said: list[str] = []
    part = R.RealNodePart("off", _kubectl, said.append)
    part.start()
    assert said == ["real node: off (--real-node off)"] and not part.active
    part = R.RealNodePart("auto", _kubectl, said.append)
    part.start()
    assert said[-1].startswith("real node: skipped: no node real-node-1") and not part.active
    lines = part.summary(lambda namespaces: [])
    assert part.namespaces(["a"]) == ["a"]
    assert lines[0] == "== What was real ==" and not any(line.startswith("real on") for line in lines)
    assert lines[-1].startswith("simulated: every GPU") and "real-node-1's" not in lines[-1]


def test_on_is_an_error_where_the_node_is_missing():
    part = R.RealNodePart("on", _kubectl, lambda _: None)
    with pytest.raises(RuntimeError, match=r"no node real-node-1 .*\(--real-node on\)"):
        part.start()
