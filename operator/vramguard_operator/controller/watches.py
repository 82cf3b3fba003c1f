"""The collections the operator watches, each with its informer (``informer``):
what is listed, how an object is named and what is kept of it.

| collection | selector | key | kept |
|---|---|---|---|
| ``pods`` | label ``vramguard.io/gpu-pod=true`` (the mutating webhook sets it) | uid | ``PodEntry`` |
| ``pods-unlabelled`` | ``!vramguard.io/gpu-pod`` (pods created before the webhook, or while it was down) | uid | ``PodEntry`` of GPU pods, pods with vramguard state and pods on GPU nodes; nothing of the others |
| ``budgets`` | | (namespace, name) | ``BudgetEntry`` |
| ``reports`` | | (node, name) | the parsed ``NodeGPUUsage`` (two objects may claim one node) |
| ``nodes`` | | name | GPU nodes' labels and allocatable resources |
| ``policies`` | | name | the policy trimmed to spec and status |
| ``namespaces`` | | name | labels |
| ``claims`` | | (namespace, name) | ResourceClaims trimmed to what ``policy.dra`` reads (``plan.allocation_entries``) |
| ``slices`` | | name | ResourceSlices, likewise |

``namespaces`` (kopf-style glob patterns, as ``-n``) limits the pods and
budgets kept; empty keeps every namespace. ``unlabelled=False`` leaves out the
second pod watch (docs/operator.md, "Which pods are watched").
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client

from vramguard_api import BUDGETS, GROUP, POLICIES, REPORTS, VERSION
from vramguard_operator.controller.informer import Informer, Sink
from vramguard_operator.controller.policy_handlers import policy_body
from vramguard_operator.plan.allocation_entries import (
    CLAIMS,
    DRA_GROUP,
    DRA_VERSION,
    SLICES,
    claim_entry,
    slice_entry,
)
from vramguard_operator.plan.entries import (
    budget_entry,
    has_vramguard_state,
    namespace_entry,
    node_entry,
    pod_cache_entry,
    report_entry,
    report_node,
)
from vramguard_operator.policy.mutation import GPU_POD_LABEL

# The order of the first listings: pods last, so that the unlabelled pods'
# filter knows the GPU nodes and their reports.
ORDER = ("namespaces", "policies", "budgets", "claims", "slices", "nodes", "reports", "pods", "pods-unlabelled")


def matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether a namespace matches one of the glob ``patterns`` (all when empty)."""
    if not patterns:
        return lambda ns: True
    return lambda ns: any(fnmatch.fnmatchcase(ns, p) for p in patterns)


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _uid(body: Mapping[str, Any]) -> str:
    return str(_meta(body).get("uid") or "")


def _name(body: Mapping[str, Any]) -> str:
    return str(_meta(body).get("name") or "")


def _ns_name(body: Mapping[str, Any]) -> tuple[str, str]:
    return str(_meta(body).get("namespace") or ""), _name(body)


def build(
    api: client.ApiClient,
    sink: Sink,
    namespaces: Sequence[str] = (),
    unlabelled: bool = True,
    watch_seconds: float = 300.0,
    dra_version: str = DRA_VERSION,
) -> dict[str, Informer[Any]]:
    """The informers, by collection (not started: start them in ``ORDER``);
    claims and slices at ``dra_version`` of ``resource.k8s.io``."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    wanted = matcher(namespaces)
    out: dict[str, Informer[Any]] = {}

    def add(kind: str, call: Any, key: Any, parse: Any, optional: bool = False) -> None:
        out[kind] = Informer(kind, call, key, parse, sink, watch_seconds=watch_seconds, optional=optional)

    def cluster(plural: str, group: str = GROUP, version: str = VERSION) -> Any:
        return functools.partial(custom.list_cluster_custom_object, group, version, plural)

    add("namespaces", core.list_namespace, _name, namespace_entry)
    add("policies", cluster(POLICIES), _name, policy_body)
    add("budgets", cluster(BUDGETS), _ns_name, lambda b: budget_entry(b) if wanted(_ns_name(b)[0]) else None)
    add("claims", cluster(CLAIMS, DRA_GROUP, dra_version), _ns_name,
        lambda b: claim_entry(b) if wanted(_ns_name(b)[0]) else None, optional=True)
    add("slices", cluster(SLICES, DRA_GROUP, dra_version), _name, slice_entry, optional=True)
    add("nodes", core.list_node, _name, node_entry)
    report_nodes: set[str] = set()  # nodes with a report (for the unlabelled pods' filter)

    def report_key(body: Mapping[str, Any]) -> tuple[str, str]:
        return report_node(body), str((body.get("metadata") or {}).get("name") or "")

    def report_parsed(body: Mapping[str, Any]) -> Any:
        report_nodes.add(report_node(body))
        return report_entry(body)

    add("reports", cluster(REPORTS), report_key, report_parsed)  # two objects may claim one node

    def pods(selector: str) -> Any:
        return functools.partial(core.list_pod_for_all_namespaces, label_selector=selector)

    def labelled(body: Mapping[str, Any]) -> Any:
        return pod_cache_entry(body) if wanted(_ns_name(body)[0]) else None

    add("pods", pods(f"{GPU_POD_LABEL}=true"), _uid, labelled)
    if unlabelled:
        gpu_nodes = out["nodes"]

        def kept(body: Mapping[str, Any]) -> Any:
            e = labelled(body)
            if e is None or e.gpu is not None or has_vramguard_state(e.facts):
                return e
            node = e.facts.node_name or ""
            return e if node and (gpu_nodes.get(node) is not None or node in report_nodes) else None

        add("pods-unlabelled", pods(f"!{GPU_POD_LABEL}"), _uid, kept)
    return out


def start(informers: Mapping[str, Informer[Any]], timeout: float | None = None) -> None:
    """Start the informers in ``ORDER``, each once the ones before it that the
    unlabelled pods' filter reads (nodes, reports) have listed theirs."""
    for kind in ORDER:
        inf = informers.get(kind)
        if inf is None:
            continue
        if kind == "pods-unlabelled":
            for before in ("nodes", "reports"):
                if before in informers:
                    informers[before].synced.wait(timeout)
        inf.start()
