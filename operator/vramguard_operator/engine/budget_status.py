"""Pure construction of a GPUMemoryBudget's desired status: conditions with
stable ``lastTransitionTime``, usage display strings, and a change test for the
status writer (``engine.status`` builds the whole status from these)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from vramguard_api import conditions as C
from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_api.meta import Condition
from vramguard_api.units import format_bytes

ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """A condition as the engine wants it, before lastTransitionTime is settled."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


def settle_conditions(
    wanted: Sequence[ConditionSpec],
    previous: Sequence[Condition] | None,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Build metav1 Conditions from ``wanted``.

    ``lastTransitionTime`` is carried over from ``previous`` when the condition's
    status did not change (metav1.Condition semantics: reason or message
    changes are not transitions), and is ``now`` otherwise. Every condition
    carries ``observedGeneration = generation``.
    """
    before = {c.type: c for c in previous or ()}
    out = []
    for w in wanted:
        old = before.get(w.type)
        since = old.last_transition_time if old is not None and old.status == w.status else now
        out.append(
            Condition(
                type=w.type,
                status=w.status,
                observedGeneration=generation,
                lastTransitionTime=since,
                reason=w.reason,
                message=w.message[:32768],
            )
        )
    return out


def ready(message: str) -> ConditionSpec:
    """Ready=True: the spec is valid and evaluated."""
    return ConditionSpec(C.READY, "True", C.REASON_VALID, message)


def invalid(message: str, reason: str = C.REASON_INVALID_SPEC) -> ConditionSpec:
    """Ready=False: the budget is not evaluated: its spec cannot be
    (``InvalidSpec``, the message names the field), or its evaluation raised
    (``EvaluationFailed``) or ran out of time (``EvaluationTimeout``)."""
    return ConditionSpec(C.READY, "False", reason, message)


def violating(limit_kinds: int, leak_kinds: int, message: str) -> ConditionSpec:
    """Violating: True with LimitExceeded (or LeakDetected when only leaks are
    open), False with NoViolations."""
    if limit_kinds:
        return ConditionSpec(C.VIOLATING, "True", C.REASON_LIMIT_EXCEEDED, message)
    if leak_kinds:
        return ConditionSpec(C.VIOLATING, "True", C.REASON_LEAK_DETECTED, message)
    return ConditionSpec(C.VIOLATING, "False", C.REASON_NO_VIOLATIONS, "no open violations")


def warning(count: int, message: str) -> ConditionSpec:
    """Warning: True with AboveWarningThreshold, False with BelowWarningThreshold."""
    if count:
        return ConditionSpec(C.WARNING, "True", C.REASON_ABOVE_WARNING_THRESHOLD, message)
    return ConditionSpec(C.WARNING, "False", C.REASON_BELOW_WARNING_THRESHOLD, "usage below the warning threshold")


def data_stale(
    stale_nodes: Sequence[str], missing_nodes: Sequence[str], invalid: Mapping[str, str] | None = None
) -> ConditionSpec:
    """DataStale: True with ReportInvalid (a node's report is not believed:
    ``invalid`` maps the node to why), else ReportStale, else ReportMissing
    when a node has no report; False with ReportsFresh."""
    parts = []
    if invalid:
        shown = sorted(invalid)[:10]
        parts.append("node reports not believed: " + "; ".join(f"{n}: {invalid[n]}" for n in shown))
    if stale_nodes:
        parts.append(f"stale node reports: {', '.join(stale_nodes[:10])}")
    if missing_nodes:
        parts.append(f"no node report: {', '.join(missing_nodes[:10])}")
    message = "; ".join(parts) + ("; no action on their pods" if parts else "")
    if invalid:
        return ConditionSpec(C.DATA_STALE, "True", C.REASON_REPORT_INVALID, message)
    if stale_nodes:
        return ConditionSpec(C.DATA_STALE, "True", C.REASON_REPORT_STALE, message)
    if missing_nodes:
        return ConditionSpec(C.DATA_STALE, "True", C.REASON_REPORT_MISSING, message)
    return ConditionSpec(C.DATA_STALE, "False", C.REASON_REPORTS_FRESH, "all node reports are fresh")


def display(used: int | None, limit: int | None) -> str | None:
    """``"41Gi/60Gi"`` (used/limit), ``"41Gi"`` without a limit, None when unknown."""
    if used is None:
        return None
    return format_bytes(used) if limit is None else f"{format_bytes(used)}/{format_bytes(limit)}"


def status_changed(current: GPUMemoryBudgetStatus | Mapping[str, Any] | None, desired: GPUMemoryBudgetStatus) -> bool:
    """Whether the status writer must write ``desired``: whether its API form
    (``to_api()``) differs from ``current``, the status as read from the API
    server (a JSON-like mapping) or as a model (compared in its API form); None
    (no status yet) always differs. The controller asks the same question as
    "is the JSON merge patch from ``current`` to ``desired`` empty"
    (``controller.kubeapi.merge_patch``)."""
    if current is None:
        return True
    now = current.to_api() if isinstance(current, GPUMemoryBudgetStatus) else dict(current)
    return now != desired.to_api()
