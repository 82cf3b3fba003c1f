"""Pure admission checks behind the validating webhook.

- ``validate_budget``: a GPUMemoryBudget must not set a limit above the
  ceilings of the policies that apply to its namespace (``ceilings.py``); the
  message names the ceiling and the policy.
- ``validate_pod``: while a job's total budget is throttled (an open TotalVRAM
  or TotalRAM violation whose ladder reached Throttle or Evict, in Enforce mode,
  outside exempt namespaces, on data that is not stale), new pods that budget
  selects are rejected: adding workers to a job that is already over its total
  only makes it worse.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from vramguard_api import conditions as C
from vramguard_api.budget import GPUMemoryBudget, ViolationKind
from vramguard_api.explain import explain_errors
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.steps import BLOCKING_STEPS
from vramguard_api.units import format_bytes
from vramguard_operator.engine.selectors import Matcher, compile_selector
from vramguard_operator.policy.ceilings import CeilingCheck, FieldError, check_ceilings
from vramguard_operator.policy.merge import merge

TOTAL_KINDS: frozenset[ViolationKind] = frozenset({"TotalVRAM", "TotalRAM"})


def parse_budget(obj: Mapping[str, Any] | GPUMemoryBudget) -> GPUMemoryBudget | list[FieldError]:
    """The budget as a model, or one FieldError per schema problem (path from
    pydantic's location, e.g. ``spec.limits.perPod.vram``)."""
    if isinstance(obj, GPUMemoryBudget):
        return obj
    try:
        return GPUMemoryBudget.model_validate(
            {k: v for k, v in obj.items() if k in ("apiVersion", "kind", "metadata", "spec")}
        )
    except ValidationError as err:
        # unknown keys first, with the closest known one; patterns in words, with a hint
        return [FieldError(path, repr(value)[:200], what) for path, what, value in explain_errors(err, GPUMemoryBudget)]


def check_budget(
    obj: Mapping[str, Any] | GPUMemoryBudget,
    policies: Sequence[GPUMemoryPolicy],
    namespace_labels: Mapping[str, str],
) -> CeilingCheck:
    """Errors (reject) and warnings (admit, tell the client) for a budget."""
    budget = parse_budget(obj)
    if isinstance(budget, list):
        return CeilingCheck(errors=tuple(budget))
    merged = merge(policies, budget.metadata.namespace or "", namespace_labels)
    return check_ceilings(budget, merged)


def validate_budget(
    obj: Mapping[str, Any] | GPUMemoryBudget,
    policies: Sequence[GPUMemoryPolicy],
    namespace_labels: Mapping[str, str],
) -> list[FieldError]:
    """The reasons to reject the budget (empty: admit). ``policies`` is every
    GPUMemoryPolicy of the cluster; ``namespace_labels`` the labels of the
    budget's namespace."""
    return list(check_budget(obj, policies, namespace_labels).errors)


def format_errors(kind: str, name: str, errors: Iterable[FieldError]) -> str:
    """One admission message: ``GPUMemoryBudget "x" is invalid: path: msg; ...``
    (the shape the API server uses for its own validation errors)."""
    return f'{kind} "{name}" is invalid: ' + "; ".join(str(e) for e in errors)


@dataclass(frozen=True, slots=True)
class ThrottledJob:
    """A budget whose total (a job's pods together) is over its limit and throttled."""

    namespace: str
    budget: str
    kind: ViolationKind
    observed_bytes: int
    limit_bytes: int
    since: datetime
    matcher: Matcher


def throttled_jobs(
    budgets: Iterable[GPUMemoryBudget], exempt_namespaces: Collection[str] = ()
) -> list[ThrottledJob]:
    """The budgets whose status shows a total violation at Throttle or Evict,
    in effective mode Enforce, outside ``exempt_namespaces``. A budget whose
    selector is malformed is skipped (the engine reports it as invalid), and so
    is one whose DataStale condition is True: no enforcement on stale data."""
    out = []
    for b in budgets:
        st, ns = b.status, b.metadata.namespace or ""
        if st is None or st.effective_mode != "Enforce" or ns in exempt_namespaces:
            continue
        if any(c.type == C.DATA_STALE and c.status == "True" for c in st.conditions or ()):
            continue
        for v in st.violations or ():
            if v.kind not in TOTAL_KINDS or v.step not in BLOCKING_STEPS or v.dry_run:  # a would-be step
                continue
            try:
                matcher = compile_selector(b.spec.selector)
            except ValueError:
                break
            since = v.step_time or v.opened_at or v.since
            out.append(
                ThrottledJob(
                    ns, b.metadata.name or "", v.kind, v.observed_bytes, v.limit_bytes, since, matcher
                )
            )
    return out


def validate_pod(pod: Mapping[str, Any], jobs: Iterable[ThrottledJob]) -> str | None:
    """The reason to reject a new pod, or None to admit it.

    A pod is rejected when a throttled job's budget (same namespace) selects it
    by its labels. The message names the budget, the limit and what is used.
    """
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace") or ""
    labels = meta.get("labels") or {}
    for job in jobs:
        if job.namespace == ns and job.matcher(labels):
            what = "VRAM" if job.kind == "TotalVRAM" else "RAM"
            return (
                f"GPUMemoryBudget {job.namespace}/{job.budget} selects this pod, and its job is "
                f"throttled: total {what} {format_bytes(job.observed_bytes)} is above its limit "
                f"{format_bytes(job.limit_bytes)} (throttled since {job.since.isoformat()}); "
                "new pods of this job are rejected until its usage is back under the limit"
            )
    return None
