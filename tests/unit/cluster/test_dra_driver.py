"""The local cluster's stand-in DRA driver (hack/cluster/dra_driver.py): its
devices carry the UUIDs and memory the simulated agent reports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

from vramguard_operator.policy.dra import device_index
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import fake_gpus

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("dra_driver", ROOT / "hack" / "cluster" / "dra_driver.py")
assert _spec is not None and _spec.loader is not None
driver = importlib.util.module_from_spec(_spec)
sys.modules["dra_driver"] = driver  # dataclasses look their module up
_spec.loader.exec_module(driver)

MIB = 1 << 20


def demo_agents() -> Scenario:
    """The demo's simulated nodes (their GPUs only)."""
    data = yaml.safe_load((ROOT / "hack/demo/scenario.yaml").read_text())
    return Scenario.model_validate({"nodes": [{"name": n["name"], "gpus": n["gpus"]} for n in data["nodes"]]})


def reported(scenario: Scenario) -> dict[str, dict[str, int]]:
    """UUID -> total bytes of every GPU or MIG device the sim backend shows, by node."""
    out: dict[str, dict[str, int]] = {}
    for node in scenario.nodes:
        devs: dict[str, int] = {}
        for gpu in fake_gpus(node, {}, 0.0):
            if gpu.mig_devices is None:
                devs[gpu.uuid] = gpu.total_bytes
            else:
                devs.update({m.uuid: m.total_bytes for m in gpu.mig_devices})
        out[node.name] = devs
    return out


def published(by_node: dict[str, list]) -> dict[str, dict[str, int]]:
    """UUID -> memory of the devices in the slices, read back as the operator reads them."""
    slices = [driver.resource_slice(n, devs) for n, devs in by_node.items()]
    out: dict[str, dict[str, int]] = {}
    for dev in device_index(slices).values():
        assert dev.uuid is not None and dev.memory is not None and dev.node is not None
        out.setdefault(dev.node, {})[dev.uuid] = dev.memory
    return out


def test_slices_from_a_scenario_match_what_the_sim_agent_reports() -> None:
    scenario = demo_agents()
    assert published(driver.devices_from_scenario(scenario)) == reported(scenario)


def test_slices_from_the_fake_nodes_labels_have_the_demo_agents_uuids() -> None:
    nodes = [d for d in yaml.safe_load_all((ROOT / "hack/cluster/gpu-nodes.yaml").read_text()) if d]
    from_labels = published(driver.devices_from_nodes(nodes))
    from_agents = reported(demo_agents())
    assert set(from_labels) == set(from_agents) == {"gpu-h100-ts", "gpu-a100-mig", "gpu-a10-vgpu"}
    for node, devs in from_labels.items():
        assert set(devs) == set(from_agents[node]), node
    # MIG devices: the profile's memory as GFD labels it, on the MIG UUID
    assert sorted(from_labels["gpu-a100-mig"].values()) == [4864 * MIB, 4864 * MIB, 9856 * MIB, 19968 * MIB]


def test_device_entry_is_shared_with_a_memory_policy() -> None:
    d = driver.Device("gpu-0-mig-1g5gb-2", "MIG-x", 4864 * MIB, "A100", "GPU-p", "1g.5gb")
    entry = driver.device_entry(d)
    assert entry["allowMultipleAllocations"] is True
    assert entry["attributes"]["type"] == {"string": "mig"} and entry["attributes"]["parentUUID"] == {"string": "GPU-p"}
    assert entry["capacity"]["memory"]["value"] == "4864Mi"
    assert entry["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "1Mi", "max": "4864Mi", "step": "1Mi"}
