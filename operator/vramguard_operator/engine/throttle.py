"""Throttle and restore plans: which containers' CPU resources to change through
the ``pods/resize`` subresource, and what to record to undo it.

In-place resize cannot add or remove a limit without changing the pod's QoS
class, and a container whose ``resizePolicy`` for cpu is ``RestartContainer``
would be restarted, so such containers are left alone. A request above the new
limit is lowered with it (requests may not exceed limits), keeping the
container's shape so that the pod's QoS class never changes (the API server
refuses a resize that would change it): a request equal to its limit stays
equal (a Guaranteed pod stays Guaranteed), a request below its limit stays
1m below the new one (a Burstable pod never becomes Guaranteed). The original limit and request are kept in the
``vramguard.io/original-cpu`` annotation and put back on recovery, but only on
containers whose CPU limit is still a throttle target vramguard set: the
annotation can be written by others, and must never raise a pod's CPU beyond
what vramguard itself took away. ``restore_unthrottled`` puts the CPU back on
pods that no violation holds at Throttle any more.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Literal

from vramguard_api.units import quantity_decimal
from vramguard_operator.engine import messages
from vramguard_operator.engine.inputs import PodFacts
from vramguard_operator.engine.keys import ANNOTATION_ORIGINAL_CPU, EVENT_RECOVERED, BudgetRef, ViolationKey
from vramguard_operator.engine.outputs import ContainerCPU, Decision, EventSpec, Recover
from vramguard_operator.engine.records import ViolationRecord, throttled

Original = dict[str, dict[str, str | None]]


@dataclass(frozen=True, slots=True)
class ThrottlePlan:
    """Containers to resize, the originals to record (merged with any already
    recorded) and, when nothing can be resized, why."""

    resize: tuple[ContainerCPU, ...]
    original: Original
    impossible_reason: str | None


def _cpu(value: str) -> Decimal:
    return quantity_decimal(value)


def _cpu_or_none(value: object) -> Decimal | None:
    """A CPU quantity as cores, None when it is not one (a pod's own value the
    API server would have refused: never trusted to be well formed here)."""
    if not isinstance(value, str):
        return None
    try:
        return _cpu(value)
    except (ValueError, ArithmeticError):
        return None


def _valid_cpu(value: object) -> bool:
    cores = _cpu_or_none(value)
    return cores is not None and cores > 0


def parse_original(text: str | None) -> Original | None:
    """Parse ``vramguard.io/original-cpu``; None when absent or malformed.

    A container entry whose ``limit`` is not a positive CPU quantity is
    skipped; a ``request`` that is not one is taken as unset."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    out: Original = {}
    for name, res in data.items():
        if isinstance(res, dict) and _valid_cpu(res.get("limit")):
            request = res.get("request")
            out[str(name)] = {
                "limit": res["limit"],
                "request": request if _valid_cpu(request) else None,
            }
    return out


def original_to_annotation(original: Mapping[str, Mapping[str, str | None]]) -> str:
    """Compact JSON for ``vramguard.io/original-cpu``."""
    return json.dumps({k: dict(v) for k, v in sorted(original.items())}, separators=(",", ":"))


def plan_throttle(pod: PodFacts, target: str, recorded: Original | None) -> ThrottlePlan:
    """Plan lowering each container's CPU limit to ``target`` (a quantity).

    Containers already at or below ``target`` are left as they are (no change,
    not a failure). ``recorded``: originals already in the pod annotation (a pod
    throttled by another violation keeps its first originals).
    """
    want = _cpu(target)
    original: Original = {k: dict(v) for k, v in (recorded or {}).items()}
    resize: list[ContainerCPU] = []
    skipped: list[str] = []
    at_target = 0
    for c in pod.containers:
        if c.cpu_limit is None:
            skipped.append(f"{c.name}: no CPU limit (resize cannot add one)")
            continue
        if c.cpu_resize_restart:
            skipped.append(f"{c.name}: resizePolicy cpu RestartContainer (resize would restart it)")
            continue
        limit = _cpu_or_none(c.cpu_limit)
        if limit is None:
            skipped.append(f"{c.name}: CPU limit {c.cpu_limit!r} is not a quantity")
            continue
        if limit <= want:
            at_target += 1
            continue
        request = c.cpu_request if _cpu_or_none(c.cpu_request) is not None else None
        new_request = _lowered_request(request, c.cpu_limit, want)
        if new_request is False:
            skipped.append(f"{c.name}: target {target} leaves no room for a request below the limit")
            continue
        resize.append(ContainerCPU(c.name, target, new_request if isinstance(new_request, str) else None))
        original.setdefault(c.name, {"limit": c.cpu_limit, "request": request})
    reason = None
    if not resize and not at_target:
        reason = "no container can be throttled in place: " + ("; ".join(skipped) or "pod has no containers")
    return ThrottlePlan(tuple(resize), original, reason)


_MILLI = Decimal("0.001")


def _lowered_request(request: str | None, limit: str, want: Decimal) -> str | None | Literal[False]:
    """The request to set with a new CPU limit ``want`` (cores): None to leave it,
    a quantity string, or False when the container's shape cannot be kept."""
    if request is None or _cpu(request) < want:
        return None
    if _cpu(request) == _cpu(limit):
        return _millis(want)
    lowered = want - _MILLI
    return False if lowered <= 0 else _millis(lowered)


def _millis(cores: Decimal) -> str:
    """A CPU quantity in millicores (``"99m"``), rounded down to a whole millicore."""
    return f"{int(cores / _MILLI)}m"


def plan_restore(original: Original, pod: PodFacts, targets: Collection[str]) -> tuple[ContainerCPU, ...]:
    """The resize that puts the recorded CPU resources back.

    Only containers of ``pod`` whose current CPU limit equals one of ``targets``
    (the throttle targets of the violations that throttled the pod, CPU
    quantities compared by value: ``"500m"`` equals ``"0.5"``) are restored; a
    container changed since, or a pod vramguard did not throttle, is left as it
    is. Empty when ``targets`` is empty."""
    wanted = {_cpu(t) for t in targets}
    at_target = {
        c.name
        for c in pod.containers
        if c.cpu_limit is not None and _valid_cpu(c.cpu_limit) and _cpu(c.cpu_limit) in wanted
    }
    return tuple(
        ContainerCPU(name, res["limit"] or "", res.get("request"))
        for name, res in sorted(original.items())
        if name in at_target
    )


@dataclass(frozen=True, slots=True)
class Restores:
    """What ``restore_unthrottled`` decided: the decisions (a restore attached to
    a pod's first Recover, or a new ``OrphanedThrottle`` Recover), the pods whose
    ``vramguard.io/original-cpu`` annotation goes, and problems for the log."""

    decisions: tuple[Decision, ...]
    cleared: tuple[str, ...]
    problems: tuple[str, ...]


def restore_unthrottled(
    pods_by_uid: Mapping[str, PodFacts],
    pod_records: Mapping[str, Mapping[ViolationKey, ViolationRecord]],
    new_original: Mapping[str, Original],
    throttle_targets: Mapping[str, Collection[str]],
    decisions: Sequence[Decision],
    now: datetime,
) -> Restores:
    """Put back the CPU of pods that vramguard throttled (their annotation says
    so, and no Throttle in this evaluation recorded it anew) and that no open
    violation holds at Throttle or beyond any more.

    Only containers whose CPU limit is the target of a violation that throttled
    the pod are restored (``throttle_targets``): ``vramguard.io/original-cpu``
    is an annotation anyone who can update the pod can write, and must not buy
    more CPU than vramguard took. Otherwise the annotation is only removed."""
    out = list(decisions)
    cleared: list[str] = []
    problems: list[str] = []
    for uid, pod in pods_by_uid.items():
        if pod.terminating or pod.phase != "Running" or ANNOTATION_ORIGINAL_CPU not in pod.annotations:
            continue
        if uid in new_original or any(throttled(r) for r in pod_records.get(uid, {}).values()):
            continue
        original = parse_original(pod.annotations[ANNOTATION_ORIGINAL_CPU]) or {}
        restore = plan_restore(original, pod, throttle_targets.get(uid, ()))
        cleared.append(uid)
        left = sorted(set(original) - {c.name for c in restore})
        if left or not original:
            problems.append(messages.restore_problem(pod.namespace, pod.name, left))
        if restore:
            _attach_restore(out, pod, restore, now)
    return Restores(tuple(out), tuple(cleared), tuple(problems))


def _attach_restore(decisions: list[Decision], pod: PodFacts, restore: tuple[ContainerCPU, ...], now: datetime) -> None:
    """Attach ``restore`` to the pod's first Recover without one, else add a Recover."""
    for i, dec in enumerate(decisions):
        if isinstance(dec, Recover) and dec.pod == pod.ref and not dec.restore:
            decisions[i] = replace(dec, restore=restore)
            return
    decisions.append(
        Recover(
            budget=BudgetRef(pod.namespace, ""),
            violation=ViolationKey(pod.namespace, "", "PodVRAM", pod.name),
            pod=pod.ref,
            time=now,
            observed_bytes=0,
            limit_bytes=0,
            event=EventSpec("Normal", EVENT_RECOVERED, messages.orphaned_throttle_text(pod.name)),
            restore=restore,
            cause="OrphanedThrottle",
        )
    )
