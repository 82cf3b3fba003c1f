"""An engine output applied by an actions layer whose every call succeeds.

Pure: engine types in, engine types out. Shared by ``vramguard replay``
(which applies everything at once) and the fleet simulation in vramguard-sim
(which applies annotations and CPU resizes with this, and evictions through
its own rate limiter and PodDisruptionBudgets); the product's, so that replay
never imports the simulators.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from vramguard_api.budget import GPUMemoryBudget
from vramguard_operator.engine.types import EngineOutput, Evict, PodFacts, Recover, Throttle

Resize = dict[str, tuple[str, str | None]]
"""CPU to set per container: name -> (limit, request or None to keep it)."""


def output_changes(out: EngineOutput) -> tuple[dict[str, Mapping[str, str | None]], dict[str, Resize], set[str]]:
    """What an output changes on pods, by pod uid: annotation patches, CPU
    resizes (Throttle, and the restores of Recover) and evictions."""
    # the state first, then (every Event posted) the records marked posted
    patches: dict[str, Mapping[str, str | None]] = {
        p.pod.uid: {**p.annotations, **(p.explained or {})} for p in out.pod_patches
    }
    resizes: dict[str, Resize] = {}
    evicted: set[str] = set()
    for d in out.decisions:
        if d.pod is None:
            continue
        if isinstance(d, Throttle):
            resizes.setdefault(d.pod.uid, {}).update({c.name: (c.limit, c.request) for c in d.resize})
        elif isinstance(d, Recover) and d.restore:
            resizes.setdefault(d.pod.uid, {}).update({c.name: (c.limit, c.request) for c in d.restore})
        elif isinstance(d, Evict):
            evicted.add(d.pod.uid)
    return patches, resizes, evicted


def applied(
    pod: PodFacts, patch: Mapping[str, str | None] | None, resize: Resize | None, terminating: bool
) -> PodFacts:
    """The pod after an annotation merge patch (``None`` removes a key), a CPU
    resize and, if ``terminating``, an eviction."""
    ann = dict(pod.annotations)
    for k, v in (patch or {}).items():
        if v is None:
            ann.pop(k, None)
        else:
            ann[k] = v
    containers = pod.containers
    if resize:
        containers = tuple(
            replace(c, cpu_limit=resize[c.name][0], cpu_request=resize[c.name][1] or c.cpu_request)
            if c.name in resize
            else c
            for c in pod.containers
        )
    return replace(pod, annotations=ann, containers=containers, terminating=pod.terminating or terminating)


def apply_output(
    out: EngineOutput, budgets: Sequence[GPUMemoryBudget], pods: Sequence[PodFacts]
) -> tuple[list[GPUMemoryBudget], list[PodFacts]]:
    """Apply an engine output as an actions layer whose every call succeeds:
    statuses written, annotation patches merged, Throttle and restoring Recover
    resizes applied, evicted pods terminating. For the replay and for tests."""
    statuses = {(u.budget.namespace, u.budget.name): u.status for u in out.statuses}
    new_budgets = []
    for b in budgets:
        key = (b.metadata.namespace or "", b.metadata.name or "")
        new_budgets.append(b.model_copy(update={"status": statuses.get(key, b.status)}))
    patches, resizes, evicted = output_changes(out)
    return new_budgets, [applied(p, patches.get(p.uid), resizes.get(p.uid), p.uid in evicted) for p in pods]
