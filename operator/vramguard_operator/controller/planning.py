"""Pure pieces of planning an evaluation: each namespace's effective
GPUMemoryPolicy (``namespace_policies``), and the budget status notes that the
loop adds (invalid specs, refused resizes). Which budgets and pods to evaluate
is ``incremental``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.meta import Condition
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_operator.controller.indexes import BudgetEntry
from vramguard_operator.controller.ratelimit import EvictionLimiter
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.engine.types import EffectivePolicy
from vramguard_operator.policy.merge import merge

# --- policies per namespace ----------------------------------------------------------


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
            ),
            merged.policies or (EvictionLimiter.DEFAULT_SCOPE,),
        )
    return out


def invalid_status(entry: BudgetEntry, now: datetime) -> GPUMemoryBudgetStatus:
    """The status of a budget whose spec does not parse: Ready=False with reason
    InvalidSpec and the error; the rest of its status (escalation state) kept."""
    prev = GPUMemoryBudgetStatus()
    if entry.status:
        try:
            prev = GPUMemoryBudgetStatus.model_validate(entry.status)
        except ValueError:
            prev = GPUMemoryBudgetStatus()
    conditions = bs.settle_conditions(
        [bs.invalid(entry.error or "invalid spec")], prev.conditions, entry.generation, now
    )
    kept: list[Condition] = [c for c in prev.conditions or () if c.type != conditions[0].type]
    return prev.model_copy(
        update={"observed_generation": entry.generation, "conditions": [*conditions, *kept]}
    )


def note_resize_errors(
    status: GPUMemoryBudgetStatus, errors_by_pod: Mapping[str, str]
) -> GPUMemoryBudgetStatus:
    """Add to each violation at step Throttle (or beyond) the error of its pod's
    refused resize, so the status says why the pod is not throttled."""
    if not errors_by_pod or not status.violations:
        return status
    violations = []
    for v in status.violations:
        err = errors_by_pod.get(v.pod or "")
        if err and v.step in ("Throttle", "Evict") and err not in v.message:
            v = v.model_copy(update={"message": f"{v.message}; {err}"[:1024]})
        violations.append(v)
    return status.model_copy(update={"violations": violations})

