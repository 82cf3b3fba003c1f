"""One-off reads for ``vramguard oom``: the node reports (their end records),
the pods they name and the GPU nodes (for the shares), as JSON dicts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from vramguard_api import GROUP, REPORTS, VERSION


@dataclass(frozen=True)
class OOMRead:
    """Reports, pods (of ``namespace``, or all) and nodes, as the API gives them."""

    reports: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    nodes: list[dict[str, Any]]


def _items(response: Any) -> list[dict[str, Any]]:
    data = json.loads(response.data) if hasattr(response, "data") else response
    return list(data.get("items") or [])


def read_oom(api: client.ApiClient, namespace: str | None) -> OOMRead:
    """Read them; raises one of ``kubeapi.API_ERRORS`` on failure (a missing CRD: 404)."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    reports = _items(custom.list_cluster_custom_object(GROUP, VERSION, REPORTS))
    if namespace is None:
        pods = _items(core.list_pod_for_all_namespaces(_preload_content=False))
    else:
        pods = _items(core.list_namespaced_pod(namespace, _preload_content=False))
    nodes = _items(core.list_node(_preload_content=False))
    return OOMRead(reports, pods, nodes)
