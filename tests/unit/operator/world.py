"""A small cluster in memory for the incremental-evaluation tests: objects as
the API server holds them (with resourceVersions), each change handed to a
``ClusterCache`` as the informers would hand it, and the engine's outputs
applied back as a fully successful actions layer would (annotations merged,
resizes done, evicted pods gone, statuses kept).

Two ways to evaluate the same world:

- ``Incremental``'s plan (what the operator does);
- ``full_pass``: every namespace, every budget, every pod and every report in
  one engine input per effective policy, with implicit budgets built anew
  (the operator's evaluation before issue 18).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vramguard_api import conditions as C
from vramguard_operator.controller.policy_handlers import policy_body
from vramguard_operator.engine.apply import output_changes
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import (
    Decision,
    EngineConfig,
    EngineInput,
    EngineOutput,
    Evict,
    HeldBudget,
    Recover,
    Throttle,
)
from vramguard_operator.plan.allocation_entries import claim_entry, slice_entry
from vramguard_operator.plan.cache import ClusterCache
from vramguard_operator.plan.changes import Change
from vramguard_operator.plan.entries import (
    budget_entry,
    namespace_entry,
    node_entry,
    pod_cache_entry,
    report_entry,
)
from vramguard_operator.plan.incremental import Incremental
from vramguard_operator.policy import groups as policy_groups
from vramguard_operator.policy import inputs as policy_inputs
from vramguard_operator.policy.groups import namespace_policies
from vramguard_operator.policy.node import NodeFacts

PARSE: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "claims": claim_entry,
    "slices": slice_entry,
    "pods": pod_cache_entry,
    "budgets": budget_entry,
    "reports": report_entry,
    "nodes": node_entry,
    "policies": policy_body,
    "namespaces": namespace_entry,
}


@dataclass
class World:
    """The objects, the operator's cache of them, and what it decided."""

    config: EngineConfig
    period: float = 5.0
    objects: dict[str, dict[Hashable, dict[str, Any]]] = field(default_factory=dict)
    entries: dict[str, dict[Hashable, Any]] = field(default_factory=dict)
    cache: ClusterCache = field(default_factory=ClusterCache)
    decisions: list[Decision] = field(default_factory=list)
    _rv: Iterable[int] = field(default_factory=lambda: itertools.count(100))

    def __post_init__(self) -> None:
        self.inc = Incremental(self.cache, self.config, self.period)

    # -- the API server's side

    def put(self, kind: str, key: Hashable, body: dict[str, Any] | None) -> None:
        """Create, replace (``body``) or delete (None) an object; the cache sees the change."""
        store, parsed = self.objects.setdefault(kind, {}), self.entries.setdefault(kind, {})
        old = parsed.get(key)
        if body is None:
            store.pop(key, None)
            parsed.pop(key, None)
            if old is not None:
                self.cache.apply(Change(kind, key, old, None))
            return
        body.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))  # type: ignore[call-overload]
        store[key] = body
        new = PARSE[kind](body)
        if new is None:
            parsed.pop(key, None)
            if old is not None:
                self.cache.apply(Change(kind, key, old, None))
            return
        parsed[key] = new
        self.cache.apply(Change(kind, key, old, new))

    def get(self, kind: str, key: Hashable) -> dict[str, Any] | None:
        return self.objects.get(kind, {}).get(key)

    # -- the operator's side

    def step_incremental(self, now: datetime) -> list[Decision]:
        """The operator's pass: what is marked, closed, evaluated, applied."""
        work = self.inc.plan(now)
        out: list[Decision] = []
        for group in work.groups:
            res = evaluate(group.input)
            self.inc.evaluated(group, res, now)
            out.extend(res.decisions)
            self._apply(res, group.view)
        return out

    def step_full(self, now: datetime) -> list[Decision]:
        """A pass over everything (the reference)."""
        self.cache.take_dirt()
        out: list[Decision] = []
        for view, inp in full_inputs(self.cache, self.inc.memory, self.config, now):
            res = evaluate(inp)
            out.extend(res.decisions)
            self._apply(res, view)
        return out

    def _apply(self, out: EngineOutput, view: policy_inputs.PolicyView) -> None:
        for upd in self.inc.memory.finish(out.statuses, view):
            key = (upd.budget.namespace, upd.budget.name)
            self.cache.set_status(key, upd.status, upd.status.to_api())
        gone: set[str] = set()
        for d in out.decisions:
            if isinstance(d, Evict) and d.pod is not None:
                gone.add(d.pod.uid)
        # the state, then (every Event posted) the records marked posted: engine.apply's
        pods, _, _ = output_changes(out)
        resized = {d.pod.uid: d.resize for d in out.decisions
                   if isinstance(d, Throttle) and d.pod is not None and d.resize}
        resized |= {d.pod.uid: d.restore for d in out.decisions
                    if isinstance(d, Recover) and d.pod is not None and d.restore}
        for uid in sorted(set(pods) | set(resized)):
            self._write_pod(uid, pods.get(uid, {}), resized.get(uid, ()))
        for uid in sorted(gone):
            self.put("pods", uid, None)

    def _write_pod(self, uid: str, annotations: Mapping[str, str | None], resize: Iterable[Any]) -> None:
        body = self.get("pods", uid)
        if body is None:
            return
        body = {**body, "metadata": dict(body["metadata"]), "spec": dict(body["spec"])}
        ann = dict(body["metadata"].get("annotations") or {})
        for k, v in annotations.items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        body["metadata"]["annotations"] = ann
        new_cpu = {c.name: c for c in resize}
        containers = []
        for c in body["spec"]["containers"]:
            c = {**c, "resources": {k: dict(v) for k, v in (c.get("resources") or {}).items()}}
            if c["name"] in new_cpu:
                c["resources"].setdefault("limits", {})["cpu"] = new_cpu[c["name"]].limit
                if new_cpu[c["name"]].request is not None:
                    c["resources"].setdefault("requests", {})["cpu"] = new_cpu[c["name"]].request
            containers.append(c)
        body["spec"]["containers"] = containers
        body["metadata"]["resourceVersion"] = str(next(self._rv))  # type: ignore[call-overload]
        entry = pod_cache_entry(body)
        self.cache.record_pod(entry)  # the API server's answer, as the reconciler keeps it
        self.objects["pods"][uid] = body  # then the watch delivers the same version
        old = self.entries["pods"].get(uid)
        self.entries["pods"][uid] = entry
        self.cache.apply(Change("pods", uid, old, entry))


def full_inputs(cache: ClusterCache, memory: policy_inputs.PolicyMemory, config: EngineConfig,
                now: datetime) -> list[tuple[policy_inputs.PolicyView, EngineInput]]:
    """One engine input per effective policy over every namespace, by
    ``policy.groups.engine_groups`` (budgets that do not parse held alone,
    device-pressure rules and shares, nodes not believed), implicit budgets
    built anew."""
    scope = sorted(cache.known_namespaces())
    pols = namespace_policies(cache.valid_policies(), cache.namespaces, scope, cache.invalid_policies())
    merged = policy_groups.merged_policies(list(cache.valid_policies().values()), cache.namespaces, scope,
                                         cache.invalid_policies())
    reports = {n: r for n in cache.reports if (r := cache.report(n)) is not None}
    nodes = {n: NodeFacts.from_api(b, reports.get(n)) for n, b in cache.nodes.items()}
    budgets: dict[str, list[Any]] = {}
    held: dict[tuple[str, str], HeldBudget] = {}
    for ns in scope:
        for name in sorted(cache.budgets_in_ns.get(ns, ())):
            v = cache.budgets[(ns, name)]
            b = v.value.budget
            if b is None:
                held[(ns, name)] = HeldBudget(v.uid, C.REASON_INVALID_SPEC, v.value.error or "invalid spec")
            else:
                budgets.setdefault(ns, []).append(b.model_copy(update={"status": cache.status_of((ns, name))}))
    entries = {ns: [cache.pods[u] for u in sorted(cache.pods_in_ns.get(ns, ()))] for ns in scope}
    allocations = policy_inputs.Allocations(cache.claims, list(cache.slices.values()), cache.kai_reservations())
    groups = policy_groups.engine_groups(
        scope, pols, budgets, {ns: [e.facts for e in es] for ns, es in entries.items()},
        {ns: [e.gpu for e in es if e.gpu] for ns, es in entries.items()}, nodes, merged, reports, now, config,
        memory.implicit_status, allocations, held, cache.unknown_nodes(),
    )
    return [(g.view, g.input) for g in groups]
