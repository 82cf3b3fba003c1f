"""The reconcile thread's view of the cluster, with what incremental evaluation
needs to know about each change (docs/operator.md, "Incremental evaluation").

The informers hand every change here (``apply``); only the reconcile thread
calls into this object, so it holds no lock. Besides the entries, it keeps:

- pods by namespace, by node and by name;
- which budgets select which pods (``selects``, ``selected_by``), updated on a
  pod's or a budget's change against the few budgets, or the pods, of one
  namespace; which pods hold escalation state for which budget
  (``recorded``, from their ``vramguard.io/violations`` annotation); which
  pods use which ResourceClaim (``claim_users``);
- the status the engine reads for each budget (``status_of``): the operator's
  own last desired status once it has one (its writes go through a queue, see
  ``status_writer``), the API's otherwise;
- what a change may affect, as dirt: budgets and pods to evaluate again, nodes
  whose report changed, and whether policies or namespace labels changed.

The echo of the operator's own writes marks nothing: a pod whose facts did
not change (only its resourceVersion), a budget status that the operator
itself asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.plan.changes import Change
from vramguard_operator.plan.entries import BudgetEntry, PodEntry, Versioned, policy_entry, rv_newer
from vramguard_operator.policy.dra import pod_claim_names
from vramguard_operator.policy.sharers import KAI_RESERVATION_NAMESPACE

BudgetKey = tuple[str, str]  # (namespace, name)
Matcher = Callable[[Mapping[str, str]], bool]
POD_KINDS = ("pods", "pods-unlabelled")
_SENT_KEPT = 4  # statuses handed to the writer, remembered to recognise their echo


@dataclass
class Dirt:
    """What changed since the last evaluation."""

    budgets: set[BudgetKey] = field(default_factory=set)
    pods: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)  # pods deleted
    nodes: set[str] = field(default_factory=set)  # report (or node) changed: staleness timers
    policies: bool = False  # policies or namespace labels changed

    def __bool__(self) -> bool:
        return bool(self.budgets or self.pods or self.gone or self.nodes or self.policies)


class ClusterCache:
    """Entries and indexes of the watched objects (see the module doc)."""

    def __init__(self) -> None:
        self.pods: dict[str, PodEntry] = {}
        self._pod_kinds: dict[str, set[str]] = {}
        self.pods_in_ns: dict[str, set[str]] = defaultdict(set)
        self.pods_on_node: dict[str, set[str]] = defaultdict(set)
        self.pod_names: dict[BudgetKey, str] = {}
        self.budgets: dict[BudgetKey, Versioned[BudgetEntry]] = {}
        self.budgets_in_ns: dict[str, set[str]] = defaultdict(set)
        self._matchers: dict[BudgetKey, Matcher | None] = {}
        self.selects: dict[BudgetKey, set[str]] = defaultdict(set)
        self.selected_by: dict[str, set[BudgetKey]] = defaultdict(set)
        self.recorded: dict[BudgetKey, set[str]] = defaultdict(set)
        self.reports: dict[str, Versioned[NodeGPUUsage | str]] = {}  # by node: the newest
        self._report_objs: dict[str, dict[str, Versioned[NodeGPUUsage | str]]] = {}  # node -> name -> entry
        self.report_conflicts: dict[str, str] = {}  # nodes two reports claim: why
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self.policies: dict[str, Versioned[GPUMemoryPolicy | str]] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        self.claims: dict[BudgetKey, Mapping[str, Any]] = {}  # ResourceClaims by (namespace, name)
        self.slices: dict[str, Mapping[str, Any]] = {}
        self.claim_users: dict[BudgetKey, set[str]] = defaultdict(set)  # pods naming a claim
        self._statuses: dict[BudgetKey, GPUMemoryBudgetStatus | None] = {}
        self._sent: dict[BudgetKey, list[dict[str, Any]]] = {}
        self.dirt = Dirt()

    # -- changes

    def apply(self, ch: Change[Any]) -> None:
        """Take one informer change into the cache, noting what it may affect."""
        if ch.kind in POD_KINDS:
            self._pod_change(ch.kind, str(ch.key), ch.new)
        elif ch.kind == "budgets":
            self._budget_change(_budget_key(ch.key), ch.new)
        elif ch.kind == "reports":
            self._report_change(ch.key, ch.new)
        elif ch.kind == "nodes":
            self._node_change(str(ch.key), ch.new)
        elif ch.kind == "policies":
            self._set(self.policies, str(ch.key), None if ch.new is None else policy_entry(ch.new))
            self.dirt.policies = True
        elif ch.kind == "claims":
            self._claim_change(_budget_key(ch.key), ch.old, ch.new)
        elif ch.kind == "slices":
            self._slice_change(ch.old, ch.new)
        elif ch.kind == "namespaces":
            labels = None if ch.new is None else ch.new.value
            if self.namespaces.get(str(ch.key)) != labels:
                self._set(self.namespaces, str(ch.key), labels)
                self.dirt.policies = True

    def record_pod(self, entry: PodEntry | None) -> None:
        """Keep a pod as the API server returned it after one of the operator's
        own writes, until the watch delivers that version or a newer one. It
        marks nothing: the evaluation that wrote it already decided on it."""
        cur = None if entry is None else self.pods.get(entry.uid)
        if entry is None or cur is None or not rv_newer(entry.resource_version, cur.resource_version):
            return
        self._replace_pod(cur, entry)

    def take_dirt(self) -> Dirt:
        """What changed since the last call."""
        dirt, self.dirt = self.dirt, Dirt()
        return dirt

    # -- pods

    def _pod_change(self, kind: str, uid: str, new: PodEntry | None) -> None:
        kinds = self._pod_kinds.setdefault(uid, set())
        cur = self.pods.get(uid)
        if new is None:
            kinds.discard(kind)
            if kinds or cur is None:  # still delivered by the other pod watch
                return
            del self._pod_kinds[uid]
            self.dirt.budgets |= self.selected_by.get(uid, set()) | {(cur.namespace, b) for b in cur.recorded}
            self.dirt.gone.add(uid)
            self._unindex_pod(cur)
            self._mark_sharers(cur)
            # its node's other pods: the device-pressure rule judges their devices without it
            if cur.facts.node_name:
                self.dirt.pods |= self.pods_on_node.get(cur.facts.node_name, set())
            return
        kinds.add(kind)
        if cur is None:
            self._index_pod(new)
            self.dirt.pods.add(uid)
            return
        if rv_newer(cur.resource_version, new.resource_version):
            return  # older than what the operator wrote: the watch will catch up
        if cur.decides_like(new):
            self.pods[uid] = new  # the echo of the operator's own write, or a change that decides nothing
            return
        self.dirt.budgets |= self.selected_by.get(uid, set())  # the budgets it may leave
        self._mark_sharers(cur)  # the claims it may leave
        self._replace_pod(cur, new)
        self.dirt.pods.add(uid)

    def _mark_sharers(self, e: PodEntry) -> None:
        """The pods sharing a ResourceClaim with ``e`` (their claim budget counts it)."""
        for name in _claims_of(e):
            self.dirt.pods |= self.claim_users.get((e.namespace, name), set()) - {e.uid}

    def _replace_pod(self, cur: PodEntry, new: PodEntry) -> None:
        self._unindex_pod(cur)
        self._index_pod(new)

    def _index_pod(self, e: PodEntry) -> None:
        uid, ns, f = e.uid, e.namespace, e.facts
        self.pods[uid] = e
        self.pods_in_ns[ns].add(uid)
        self.pods_on_node[f.node_name or ""].add(uid)
        self.pod_names[(ns, f.name)] = uid
        for name in self.budgets_in_ns.get(ns, ()):
            matcher = self._matchers.get((ns, name))
            if matcher is not None and matcher(f.labels):
                self.selects[(ns, name)].add(uid)
                self.selected_by[uid].add((ns, name))
        for name in e.recorded:
            self.recorded[(ns, name)].add(uid)
        for name in _claims_of(e):
            self.claim_users[(ns, name)].add(uid)
        if ns == KAI_RESERVATION_NAMESPACE:  # a KAI reservation: its node's pods read it
            self.dirt.pods |= self.pods_on_node.get(f.node_name or "", set())

    def _unindex_pod(self, e: PodEntry) -> None:
        uid, ns, f = e.uid, e.namespace, e.facts
        self.pods.pop(uid, None)
        _discard(self.pods_in_ns, ns, uid)
        _discard(self.pods_on_node, f.node_name or "", uid)
        if self.pod_names.get((ns, f.name)) == uid:
            del self.pod_names[(ns, f.name)]
        for key in self.selected_by.pop(uid, set()):
            _discard(self.selects, key, uid)
        for name in e.recorded:
            _discard(self.recorded, (ns, name), uid)
        for name in _claims_of(e):
            _discard(self.claim_users, (ns, name), uid)
        if ns == KAI_RESERVATION_NAMESPACE:
            self.dirt.pods |= self.pods_on_node.get(f.node_name or "", set())

    # -- budgets

    def _budget_change(self, key: BudgetKey, new: Versioned[BudgetEntry] | None) -> None:
        old = self.budgets.get(key)
        if any(v is not None and v.value.budget is None for v in (old, new)):
            # a budget held (its spec does not parse) makes its namespace's shares unknown
            # to the device-pressure rule: held, fixed or deleted, every pod there is judged again
            self.dirt.pods |= self.pods_in_ns.get(key[0], set())
        if new is None:
            if old is not None:
                self.dirt.pods |= self.selects.get(key, set()) | self.recorded.get(key, set())
                self._set_matcher(key, None)
                self.budgets.pop(key, None)
                _discard(self.budgets_in_ns, key[0], key[1])
                self._statuses.pop(key, None)
                self._sent.pop(key, None)
            return
        self.budgets[key] = new
        self.budgets_in_ns[key[0]].add(key[1])
        if old is None or _spec_of(old) != _spec_of(new):
            left = set(self.selects.get(key, set()))
            self._set_matcher(key, _matcher(new.value))
            self.dirt.pods |= left - self.selects.get(key, set())  # unselected: an implicit budget may apply
            self.dirt.budgets.add(key)
            if old is None or old.uid != new.uid:
                self._statuses[key] = _status_model(new.value)
                self._sent.pop(key, None)
                return
        self._status_change(key, new)

    def _status_change(self, key: BudgetKey, new: Versioned[BudgetEntry]) -> None:
        api = new.value.status_api()
        if any(api == s for s in self._sent.get(key, ())):
            return  # the echo of the operator's own write
        mine = self._statuses.get(key)
        if (None if mine is None else mine.to_api()) == api:
            return
        self._statuses[key] = _status_model(new.value)  # written by someone else: read it back
        self.dirt.budgets.add(key)

    def _set_matcher(self, key: BudgetKey, matcher: Matcher | None) -> None:
        for uid in self.selects.pop(key, set()):
            _discard(self.selected_by, uid, key)
        self._matchers[key] = matcher
        if matcher is None:
            self._matchers.pop(key, None)
            return
        for uid in self.pods_in_ns.get(key[0], ()):
            if matcher(self.pods[uid].facts.labels):
                self.selects[key].add(uid)
                self.selected_by[uid].add(key)

    def status_of(self, key: BudgetKey) -> GPUMemoryBudgetStatus | None:
        """The status the engine reads for a budget."""
        return self._statuses.get(key)

    def set_status(self, key: BudgetKey, status: GPUMemoryBudgetStatus, api: dict[str, Any]) -> None:
        """The engine's new desired status of a budget, ``api`` its API form as
        handed to the status writer (its echo will be recognised)."""
        self._statuses[key] = status
        sent = self._sent.setdefault(key, [])
        if not sent or sent[-1] != api:
            sent.append(api)
            del sent[:-_SENT_KEPT]

    def forget_statuses(self, namespaces: set[str]) -> None:
        """Read the statuses of these namespaces' budgets from the API again
        (a shard gained them: another replica decided there until now)."""
        for key, v in self.budgets.items():
            if key[0] in namespaces:
                self._statuses[key] = _status_model(v.value)
                self._sent.pop(key, None)

    # -- reports, nodes

    def _report_change(self, key: Hashable, new: Versioned[NodeGPUUsage | str] | None) -> None:
        """A NodeGPUUsage, keyed (node, object name) by the informer (a plain node
        name: one object named after its node). Two objects claiming one node
        make its data unknown (``unknown_nodes``); else the node's report is its one."""
        node, name = (str(key[0]), str(key[1])) if isinstance(key, tuple) else (str(key), str(key))
        objs = self._report_objs.setdefault(node, {})
        old = self.reports.get(node)
        self._set(objs, name, new)
        if not objs:
            del self._report_objs[node]
        newest = max(objs.values(), key=lambda v: _rv_int(v.resource_version)) if objs else None
        self._set(self.reports, node, newest)
        if len(objs) > 1:
            names = sorted(objs)
            self.report_conflicts[node] = f"{len(names)} NodeGPUUsage objects report this node ({', '.join(names)})"
        else:
            self.report_conflicts.pop(node, None)
        self.dirt.nodes.add(node)
        self.dirt.pods |= self.pods_on_node.get(node, set())
        for rep in (old, new):  # pods it names that the cache has on another node
            if rep is not None and isinstance(rep.value, NodeGPUUsage) and rep.value.status is not None:
                self.dirt.pods |= {p.uid for p in rep.value.status.pods if p.uid in self.pods}

    def unknown_nodes(self) -> dict[str, str]:
        """Nodes whose data cannot be believed whatever their report says, and
        why: two reports claim the node, or its report does not parse."""
        out = {n: f"its NodeGPUUsage does not parse: {v.value}" for n, v in self.reports.items()
               if isinstance(v.value, str)}
        out.update(self.report_conflicts)
        return out

    def _claim_change(self, key: BudgetKey, old: Any, new: Any) -> None:
        """A ResourceClaim: the pods that name it or that it is reserved for."""
        self._set(self.claims, key, new)
        self.dirt.pods |= self.claim_users.get(key, set())
        for claim in (old, new):
            for ref in ((claim or {}).get("status") or {}).get("reservedFor") or ():
                if ref.get("uid") in self.pods:
                    self.dirt.pods.add(ref["uid"])

    def _slice_change(self, old: Any, new: Any) -> None:
        """A ResourceSlice: the pods of its node (their claims' devices are in it)."""
        body = new if new is not None else old
        self._set(self.slices, str(((body or {}).get("metadata") or {}).get("name") or ""), new)
        for s in (old, new):
            node = ((s or {}).get("spec") or {}).get("nodeName")
            if node:
                self.dirt.pods |= self.pods_on_node.get(node, set())

    def kai_reservations(self) -> list[Mapping[str, Any]]:
        """KAI's reservation pods (``sharers.kai_group_devices`` reads them)."""
        return [e.gpu for u in self.pods_in_ns.get(KAI_RESERVATION_NAMESPACE, ()) if (e := self.pods[u]).gpu]

    def _node_change(self, name: str, new: Mapping[str, Any] | None) -> None:
        self._set(self.nodes, name, new)
        self.dirt.nodes.add(name)
        self.dirt.pods |= self.pods_on_node.get(name, set())

    @staticmethod
    def _set(store: dict[Any, Any], key: Hashable, value: Any) -> None:
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value

    # -- reading

    def known_namespaces(self) -> set[str]:
        """Namespaces with pods or budgets."""
        return {ns for ns, s in self.pods_in_ns.items() if s} | {ns for ns, s in self.budgets_in_ns.items() if s}

    def valid_policies(self) -> dict[str, GPUMemoryPolicy]:
        """Policies that parse, by name."""
        return {n: v.value for n, v in self.policies.items() if isinstance(v.value, GPUMemoryPolicy)}

    def invalid_policies(self) -> dict[str, str]:
        """Policies that do not parse, by name: why."""
        return {n: v.value for n, v in self.policies.items() if isinstance(v.value, str)}

    def report(self, node: str) -> NodeGPUUsage | None:
        """A node's report, when it parses."""
        v = self.reports.get(node)
        return v.value if v is not None and isinstance(v.value, NodeGPUUsage) else None


def _rv_int(rv: str) -> int:
    return int(rv) if rv.isdigit() else 0


def _budget_key(key: Hashable) -> BudgetKey:
    assert isinstance(key, tuple) and len(key) == 2, key
    return str(key[0]), str(key[1])


def _claims_of(e: PodEntry) -> list[str]:
    return pod_claim_names(e.gpu) if e.gpu is not None else []


def _spec_of(v: Versioned[BudgetEntry]) -> tuple[Any, ...]:
    e = v.value
    return (v.uid, e.generation, e.error, None if e.budget is None else e.budget.spec)


def _matcher(e: BudgetEntry) -> Matcher | None:
    if e.budget is None:
        return None
    try:
        return compile_selector(e.budget.spec.selector)
    except ValueError:
        return None  # a malformed selector selects nothing (the engine says so in status)


def _status_model(e: BudgetEntry) -> GPUMemoryBudgetStatus | None:
    return None if e.budget is None else e.budget.status


def _discard(index: dict[Any, set[Any]], key: Any, value: Any) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(value)
        if not members:
            del index[key]
