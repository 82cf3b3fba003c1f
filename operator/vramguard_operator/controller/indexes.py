"""The operator's in-memory view of the cluster.

kopf indexes (``@kopf.index`` in ``handlers``) hold one small, parsed entry per
object, built here by pure functions from the watched bodies:

- pods by namespace (``PodFacts``: labels, node, phase, CPU resources, annotations);
- GPUMemoryBudgets by namespace (the parsed model, or why it does not parse);
- GPUMemoryPolicies (one key), NodeGPUUsage reports by node, namespace labels.

Each entry carries the object's ``resourceVersion``. ``Overlay`` keeps the
objects that the operator itself just wrote (the API server's responses) until
the watch catches up, so that an evaluation right after an action sees the
action's result and never repeats it. ``Snapshot`` is one consistent copy for
an evaluation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.controller.kubeapi import plain
from vramguard_operator.engine.types import ANNOTATION_PREFIX, PodFacts

T = TypeVar("T")


def rv_newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is newer than ``b``.

    resourceVersions are opaque to clients by contract; every API server backed
    by etcd issues them from etcd's increasing revision, so they compare as
    integers. Anything else counts as not newer (the watch is then trusted)."""
    return a.isdigit() and b.isdigit() and int(a) > int(b)


def _rv_int(rv: str) -> int:
    return int(rv) if rv.isdigit() else 0


@dataclass(frozen=True, slots=True)
class Versioned(Generic[T]):
    """An index entry: the object's uid and resourceVersion, and its parsed value."""

    uid: str
    resource_version: str
    value: T


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _problem(kind: str, body: Mapping[str, Any], err: Exception) -> str:
    meta = _meta(body)
    where = "/".join(x for x in (meta.get("namespace"), meta.get("name")) if x)
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        return f"{kind} {where}: {loc}: {first['msg']}"
    return f"{kind} {where}: {err}"


# --- entries --------------------------------------------------------------------------


def pod_entry(body: Mapping[str, Any]) -> Versioned[PodFacts]:
    """The index entry of a pod. Raises ``ValueError`` when metadata is incomplete."""
    meta = _meta(body)
    facts = PodFacts.from_api(plain(body))
    return Versioned(facts.uid, str(meta.get("resourceVersion") or ""), facts)


@dataclass(frozen=True, slots=True)
class BudgetEntry:
    """A GPUMemoryBudget: parsed, or with ``error`` saying why it does not parse
    (then ``budget`` is None and ``status`` is the raw status, for the writer)."""

    namespace: str
    name: str
    generation: int | None
    budget: GPUMemoryBudget | None
    error: str | None = None
    status: Mapping[str, Any] | None = None

    def status_api(self) -> dict[str, Any] | None:
        """The current status in API form (None when it has none)."""
        if self.budget is not None:
            st = self.budget.status
            return None if st is None else st.to_api()
        return dict(self.status) if self.status else None


def budget_entry(body: Mapping[str, Any]) -> Versioned[BudgetEntry]:
    """The index entry of a GPUMemoryBudget (never raises on a bad spec)."""
    meta, data = _meta(body), plain(body)
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    generation = meta.get("generation")
    keep: dict[str, Any] = {k: data[k] for k in ("apiVersion", "kind", "spec", "status") if k in data}
    keep["metadata"] = {
        "name": name,
        "namespace": ns,
        "uid": uid,
        "generation": generation,
        "resourceVersion": rv,
    }
    try:
        budget = GPUMemoryBudget.model_validate(keep)
    except (ValidationError, ValueError) as err:
        entry = BudgetEntry(
            ns, name, generation, None, _problem("GPUMemoryBudget", body, err), data.get("status")
        )
        return Versioned(uid, rv, entry)
    return Versioned(uid, rv, BudgetEntry(ns, name, generation, budget))


def report_entry(body: Mapping[str, Any]) -> Versioned[NodeGPUUsage | str]:
    """The index entry of a NodeGPUUsage: the model, or why it does not parse."""
    meta = _meta(body)
    data = plain(body)
    data["metadata"] = {"name": meta.get("name"), "uid": meta.get("uid")}
    uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    try:
        return Versioned(uid, rv, NodeGPUUsage.model_validate(data))
    except (ValidationError, ValueError) as err:
        return Versioned(uid, rv, _problem("NodeGPUUsage", body, err))


def report_node(body: Mapping[str, Any]) -> str:
    """The node a report describes: ``spec.nodeName``, else its name."""
    spec = body.get("spec") or {}
    return str(spec.get("nodeName") or _meta(body).get("name") or "")


def policy_entry(body: Mapping[str, Any]) -> Versioned[GPUMemoryPolicy | str]:
    """The index entry of a GPUMemoryPolicy: the model, or why it does not parse."""
    meta = _meta(body)
    data = {k: v for k, v in plain(body).items() if k in ("apiVersion", "kind", "spec")}
    data["metadata"] = {"name": meta.get("name"), "uid": meta.get("uid")}
    uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    try:
        return Versioned(uid, rv, GPUMemoryPolicy.model_validate(data))
    except (ValidationError, ValueError) as err:
        return Versioned(uid, rv, _problem("GPUMemoryPolicy", body, err))


def namespace_entry(body: Mapping[str, Any]) -> Versioned[dict[str, str]]:
    """The index entry of a Namespace: its labels."""
    meta = _meta(body)
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return Versioned(str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""), labels)


# --- snapshot -------------------------------------------------------------------------


@dataclass(slots=True)
class Snapshot:
    """One copy of the indexes for an evaluation (plain dicts and lists).

    ``budgets``/``pods``: by namespace; ``reports``: by node (a string entry is a
    report that does not parse); ``policies``: by name (likewise);
    ``namespaces``: labels by namespace name."""

    budgets: dict[str, list[Versioned[BudgetEntry]]] = field(default_factory=dict)
    pods: dict[str, list[Versioned[PodFacts]]] = field(default_factory=dict)
    reports: dict[str, Versioned[NodeGPUUsage | str]] = field(default_factory=dict)
    policies: dict[str, Versioned[GPUMemoryPolicy | str]] = field(default_factory=dict)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    # GPU pods by namespace and GPU nodes by name, trimmed (policy_handlers' indexes)
    gpu_pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gpu_nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # ResourceClaims by (namespace, name) and ResourceSlices, trimmed (allocation_entries)
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    slices: list[dict[str, Any]] = field(default_factory=list)
    # nodes that more than one NodeGPUUsage claims: why (which objects)
    report_conflicts: dict[str, str] = field(default_factory=dict)

    def valid_reports(self) -> dict[str, NodeGPUUsage]:
        """Reports that parse, by node."""
        return {n: v.value for n, v in self.reports.items() if isinstance(v.value, NodeGPUUsage)}

    def unknown_nodes(self) -> dict[str, str]:
        """Nodes whose data cannot be believed whatever their report says, and
        why: two reports claim the node, or its report does not parse."""
        out = {n: f"its NodeGPUUsage does not parse: {v.value}" for n, v in self.reports.items() if isinstance(v.value, str)}
        out.update(self.report_conflicts)
        return out

    def valid_policies(self) -> dict[str, GPUMemoryPolicy]:
        """Policies that parse, by name."""
        return {
            n: v.value for n, v in self.policies.items() if isinstance(v.value, GPUMemoryPolicy)
        }

    def invalid_policies(self) -> dict[str, str]:
        """Policies that do not parse, by name: why (the field and the error).
        They are not dropped: while any is left, every namespace is held in
        DryRun (``policies.merge``)."""
        return {n: v.value for n, v in self.policies.items() if isinstance(v.value, str)}

    def sample_times(self) -> dict[str, datetime | None]:
        """Each node's report sample time (None when it has no status)."""
        out: dict[str, datetime | None] = {}
        for node, rep in self.valid_reports().items():
            out[node] = rep.status.sample_time if rep.status is not None else None
        return out


def snapshot_of(
    budgets: Mapping[Any, Iterable[Any]],
    pods: Mapping[Any, Iterable[Any]],
    reports: Mapping[Any, Iterable[Any]],
    policies: Mapping[Any, Iterable[Any]],
    namespaces: Mapping[Any, Iterable[Any]],
    gpu_pods: Mapping[Any, Iterable[Any]] | None = None,
    gpu_nodes: Mapping[Any, Iterable[Any]] | None = None,
    claims: Mapping[Any, Iterable[Any]] | None = None,
    slices: Mapping[Any, Iterable[Any]] | None = None,
) -> Snapshot:
    """Copy kopf indexes (key -> store of entries) into a ``Snapshot``.

    Call it on the event loop's thread, where kopf updates the indexes: it does
    not await, so it sees them in one consistent state."""
    snap = Snapshot()
    for ns, store in budgets.items():
        snap.budgets[ns] = list(store)
    for ns, store in pods.items():
        snap.pods[ns] = list(store)
    for node, store in reports.items():
        entries = list(store)
        if entries:
            snap.reports[node] = max(entries, key=lambda v: _rv_int(v.resource_version))
        if len({e.uid for e in entries}) > 1:  # two reports claim one node: neither is believed
            names = sorted(e.value.metadata.name or e.uid if isinstance(e.value, NodeGPUUsage) else e.uid for e in entries)
            snap.report_conflicts[node] = f"{len(names)} NodeGPUUsage objects report this node ({', '.join(names)})"
    for name, store in policies.items():
        for entry in store:
            snap.policies[name] = entry
    for name, store in namespaces.items():
        for entry in store:
            snap.namespaces[name] = entry.value
    for ns, store in (gpu_pods or {}).items():
        snap.gpu_pods[ns] = list(store)
    for name, store in (gpu_nodes or {}).items():
        for entry in store:
            snap.gpu_nodes[name] = entry
    for key, store in (claims or {}).items():
        for entry in store:
            snap.claims[key] = entry
    for store in (slices or {}).values():
        snap.slices.extend(store)
    return snap


class Overlay:
    """Objects written by the operator, kept until the watch delivers them.

    Thread-safe: the actions thread records, the evaluation reads. An entry is
    used while it is newer than the index's; once the index has caught up (or
    the object is gone from the index) the entry is dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, Versioned[PodFacts]] = {}
        self._budgets: dict[tuple[str, str], Versioned[BudgetEntry]] = {}

    def record_pod(self, body: Mapping[str, Any]) -> None:
        """Remember a pod as the API server returned it."""
        try:
            entry = pod_entry(body)
        except ValueError:
            return
        with self._lock:
            old = self._pods.get(entry.uid)
            if old is None or rv_newer(entry.resource_version, old.resource_version):
                self._pods[entry.uid] = entry

    def record_budget(self, body: Mapping[str, Any]) -> None:
        """Remember a budget (after a status write) as the API server returned it."""
        entry = budget_entry(body)
        key = (entry.value.namespace, entry.value.name)
        with self._lock:
            old = self._budgets.get(key)
            if old is None or rv_newer(entry.resource_version, old.resource_version):
                self._budgets[key] = entry

    def apply(self, snap: Snapshot) -> Snapshot:
        """Replace the snapshot's entries by newer written ones (in place; returned)."""
        with self._lock:
            seen_pods: set[str] = set()
            for ns, entries in snap.pods.items():
                snap.pods[ns] = [self._pick_pod(e, seen_pods) for e in entries]
            for uid in set(self._pods) - seen_pods:
                del self._pods[uid]
            seen_budgets: set[tuple[str, str]] = set()
            for ns, bentries in snap.budgets.items():
                snap.budgets[ns] = [self._pick_budget(e, seen_budgets) for e in bentries]
            for key in set(self._budgets) - seen_budgets:
                del self._budgets[key]
        return snap

    def _pick_pod(self, entry: Versioned[PodFacts], seen: set[str]) -> Versioned[PodFacts]:
        mine = self._pods.get(entry.uid)
        if mine is None:
            return entry
        if rv_newer(mine.resource_version, entry.resource_version):
            seen.add(entry.uid)
            return mine
        return entry  # the watch caught up: the entry is dropped

    def _pick_budget(
        self, entry: Versioned[BudgetEntry], seen: set[tuple[str, str]]
    ) -> Versioned[BudgetEntry]:
        key = (entry.value.namespace, entry.value.name)
        mine = self._budgets.get(key)
        if mine is None or mine.uid != entry.uid:
            return entry
        if rv_newer(mine.resource_version, entry.resource_version):
            seen.add(key)
            return mine
        return entry

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods) + len(self._budgets)


def has_vramguard_state(pod: PodFacts) -> bool:
    """Whether the operator left annotations on the pod (escalation state or a
    throttled pod's original CPU), which must be evaluated even without budgets."""
    return any(k.startswith(ANNOTATION_PREFIX) for k in pod.annotations)
