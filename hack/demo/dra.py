"""The demo's DRA part (pure): the ResourceSlices the stand-in DRA driver
publishes for the demo's nodes, and the limits vramguard took from DRA claims.

The scenario's ``draDevices`` names, per node, the devices handed to DRA (as
on a real node, a GPU is either the device plugin's, counted in
``nvidia.com/gpu``, or the DRA driver's, never both: the scheduler would book
it twice). They are published as ``hack/cluster/dra_driver.py`` publishes any
device: NVIDIA's attributes, ``capacity.memory`` with consumable capacity,
``allowMultipleAllocations: true``, and the UUIDs the simulated agents report.
The real kube-scheduler then allocates the demo's claims on them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from vramguard_sim.scenario import Scenario

_DRIVER_PATH = Path(__file__).resolve().parents[1] / "cluster" / "dra_driver.py"


def _load_driver() -> ModuleType:
    """hack/cluster/dra_driver.py (a script, not a package), loaded once per process."""
    if "dra_driver" in sys.modules:  # loaded already (tests/e2e/test_dra_e2e.py does the same)
        return sys.modules["dra_driver"]
    spec = importlib.util.spec_from_file_location("dra_driver", _DRIVER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dra_driver"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


driver = _load_driver()

LIMITS_ANNOTATION = "vramguard.io/limits"  # docs/allocations.md, "What you see"
DEVICE_CLASSES = _DRIVER_PATH.parent / "dra-deviceclasses.yaml"


def slices(nodes: Sequence[Mapping[str, Any]], dra_devices: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    """One ResourceSlice (``resource.k8s.io/v1``, API-form dict) per node of
    ``dra_devices`` with the named devices of that node (``gpu-<index>``,
    ``gpu-<index>-mig-<profile>-<slot>``, as ``dra_driver`` names them);
    ``nodes``: the demo scenario's nodes (their ``pods`` are ignored).
    Raises ``ValueError`` naming the node or device the scenario does not have."""
    known = {str(n["name"]): n for n in nodes}
    out = []
    for node, names in dra_devices.items():
        if node not in known:
            raise ValueError(f"draDevices: node {node!r} is not in nodes")
        spec = {k: v for k, v in known[node].items() if k != "pods"}
        devices = {d.name: d for d in driver.devices_from_scenario(Scenario.model_validate({"nodes": [spec]}))[node]}
        missing = [n for n in names if n not in devices]
        if missing:
            raise ValueError(f"draDevices: node {node}: no devices {missing} (it has {sorted(devices)})")
        out.append(driver.resource_slice(node, [devices[n] for n in names]))
    return out


@dataclass(frozen=True)
class ClaimLimit:
    """A per-device limit vramguard took from a DRA claim (the pod's
    ``vramguard.io/limits`` entry): ``key`` ``perDevice[<uuid>]``, ``limit`` a
    quantity, ``source`` ``dra/<claim>``, ``detail`` what was consumed where."""

    id: str
    key: str
    limit: str
    source: str
    detail: str

    def text(self) -> str:
        """One summary line."""
        return f"{self.id}: {self.limit} {self.key} from {self.source} ({self.detail})"


def claim_limits(pods: Mapping[str, Mapping[str, Any]]) -> list[ClaimLimit]:
    """The limits from DRA claims in the ``vramguard.io/limits`` annotation of
    ``pods`` (API Pod dicts by demo id), by id; an annotation that is not a JSON
    object of entries is skipped (the operator writes it; a stale or foreign
    value is not the demo's to judge)."""
    out = []
    for pid, pod in sorted(pods.items()):
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(LIMITS_ANNOTATION)
        try:
            entries = json.loads(raw) if raw else {}
        except ValueError:
            continue
        if not isinstance(entries, dict):
            continue
        for key, e in sorted(entries.items()):
            if isinstance(e, dict) and str(e.get("source", "")).startswith("dra/"):
                out.append(ClaimLimit(pid, key, str(e.get("limit", "")), str(e["source"]), str(e.get("detail", ""))))
    return out
