"""Builders for resource.k8s.io/v1 objects as the API server returns them
(ResourceSlice, ResourceClaim) and for pods that use claims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DRIVER = "gpu.nvidia.com"


def gpu(name: str, uuid: str | None, memory: str | None = "80Gi", shared: bool = True, **attrs: Any) -> dict[str, Any]:
    """A device entry of a ResourceSlice (NVIDIA's attribute names)."""
    attributes: dict[str, Any] = {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100 80GB HBM3"}}
    if uuid is not None:
        attributes["uuid"] = {"string": uuid}
    attributes.update(attrs)
    dev: dict[str, Any] = {"name": name, "attributes": attributes}
    if memory is not None:
        dev["capacity"] = {"memory": {"value": memory}}
    if shared:
        dev["allowMultipleAllocations"] = True
    return dev


def resource_slice(node: str, devices: list[dict[str, Any]], generation: int = 1, driver: str = DRIVER) -> dict[str, Any]:
    """A ResourceSlice of ``node``'s pool (pool named after the node)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def result(device: str, pool: str, memory: str | None = None, request: str = "gpu", driver: str = DRIVER) -> dict[str, Any]:
    """An allocation result; ``memory`` set means consumed capacity (a shared device)."""
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if memory is not None:
        r["shareID"] = f"share-{device}-{memory}"
        r["consumedCapacity"] = {"memory": memory}
    return r


def claim(name: str, results: list[dict[str, Any]] | None, reserved_for: Sequence[str] = (), ns: str = "ml") -> dict[str, Any]:
    """A ResourceClaim, allocated with ``results`` (None: not allocated) and
    reserved for the pods named in ``reserved_for``."""
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {"devices": {"results": results}}
    if reserved_for:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved_for]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": f"claim-uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": status,
    }


def claim_pod(
    name: str, claims: Sequence[str] = (), templates: dict[str, str] | None = None, ns: str = "ml", node: str = "gpu-h100-ts"
) -> dict[str, Any]:
    """A running pod using ResourceClaims: ``claims`` by name, and ``templates``
    (pod claim name -> generated claim name) through ResourceClaimTemplates."""
    refs = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    refs += [{"name": k, "resourceClaimTemplateName": f"tpl-{k}"} for k in (templates or {})]
    statuses = [{"name": k, "resourceClaimName": v} for k, v in (templates or {}).items()]
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": {}},
        "spec": {
            "nodeName": node,
            "resourceClaims": refs,
            "containers": [{"name": "main", "resources": {"claims": [{"name": r["name"]} for r in refs]}}],
        },
        "status": {"phase": "Running", "resourceClaimStatuses": statuses},
    }
