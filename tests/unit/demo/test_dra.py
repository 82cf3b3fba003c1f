"""The demo's DRA part (hack/demo/dra.py): the ResourceSlice published for the
demo's nodes, and the limits from DRA claims read back from the pods."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import device_uuid

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("demo_dra", ROOT / "hack" / "demo" / "dra.py")
assert _spec is not None and _spec.loader is not None
D = importlib.util.module_from_spec(_spec)
sys.modules["demo_dra"] = D
_spec.loader.exec_module(D)
_plan = importlib.util.spec_from_file_location("demo_plan_dra", ROOT / "hack" / "demo" / "plan.py")
assert _plan is not None and _plan.loader is not None
P = importlib.util.module_from_spec(_plan)
sys.modules["demo_plan_dra"] = P
_plan.loader.exec_module(P)
GI = 1 << 30


def test_the_demo_publishes_gpu_7_of_the_h100_node_with_the_uuid_its_agent_reports():
    sc = P.load_scenario(ROOT / "hack" / "demo" / "scenario.yaml")
    (s,) = D.slices(sc.nodes, sc.dra_devices)
    assert s["kind"] == "ResourceSlice" and s["spec"]["nodeName"] == "gpu-h100-ts"
    (dev,) = s["spec"]["devices"]
    assert dev["name"] == "gpu-7" and dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["memory"]["value"] == "81559Mi"
    node = Scenario.model_validate({"nodes": [{k: v for k, v in sc.nodes[0].items() if k != "pods"}]}).nodes[0]
    assert dev["attributes"]["uuid"] == {"string": device_uuid(node, 7, None)}
    # the demo's claim asks this driver's class for memory, and one pod's process runs on that GPU
    template = next(o for o in sc.objects if o["kind"] == "ResourceClaimTemplate")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == D.driver.DRIVER
    on_gpu7 = [p["id"] for p in sc.nodes[0]["pods"] for c in p["containers"] for x in c["processes"] if x["gpu"] == 7]
    assert on_gpu7 == ["rerank"]


def test_unknown_nodes_and_devices_are_named():
    sc = P.load_scenario(ROOT / "hack" / "demo" / "scenario.yaml")
    with pytest.raises(ValueError, match=r"node gpu-h100-ts: no devices \['gpu-8'\]"):
        D.slices(sc.nodes, {"gpu-h100-ts": ["gpu-8"]})
    with pytest.raises(ValueError, match="node 'nowhere' is not in nodes"):
        D.slices(sc.nodes, {"nowhere": ["gpu-0"]})


def test_claim_limits_from_the_pods_annotation():
    entry = {"bytes": 12 * GI, "limit": "12Gi", "source": "dra/rerank-0-gpu-x7k2q",
             "detail": "12Gi consumed on gpu-7 (gpu.vramguard.test, pool gpu-h100-ts)"}
    share = {"bytes": 21 * GI, "limit": "19.8Gi", "source": "node/time-slicing:4", "detail": ""}
    pods = {
        "rerank": {"metadata": {"annotations": {D.LIMITS_ANNOTATION: json.dumps({"perDevice[GPU-1]": entry})}}},
        "chat": {"metadata": {"annotations": {D.LIMITS_ANNOTATION: json.dumps({"perDevice": share})}}},
        "broken": {"metadata": {"annotations": {D.LIMITS_ANNOTATION: "{not json"}}},
        "listed": {"metadata": {"annotations": {D.LIMITS_ANNOTATION: "[1]"}}},
        "bare": {"metadata": {}},
    }
    (lim,) = D.claim_limits(pods)
    assert (lim.id, lim.key, lim.limit, lim.source) == ("rerank", "perDevice[GPU-1]", "12Gi", "dra/rerank-0-gpu-x7k2q")
    assert lim.text() == ("rerank: 12Gi perDevice[GPU-1] from dra/rerank-0-gpu-x7k2q "
                          "(12Gi consumed on gpu-7 (gpu.vramguard.test, pool gpu-h100-ts))")


def test_draDevices_naming_an_unknown_node_is_refused(tmp_path):
    text = (ROOT / "hack" / "demo" / "scenario.yaml").read_text().replace("  gpu-h100-ts: [gpu-7]", "  gpu-x: [gpu-7]")
    bad = tmp_path / "s.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"draDevices: unknown nodes \['gpu-x'\]"):
        P.load_scenario(bad)
