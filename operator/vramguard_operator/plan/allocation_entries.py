"""Index entries of what allocates GPU memory to pods (``resource.k8s.io/v1``):
ResourceClaims and ResourceSlices, trimmed to what ``policy.dra`` reads. Pure.

The operator reads both through kopf's list and watch only (RBAC: list, watch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramguard_operator.plan.entries import plain

DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
CLAIMS, SLICES = "resourceclaims", "resourceslices"


def claim_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim: name, namespace, uid; its allocation results (``request``,
    ``driver``, ``pool``, ``device``, ``shareID``, ``consumedCapacity``) and
    ``reservedFor``."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    allocation = status.get("allocation") or {}
    results = [
        {k: plain(r[k]) for k in ("request", "driver", "pool", "device", "shareID", "consumedCapacity") if k in r}
        for r in (allocation.get("devices") or {}).get("results") or ()
    ]
    trimmed: dict[str, Any] = {}
    if allocation:
        trimmed["allocation"] = {"devices": {"results": results}}
    if status.get("reservedFor"):
        trimmed["reservedFor"] = [plain(r) for r in status["reservedFor"]]
    return {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid")},
        "status": trimmed,
    }


def slice_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice: driver, pool (name, generation), node, and each device's
    name, attributes and capacity values (request policies left out)."""
    spec = body.get("spec") or {}
    pool = spec.get("pool") or {}
    devices = []
    for d in spec.get("devices") or ():
        capacity = {k: {"value": plain((v or {}).get("value"))} for k, v in (d.get("capacity") or {}).items()}
        devices.append({"name": d.get("name"), "attributes": plain(d.get("attributes") or {}), "capacity": capacity})
    return {
        "metadata": {"name": (body.get("metadata") or {}).get("name")},
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": {"name": pool.get("name"), "generation": pool.get("generation")},
            "devices": devices,
        },
    }
