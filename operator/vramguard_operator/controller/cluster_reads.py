"""One-off reads of the cluster for the commands (``vramguard top``): pods,
budgets, policies, node reports and namespace labels, in API form (JSON
dicts), through the kubernetes client. The commands reach the API only
through here and ``vramguard_api.kube``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from vramguard_api import BUDGETS, GROUP, POLICIES, REPORTS, VERSION
from vramguard_api.kube import api_client, current_namespace
from vramguard_operator.controller.kubeapi import API_ERRORS

__all__ = ["API_ERRORS", "ClusterRead", "api_client", "current_namespace", "read_cluster"]


@dataclass(frozen=True)
class ClusterRead:
    """What ``read_cluster`` read: objects as JSON dicts; namespace labels by
    name (read only when there are policies, which select namespaces by them);
    ``notes``: what could not be read (forbidden or missing)."""

    pods: list[dict[str, Any]]
    budgets: list[dict[str, Any]]
    policies: list[dict[str, Any]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _items(response: Any) -> list[dict[str, Any]]:
    data = json.loads(response.data) if hasattr(response, "data") else response
    return list(data.get("items") or [])


def _optional(what: str, call: Callable[[], Any], notes: list[str]) -> list[dict[str, Any]]:
    """The items of a list call whose refusal (401, 403, 404) becomes a note."""
    try:
        return _items(call())
    except ApiException as err:
        if err.status in (401, 403, 404):
            notes.append(f"cannot list {what}: {err.status} {err.reason}")
            return []
        raise


def read_cluster(api: client.ApiClient, namespace: str | None) -> ClusterRead:
    """Read pods and budgets of ``namespace`` (None: every namespace), and the
    cluster-scoped policies, reports and namespace labels. Cluster-scoped reads
    that are forbidden become notes; a missing vramguard CRD raises
    ``LookupError``; other failures raise one of ``kubeapi.API_ERRORS``."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    notes: list[str] = []
    if namespace is None:
        pods = _items(core.list_pod_for_all_namespaces(_preload_content=False))
    else:
        pods = _items(core.list_namespaced_pod(namespace, _preload_content=False))
    try:
        if namespace is None:
            budgets = _items(custom.list_cluster_custom_object(GROUP, VERSION, BUDGETS))
        else:
            budgets = _items(custom.list_namespaced_custom_object(GROUP, VERSION, namespace, BUDGETS))
    except ApiException as err:
        if err.status == 404:
            raise LookupError("vramguard's CRDs are not installed in this cluster (kubectl apply -f crds/)") from None
        raise
    policies = _optional(POLICIES, lambda: custom.list_cluster_custom_object(GROUP, VERSION, POLICIES), notes)
    reports = _optional(REPORTS, lambda: custom.list_cluster_custom_object(GROUP, VERSION, REPORTS), notes)
    labels: dict[str, dict[str, str]] = {}
    if policies:
        listed = _optional("namespaces", lambda: core.list_namespace(_preload_content=False), notes)
        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in listed}
    return ClusterRead(pods, budgets, policies, reports, labels, notes)
