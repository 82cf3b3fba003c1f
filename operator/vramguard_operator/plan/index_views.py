"""Plain views of the informers' stores (``watches``), for the admission
webhooks and the policy status writer: each store maps a key to one entry
(``Informer.store()`` gives a copy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.plan.entries import policy_entry
from vramguard_operator.policy.node import NodeFacts


def _value(entry: Any) -> Any:
    return getattr(entry, "value", entry)


def policies_of(store: Mapping[Any, Any] | None) -> list[GPUMemoryPolicy]:
    """The GPUMemoryPolicies that parse (the store holds ``policy_body`` dicts)."""
    out = []
    for body in (store or {}).values():
        parsed = policy_entry(body).value if isinstance(body, Mapping) else _value(body)
        if isinstance(parsed, GPUMemoryPolicy):
            out.append(parsed)
    return out


def labels_of(store: Mapping[Any, Any] | None, namespace: str) -> dict[str, str]:
    """A namespace's labels (empty when unknown)."""
    entry = (store or {}).get(namespace)
    return dict(_value(entry)) if entry is not None else {}


def namespaces_of(store: Mapping[Any, Any] | None) -> dict[str, dict[str, str]]:
    """Every namespace's labels, by name."""
    return {str(name): dict(_value(e)) for name, e in (store or {}).items()}


def budgets_of(store: Mapping[Any, Any] | None, namespace: str) -> list[GPUMemoryBudget]:
    """The budgets of a namespace that parse (the store is keyed by (namespace, name))."""
    return [b for (ns, _), e in (store or {}).items()
            if ns == namespace and (b := getattr(_value(e), "budget", None)) is not None]


def reports_of(store: Mapping[Any, Any] | None) -> dict[str, NodeGPUUsage]:
    """The node reports that parse, by node."""
    return {r.spec.node_name: r for e in (store or {}).values() if isinstance(r := _value(e), NodeGPUUsage)}


def nodes_of(node_store: Mapping[Any, Any] | None, report_store: Mapping[Any, Any] | None) -> list[NodeFacts]:
    """GPU nodes (``entries.node_entry``) with their reports."""
    reports = reports_of(report_store)
    return [NodeFacts.from_api(n, reports.get(n["metadata"]["name"])) for n in (node_store or {}).values()]
