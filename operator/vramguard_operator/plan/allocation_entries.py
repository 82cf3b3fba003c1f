"""Index entries of what allocates GPU memory to pods (``resource.k8s.io``, at
the version the cluster serves: ``dra_versions``; trimmed to the v1 shape):
ResourceClaims and ResourceSlices, trimmed to what ``policy.dra`` reads. Pure.

The operator reads both through kopf's list and watch only (RBAC: list, watch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramguard_operator.plan.entries import plain

DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"  # DRA_VERSION: when discovery says nothing
CLAIMS, SLICES = "resourceclaims", "resourceslices"


def claim_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim: name, namespace, uid; its allocation results (``request``,
    ``driver``, ``pool``, ``device``, ``shareID``, ``consumedCapacity``), its
    allocation's and spec's device configs (``requests``, ``opaque``: the DRA
    driver's MPS limits, ``policy.dra_config``) and ``reservedFor``."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    allocation = status.get("allocation") or {}
    devices = allocation.get("devices") or {}
    results = [
        {k: plain(r[k]) for k in ("request", "driver", "pool", "device", "shareID", "consumedCapacity") if k in r}
        for r in devices.get("results") or ()
    ]
    trimmed: dict[str, Any] = {}
    if allocation:
        trimmed["allocation"] = {"devices": {"results": results}}
        if devices.get("config"):
            trimmed["allocation"]["devices"]["config"] = _configs(devices["config"])
    if status.get("reservedFor"):
        trimmed["reservedFor"] = [plain(r) for r in status["reservedFor"]]
    entry: dict[str, Any] = {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")}, "status": trimmed}
    spec_config = ((body.get("spec") or {}).get("devices") or {}).get("config")
    if spec_config:
        entry["spec"] = {"devices": {"config": _configs(spec_config)}}
    return entry


def _configs(configs: Any) -> list[dict[str, Any]]:
    return [{k: plain(c[k]) for k in ("source", "requests", "opaque") if k in c} for c in configs or ()]


def slice_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice: driver, pool (name, generation), node, and each device's
    name, attributes, capacity values (request policies left out) and
    ``allowMultipleAllocations``."""
    spec = body.get("spec") or {}
    pool = spec.get("pool") or {}
    devices = []
    for d in spec.get("devices") or ():
        fields = d.get("basic") or d  # v1beta1 nests a device's fields under "basic"
        capacity = {k: {"value": plain((v or {}).get("value"))} for k, v in (fields.get("capacity") or {}).items()}
        entry = {"name": d.get("name"), "attributes": plain(fields.get("attributes") or {}), "capacity": capacity}
        if fields.get("allowMultipleAllocations") is True:
            entry["allowMultipleAllocations"] = True
        devices.append(entry)
    return {
        "metadata": {"name": (body.get("metadata") or {}).get("name")},
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": {"name": pool.get("name"), "generation": pool.get("generation")},
            "devices": devices,
        },
    }
