"""A budget on the sum over the pods that share one DRA claim.

A ResourceClaim reserved for several pods books its memory once for all of
them (``dra.SharedClaim``). Each pod's own implicit budget already limits it
to the claim's total on the claim's devices; this budget limits their sum:
``dra:<claim name>``, uid ``implicit:claim:<claim uid>``, ``total.vram`` = the
claim's consumed memory, selecting its pods through the in-memory label
``vramguard.io/implicit-claim-<claim uid>`` (``label_pods``), laddered
``Annotate`` only like every implicit budget.

The engine's total sums each pod's VRAM over all its devices, so the budget is
made only where that sum is the claim's: every pod's GPUs come from this claim
alone (no other claim's GPU, no device-plugin GPU, no sharer's grant). Other
pods keep their per-pod limit only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.units import format_bytes
from vramguard_operator.policy.dra import SharedClaim
from vramguard_operator.policy.grants import EffectiveLimit
from vramguard_operator.policy.implicit import IMPLICIT_UID_PREFIX, synthesized_budget
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.request import PodGPURequest
from vramguard_operator.policy.sharers import declares_grant

CLAIM_LABEL_PREFIX = "vramguard.io/implicit-claim-"
CLAIM_NAME_PREFIX = "dra:"
CLAIM_UID_PREFIX = IMPLICIT_UID_PREFIX + "claim:"


@dataclass(frozen=True, slots=True)
class ClaimBudget:
    """The synthesized budget of one shared claim and the pods it selects."""

    namespace: str
    claim: str
    pod_uids: tuple[str, ...]
    budget: GPUMemoryBudget
    limit: EffectiveLimit

    @property
    def label(self) -> tuple[str, str]:
        """The in-memory label (key, value) that selects the claim's pods."""
        return next(iter((self.budget.spec.selector.match_labels or {}).items()))


def _only_this_claim(pod: Mapping[str, Any], held: frozenset[str], devices: Sequence[str]) -> bool:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    return held <= set(devices) and not PodGPURequest.from_api(pod).is_gpu_pod and not declares_grant(ann)


def claim_budgets(
    shared: Sequence[SharedClaim],
    pods: Mapping[str, Mapping[str, Any]],
    held: Mapping[str, frozenset[str]],
    merged: Mapping[str, MergedPolicy],
) -> list[ClaimBudget]:
    """A budget for each shared claim with at least two of its pods among
    ``pods`` (by uid; scheduled and unfinished), all holding GPUs from it alone
    (``held``: each pod's claimed GPU UUIDs). None in an exempt namespace."""
    out = []
    for s in shared:
        policy = merged.get(s.namespace, MergedPolicy(s.namespace))
        known = [u for u in s.pod_uids if u in pods]
        if policy.exempt or len(known) < 2:
            continue
        if not all(_only_this_claim(pods[u], held.get(u, frozenset()), s.devices) for u in known):
            continue
        detail = f"{format_bytes(s.bytes)} consumed, shared by {s.consumers} consumers: their total"
        limit = EffectiveLimit(s.bytes, f"dra/{s.name}", detail)
        labels = {CLAIM_LABEL_PREFIX + s.uid: "true"}
        budget = synthesized_budget(
            CLAIM_NAME_PREFIX + s.name, s.namespace, CLAIM_UID_PREFIX + s.uid, labels, {"total.vram": limit}, policy
        )
        out.append(ClaimBudget(s.namespace, s.name, tuple(known), budget, limit))
    return out
