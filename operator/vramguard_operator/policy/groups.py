"""One evaluation's engine inputs, built from plain objects (pure).

``merged_policies`` and ``namespace_policies`` say what the GPUMemoryPolicies
mean for each namespace; ``node_facts`` reads the GPU nodes with their
reports; ``engine_groups`` groups the namespaces by effective policy and
``plan.prepare``s each group's budgets and pods into an ``EngineInput``. The
operator's reconcile loop calls them on its indexes, the fleet simulation
(``simulate``) on its simulated cluster, so both evaluate exactly the same
inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vramguard_api.budget import GPUMemoryBudget, GPUMemoryBudgetStatus
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.types import EffectivePolicy, EngineConfig, EngineInput, HeldBudget, PodFacts
from vramguard_operator.policy.inputs import Allocations, PolicyView, prepare
from vramguard_operator.policy.merge import MergedPolicy, merge
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.ratelimit import EvictionLimiter
from vramguard_operator.policy.rules import RuleCache


def merged_policies(
    policies: Sequence[GPUMemoryPolicy],
    namespace_labels: Mapping[str, Mapping[str, str]],
    namespaces: Iterable[str],
    invalid: Mapping[str, str] | None = None,
) -> dict[str, MergedPolicy]:
    """The merged policy of each namespace (``invalid``: policies that do not
    parse, name -> error; they hold every namespace in DryRun)."""
    return {ns: merge(policies, ns, namespace_labels.get(ns, {}), invalid) for ns in namespaces}


def node_facts(gpu_nodes: Mapping[str, Mapping[str, Any]], reports: Mapping[str, NodeGPUUsage]) -> dict[str, NodeFacts]:
    """NodeFacts of the indexed GPU nodes (``policy_handlers.node_entry``) with their reports."""
    return {name: NodeFacts.from_api(body, reports.get(name)) for name, body in gpu_nodes.items()}


@dataclass(frozen=True, slots=True)
class NamespacePolicy:
    """What the GPUMemoryPolicies say for one namespace: the engine's effective
    policy, and the eviction rate-limit scopes (names of the policies that
    select it; the default scope ``""`` when none does)."""

    effective: EffectivePolicy
    scopes: tuple[str, ...]


def namespace_policies(
    policies: Mapping[str, GPUMemoryPolicy],
    namespace_labels: Mapping[str, Mapping[str, str]],
    namespaces: Iterable[str],
    invalid: Mapping[str, str] | None = None,
) -> dict[str, NamespacePolicy]:
    """The policy of each namespace, by ``policies.merge`` (docs/policy.md,
    "Precedence"): DryRun wins over Enforce; a namespace listed in any policy's
    ``exemptNamespaces`` is exempt (``kube-system`` when there is no policy).
    The effective policy's ``exempt_namespaces`` is the namespace itself when it
    is exempt, else empty; the rate-limit scopes are the applying policies.

    Fail safe: while a policy cannot be evaluated (a malformed selector, or a
    spec in ``invalid``: name -> error, that does not parse), every namespace
    is DryRun and exempt from actions."""
    every = [policies[n] for n in sorted(policies)]
    out = {}
    for ns in namespaces:
        merged = merge(every, ns, namespace_labels.get(ns, {}), invalid)
        held = merged.exempt or bool(merged.invalid)
        out[ns] = NamespacePolicy(
            EffectivePolicy(
                mode=merged.effective_mode,
                exempt_namespaces=frozenset({ns}) if held else frozenset(),
                soft_limits=merged.soft_limits is not None,
            ),
            merged.policies or (EvictionLimiter.DEFAULT_SCOPE,),
        )
    return out


@dataclass(frozen=True, slots=True)
class EngineGroup:
    """Namespaces evaluated together (one effective policy), their engine input
    and the policy view it was prepared with (for ``PolicyMemory.finish``)."""

    policy: EffectivePolicy
    namespaces: tuple[str, ...]
    input: EngineInput
    view: PolicyView


def engine_groups(
    namespaces: Sequence[str],
    policies: Mapping[str, NamespacePolicy],
    budgets: Mapping[str, Sequence[GPUMemoryBudget]],
    pods: Mapping[str, Sequence[PodFacts]],
    gpu_pods: Mapping[str, Sequence[Mapping[str, Any]]],
    nodes: Mapping[str, NodeFacts],
    merged: Mapping[str, MergedPolicy],
    reports: Mapping[str, NodeGPUUsage],
    now: datetime,
    config: EngineConfig,
    previous: Mapping[str, GPUMemoryBudgetStatus] | None = None,
    allocations: Allocations | None = None,
    held: Mapping[tuple[str, str], HeldBudget] | None = None,
    unknown_nodes: Mapping[str, str] | None = None,
    rules: RuleCache | None = None,
) -> list[EngineGroup]:
    """The engine inputs of one evaluation: ``namespaces`` (those to evaluate,
    in order) grouped by effective policy (``policies``, from
    ``namespace_policies``), each group's budgets (with their status), pods and
    GPU pods (Pod dicts, for implicit budgets) ``prepare``d under the merged
    policies and the pods' grants (``allocations``), with every report.
    ``previous``: implicit budgets' last statuses by uid
    (``PolicyMemory.implicit_status``). ``held``: by (namespace, name), the
    budgets not to evaluate (their spec does not parse: ``EngineInput.held``);
    ``unknown_nodes``: by node, why its data cannot be believed; ``rules``:
    effective and implicit budgets and grants kept from earlier evaluations."""
    by_policy: dict[EffectivePolicy, list[str]] = {}
    for ns in namespaces:
        by_policy.setdefault(policies[ns].effective, []).append(ns)
    groups = []
    for policy, group in by_policy.items():
        view = prepare(
            [b for ns in group for b in budgets.get(ns, ())],
            [p for ns in group for p in pods.get(ns, ())],
            [p for ns in group for p in gpu_pods.get(ns, ())],
            nodes,
            merged,
            previous,
            allocations,
            rules,
        )
        inp = EngineInput(
            budgets=view.budgets,
            pods=view.pods,
            reports=reports,
            now=now,
            policy=policy,
            config=config,
            device_limits=view.device_limits,
            pressure_rules=view.pressure_rules,
            device_shares=view.device_shares,
            held={k: h for k, h in (held or {}).items() if k[0] in group},
            unknown_nodes=unknown_nodes or {},
        )
        groups.append(EngineGroup(policy, tuple(group), inp, view))
    return groups
