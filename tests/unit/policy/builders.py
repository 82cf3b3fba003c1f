"""Builders for policy, node, pod and report test objects. Nodes default to the
local cluster's fake GPU nodes (hack/cluster/gpu-nodes.yaml), read from the file
so that the tests follow what GPU feature discovery publishes there."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.policy.node import NodeFacts

from ..engine.builders import stale_selector

ROOT = Path(__file__).resolve().parents[3]
MI = 1 << 20
GI = 1 << 30
NOW = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def policy(name: str, **spec: Any) -> GPUMemoryPolicy:
    """A GPUMemoryPolicy from camelCase spec keywords (``mode="DryRun"``,
    ``ceilings={"perPod": {"vram": "40Gi"}}``)."""
    return GPUMemoryPolicy.model_validate({"metadata": {"name": name, "generation": 1}, "spec": spec})


def stale_policy(name: str, expression: dict[str, Any], **spec: Any) -> GPUMemoryPolicy:
    """A policy whose namespaceSelector holds ``expression``, one the API no longer
    admits (stored under an older CRD): the merge's own checks must hold it."""
    p = policy(name, **spec)
    p.spec.namespace_selector = stale_selector(expression)
    return p


@cache
def cluster_nodes() -> dict[str, dict[str, Any]]:
    """The fake GPU nodes of the local cluster, by name."""
    docs = yaml.safe_load_all((ROOT / "hack/cluster/gpu-nodes.yaml").read_text())
    return {d["metadata"]["name"]: d for d in docs if d}


def node_obj(name: str, labels: dict[str, str] | None = None, alloc: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node dict: one of the cluster's fake nodes when ``name`` is one,
    with ``labels`` and allocatable ``alloc`` merged in."""
    base = cluster_nodes().get(name) or {
        "metadata": {"name": name, "labels": {}},
        "status": {"allocatable": {}},
    }
    meta = {**base["metadata"], "labels": {**base["metadata"].get("labels", {}), **(labels or {})}}
    status = {**base["status"], "allocatable": {**base["status"]["allocatable"], **(alloc or {})}}
    return {"metadata": meta, "status": status}


def device(
    uuid: str,
    total_mib: int,
    reserved_mib: int = 0,
    *,
    mig_profile: str | None = None,
    virtualization: str = "None",
) -> dict[str, Any]:
    """A NodeGPUUsage device dict with memory in MiB."""
    total, reserved = total_mib * MI, reserved_mib * MI
    d: dict[str, Any] = {
        "uuid": uuid,
        "index": 0,
        "virtualizationMode": virtualization,
        "memory": {
            "totalBytes": total,
            "reservedBytes": reserved,
            "usableBytes": total - reserved,
        },
    }
    if mig_profile:
        d["migProfile"] = mig_profile
    return d


def report(node: str, devices: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None) -> NodeGPUUsage:
    """A NodeGPUUsage for ``node`` sampled at NOW."""
    return NodeGPUUsage.model_validate(
        {
            "metadata": {"name": node},
            "spec": {"nodeName": node},
            "status": {"sampleTime": NOW.isoformat(), "devices": devices, "pods": pods or []},
        }
    )


def node(name: str, devices: list[dict[str, Any]] | None = None, **kw: Any) -> NodeFacts:
    """NodeFacts for a fake node, with a report when ``devices`` is given."""
    rep = report(name, devices) if devices is not None else None
    return NodeFacts.from_api(node_obj(name, **kw), rep)


def pod(
    name: str = "p",
    ns: str = "ml",
    *,
    resources: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node_name: str | None = None,
    node_selector: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    """A Pod dict; one container ``main`` with ``resources`` as its limits unless
    ``containers`` is given."""
    if containers is None:
        containers = [{"name": "main", "image": "x", "resources": {"limits": resources or {}}}]
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels or {}}
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": containers}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}
