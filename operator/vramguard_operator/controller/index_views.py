"""Plain views of the operator's kopf indexes, for the admission webhooks and
the policy handlers (entries are ``indexes.Versioned`` or plain dicts)."""

from __future__ import annotations

from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.policy.node import NodeFacts


def values(index: Any, key: Any = None) -> list[Any]:
    """Entry values of a kopf index (all keys, or one), unwrapping ``Versioned``."""
    if index is None:
        return []
    stores = index.values() if key is None else [index.get(key, ())]
    return [getattr(v, "value", v) for store in stores for v in store]


def policies_of(policy_index: Any) -> list[GPUMemoryPolicy]:
    """The GPUMemoryPolicies that parse."""
    return [p for p in values(policy_index) if isinstance(p, GPUMemoryPolicy)]


def labels_of(namespace_index: Any, namespace: str) -> dict[str, str]:
    """A namespace's labels (empty when unknown)."""
    found = values(namespace_index, namespace)
    return dict(found[0]) if found else {}


def namespaces_of(namespace_index: Any) -> dict[str, dict[str, str]]:
    """Every namespace's labels, by name."""
    if namespace_index is None:
        return {}
    return {name: labels_of(namespace_index, name) for name in list(namespace_index.keys())}


def budgets_of(budget_index: Any, namespace: str) -> list[GPUMemoryBudget]:
    """The budgets of a namespace that parse."""
    return [b for e in values(budget_index, namespace) if (b := getattr(e, "budget", None)) is not None]


def reports_of(report_index: Any) -> dict[str, NodeGPUUsage]:
    """The node reports that parse, by node."""
    return {r.spec.node_name: r for r in values(report_index) if isinstance(r, NodeGPUUsage)}


def nodes_of(node_index: Any, report_index: Any) -> list[NodeFacts]:
    """GPU nodes (``policy_handlers.gpu_node_index``) with their reports."""
    reports = reports_of(report_index)
    return [NodeFacts.from_api(n, reports.get(n["metadata"]["name"])) for n in values(node_index)]
