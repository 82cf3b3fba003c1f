"""Which pods a budget may leave out of an evaluation, and what each adds to
its status (the running totals of incremental evaluation: ``EngineInput.quiet``).

A pod may be left out when nothing about it can change the budget's decisions:
it carries no vramguard state, the budget's status names it in no violation or
warning, and every per-pod, per-device and leak limit takes the fast path for
its data (``measure.silent``: unknown, or below the warning threshold), no
memory limit is settled for it (the budget, or the policy for a budget that
leaves it unset, asks for no soft limits at the shares: a pod's limits are
settled only when it is given), and its node's data can be believed
(``EngineInput.unknown_nodes``, and the report's own checks: a report not
believed is named in the budget's DataStale condition, from the pods given). The
engine then builds the same status from the sum of such pods' ``QuietPods``
as from the pods themselves (tests/unit/engine/test_quiet.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.inputs import EngineConfig, PodFacts, QuietPods
from vramguard_operator.engine.keys import ANNOTATION_PREFIX
from vramguard_operator.engine.measure import BudgetLimits, pod_data, read_nodes, silent
from vramguard_operator.engine.records import whole_seconds

_DONE_PHASES = ("Succeeded", "Failed")


def quiet_pod(
    budget: GPUMemoryBudget,
    pod: PodFacts,
    report: NodeGPUUsage | None,
    now: datetime,
    config: EngineConfig,
    soft_limits: bool = False,
    unknown_nodes: Mapping[str, str] | None = None,
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
    operator's incremental planning couples the pods of such nodes)."""
    spec = budget.spec
    if spec.limits.total is not None or any(k.startswith(ANNOTATION_PREFIX) for k in pod.annotations):
        return None
    st = budget.status
    if st is not None and any(e.pod == pod.name for e in (*(st.violations or ()), *(st.warnings or ()))):
        return None
    if pod.phase in _DONE_PHASES:
        return QuietPods()
    if pod.phase != "Running" or pod.terminating or not pod.node_name:
        return QuietPods(matched=1)
    own = spec.enforcement.soft_limits
    if own == "Share" or (own is None and soft_limits) or pod.node_name in (unknown_nodes or {}):
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
