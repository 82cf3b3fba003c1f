"""What is evaluated together with the marked budgets and pods: their closure
over everything the engine reads with them (docs/operator.md, "Incremental
evaluation" and "Device pressure couples a node's pods").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_operator.plan.cache import BudgetKey, ClusterCache
from vramguard_operator.plan.quiet import QuietTotals
from vramguard_operator.policy.dra import pod_claim_names


def closure(
    c: ClusterCache,
    quiet: QuietTotals,
    ns_rule: Callable[[str], bool],
    names: set[BudgetKey],
    uids: set[str],
    far: Callable[[str], bool] = lambda node: False,
) -> tuple[set[BudgetKey], set[str], set[str]]:
    """The budgets and pods to evaluate with ``names`` and ``uids``: a budget
    brings its active pods (``quiet``: the others are summed), the pods holding
    state for it and the pods its status names; a pod brings the budgets
    selecting it or that it holds state for, the pods sharing a
    ResourceClaim with it and, on a node where a device-pressure rule may
    compare pods (``ns_rule(namespace)``: the namespace has one), every pod
    of that node, unless the node is ``far`` from its devices' thresholds
    (``coupling.Coupling``). A budget whose spec does not parse brings
    nothing (it is held; its records are kept wherever its pods are
    evaluated). Also returns the nodes coupled."""
    todo_b = [k for k in names if k in c.budgets]
    todo_p = [u for u in uids if u in c.pods]
    keys: set[BudgetKey] = set()
    pods: set[str] = set()
    coupled: set[str] = set()
    rule_budgets = {k for k, v in c.budgets.items()
                    if v.value.budget is not None and v.value.budget.spec.device_pressure is not None}
    while todo_b or todo_p:
        while todo_b:
            key = todo_b.pop()
            if key in keys:
                continue
            keys.add(key)
            if c.budgets[key].value.budget is None:
                continue
            ns = key[0]
            todo_p.extend(u for u in c.selects.get(key, ()) if not quiet.quiet(key, u))
            todo_p.extend(c.recorded.get(key, ()))
            todo_p.extend(u for name in named_pods(c.status_of(key)) if (u := c.pod_names.get((ns, name))))
        while todo_p:
            uid = todo_p.pop()
            if uid in pods:
                continue
            pods.add(uid)
            e = c.pods[uid]
            ns = e.namespace
            todo_b.extend(c.selected_by.get(uid, ()))
            todo_b.extend((ns, b) for b in e.recorded if (ns, b) in c.budgets)
            for claim in _claims(e):  # a shared claim's budget spans its pods
                todo_p.extend(c.claim_users.get((ns, claim), ()))
            node = e.facts.node_name or ""
            if node and node not in coupled and not far(node) and under_rule(c, node, ns_rule, rule_budgets):
                coupled.add(node)  # the device-pressure rule compares every pod of a device
                todo_p.extend(node_pods(c, node))
    return keys, pods, coupled


def under_rule(c: ClusterCache, node: str, ns_rule: Callable[[str], bool], rule_budgets: set[BudgetKey]) -> bool:
    """Whether a device-pressure rule may compare the pods of ``node``: a pod
    there is in a namespace with a rule or selected by a budget with
    ``devicePressure`` (``rule_budgets``). Every pod of such a node is then
    evaluated with any one of them: the rule needs every pod of a device, and
    a node is a simpler closed set whose few pods cost little."""
    for uid in node_pods(c, node):
        if ns_rule(c.pods[uid].namespace) or c.selected_by.get(uid, set()) & rule_budgets:
            return True
    return False


def node_pods(c: ClusterCache, node: str) -> set[str]:
    """The pods on a node: by ``spec.nodeName``, and those its report names."""
    out = set(c.pods_on_node.get(node, set()))
    rep = c.report(node)
    if rep is not None and rep.status is not None:
        out |= {p.uid for p in rep.status.pods if p.uid in c.pods}
    return out


def named_pods(status: GPUMemoryBudgetStatus | None) -> set[str]:
    """The pods a budget's status names (violations and warnings)."""
    if status is None:
        return set()
    return {e.pod for e in (*(status.violations or ()), *(status.warnings or ())) if e.pod}


def _claims(e: Any) -> list[str]:
    return pod_claim_names(e.gpu) if e.gpu is not None else []
