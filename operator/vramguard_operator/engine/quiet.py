"""Which pods a budget may leave out of an evaluation, and what each adds to
its status (the running totals of incremental evaluation: ``EngineInput.quiet``).

A pod may be left out when nothing about it can change the budget's decisions:
it carries no vramguard state, the budget's status names it in no violation or
warning, and every per-pod, per-device and leak limit takes the fast path for
its data (``measure.silent``: unknown, or below the warning threshold), its
memory limits need no settling (no budget asks for soft limits at the shares,
or ``limits_settled``: its ``vramguard.io/memory-limits`` already holds the
soft limits at its shares that an evaluation would write, and nothing else),
and its node's data can be believed
(``EngineInput.unknown_nodes``, and the report's own checks: a report not
believed is named in the budget's DataStale condition, from the pods given). The
engine then builds the same status from the sum of such pods' ``QuietPods``
as from the pods themselves (tests/unit/engine/test_quiet.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine import caps
from vramguard_operator.engine.inputs import EngineConfig, PodFacts, QuietPods
from vramguard_operator.engine.keys import ANNOTATION_MEMORY_LIMITS, ANNOTATION_PREFIX
from vramguard_operator.engine.measure import BudgetLimits, pod_data, read_nodes, silent
from vramguard_operator.engine.records import whole_seconds
from vramguard_operator.engine.spec_check import spec_problem

_DONE_PHASES = ("Succeeded", "Failed")


def quiet_pod(
    budget: GPUMemoryBudget,
    pod: PodFacts,
    report: NodeGPUUsage | None,
    now: datetime,
    config: EngineConfig,
    soft_limits: bool = False,
    unknown_nodes: Mapping[str, str] | None = None,
    settled: bool = False,
) -> QuietPods | None:
    """What ``pod`` (which ``budget`` selects) adds to the budget's status when it
    may be left out of ``EngineInput.pods``; None when it must be given.
    ``report``: its node's report (None: missing). A budget with a total limit
    needs every pod (a total's steps choose among them), and one whose spec
    does not parse decides nothing: both give None. ``soft_limits``: the
    policy asks for soft limits at the shares (``EffectivePolicy.soft_limits``);
    a running pod whose budget wants them gives None (its limits are settled
    every evaluation). ``unknown_nodes``: nodes whose data cannot be believed
    (a pod on one gives None). Budgets with limits on named devices
    (``EngineInput.device_limits``) are not for this. Device pressure is the
    caller's: every pod on a device that a rule compares is given (the
    operator's incremental planning couples the pods of such nodes).
    ``settled``: ``limits_settled`` holds for the pod (over every budget that
    selects it): its memory-limits annotation, and soft limits asked for,
    then need no evaluation."""
    spec = budget.spec
    own_state = (k for k in pod.annotations if k.startswith(ANNOTATION_PREFIX))
    if spec.limits.total is not None or any(not (settled and k == ANNOTATION_MEMORY_LIMITS) for k in own_state):
        return None
    st = budget.status
    if st is not None and any(e.pod == pod.name for e in (*(st.violations or ()), *(st.warnings or ()))):
        return None
    if pod.phase in _DONE_PHASES:
        return QuietPods()
    if pod.phase != "Running" or pod.terminating or not pod.node_name:
        return QuietPods(matched=1)
    if (not settled and caps.soft_limits_asked(spec, soft_limits)) or pod.node_name in (unknown_nodes or {}):
        return None
    try:
        lim = BudgetLimits.of(spec, config.recovery_margin, {})
    except ValueError:
        return None
    node = pod.node_name
    d = pod_data(pod, read_nodes({node: report} if report else {}, whole_seconds(now), config.freshness_seconds))
    if d.state == "Invalid" or not silent(lim, d):  # a report not believed is named in the status
        return None
    return QuietPods(
        matched=1,
        vram_bytes=d.vram or 0,
        vram_known=int(d.vram is not None),
        ram_bytes=d.ram or 0,
        ram_known=int(d.ram is not None),
        stale_nodes=frozenset({node}) if d.state == "Stale" else frozenset(),
        missing_nodes=frozenset({node}) if d.state == "Missing" else frozenset(),
    )


def wants_soft_limits(budget: GPUMemoryBudget, policy_soft: bool, acting: bool) -> bool:
    """Whether the engine sets soft limits at the shares for the pods of
    ``budget`` (``cap_steps.want_soft_limits``): it acts for real (``acting``:
    the cluster policy and the budget enforce, its namespace is not exempt)
    and its ``enforcement.softLimits`` is ``Share``, or unset with the policy
    asking for them (``policy_soft``)."""
    return acting and budget.spec.enforcement.mode == "Enforce" and caps.soft_limits_asked(budget.spec, policy_soft)


def limits_settled(
    pod: PodFacts,
    budgets: Iterable[tuple[GPUMemoryBudget, bool]],
    report: NodeGPUUsage | None,
    now: datetime,
    config: EngineConfig,
) -> bool:
    """Whether an evaluation of ``pod`` would leave its memory limits as they
    are: ``budgets``, every budget that selects it as the engine evaluates it,
    each with whether it wants soft limits at the shares
    (``wants_soft_limits``). True only when the pod runs on a fresh report,
    its only vramguard annotation (if any) is ``vramguard.io/memory-limits``,
    which parses and holds no hard limit (no Cap), and it equals what
    ``engine.caps`` derives: the lowest share per device of those budgets
    (``caps.shares``), through ``caps.desired_limits`` (no annotation where
    none can be written: a device that cannot hold limits, an agent that
    does not apply them). Any doubt (a spec out of bounds or not parsing)
    gives False."""
    if pod.phase != "Running" or pod.terminating or not pod.node_name or report is None:
        return False
    if any(k.startswith(ANNOTATION_PREFIX) and k != ANNOTATION_MEMORY_LIMITS for k in pod.annotations):
        return False
    text = pod.annotations.get(ANNOTATION_MEMORY_LIMITS)
    current, problem = caps.current_limits(pod)
    if problem is not None or any(lim.hard_limit is not None for lim in current.values()):
        return False
    nodes = read_nodes({pod.node_name: report}, whole_seconds(now), config.freshness_seconds)
    d = pod_data(pod, nodes)
    if d.state != "Fresh":
        return False
    want = caps.LimitsWant()
    for budget, soft in budgets:
        if not soft:
            continue
        if spec_problem(budget.spec) is not None:
            return False
        try:
            lim = BudgetLimits.of(budget.spec, config.recovery_margin, {})
        except (ValueError, ArithmeticError):
            return False
        want = want.merged(caps.LimitsWant(soft=caps.shares(d, lim)))
    if not want.soft:  # no budget wants a limit here: the engine removes any annotation
        return text is None
    try:
        return caps.annotation(caps.desired_limits(current, want, d, nodes.get(pod.node_name))) == text
    except ValueError:
        return False
