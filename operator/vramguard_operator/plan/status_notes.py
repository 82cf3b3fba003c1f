"""The budget status notes that the reconcile loop adds to the engine's
(invalid specs, refused resizes). Pure. Which budgets and pods to evaluate is
``incremental``'s; each namespace's effective GPUMemoryPolicy is
``policy.groups.namespace_policies``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.meta import Condition
from vramguard_api.steps import Action
from vramguard_operator.engine import budget_status as bs
from vramguard_operator.plan.entries import BudgetEntry


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
        if err and v.step in (Action.THROTTLE, Action.CAP, Action.EVICT) and err not in v.message:
            v = v.model_copy(update={"message": f"{v.message}; {err}"[:1024]})
        violations.append(v)
    return status.model_copy(update={"violations": violations})

