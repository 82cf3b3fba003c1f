"""Every text the engine writes for people: Event messages, the pod annotation
``vramguard.io/violation``, the violation messages in budget status, and the
problems for the log.

Each function takes the figures and returns the text; nothing here decides.
Bytes are written with ``vramguard_api.units.format_bytes``, durations with
``format_seconds`` and times as RFC 3339 (``records.format_time``). An Event
names the budget, the subject, the measured value, the limit, what was done
and the next step with its time (docs/engine.md, "The ladder").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from vramguard_api.budget import LEAK_MEMORY
from vramguard_api.steps import Action
from vramguard_api.units import format_bytes, format_seconds
from vramguard_api.usage import PodMemoryLimit
from vramguard_operator.engine.keys import (
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_STATE_SIGNATURE,
    ANNOTATION_VIOLATIONS,
    BudgetRef,
    ViolationKey,
)
from vramguard_operator.engine.ladder import Ladder
from vramguard_operator.engine.measure import Measure
from vramguard_operator.engine.pressure import Occupant, Verdict
from vramguard_operator.engine.records import ViolationRecord, format_time

_WHAT = {
    "PodVRAM": "VRAM",
    "PodRAM": "RAM",
    "DeviceVRAM": "VRAM",
    "TotalVRAM": "total VRAM",
    "TotalRAM": "total RAM",
}


def subject(key: ViolationKey) -> str:
    """What a violation is about: ``VRAM on device GPU-1 of pod w0``,
    ``total RAM of the selected pods``, ``VRAM of pod w0`` (a leak in VRAM),
    ``RAM of pod w0`` (a leak in its RAM working set)."""
    if key.kind in LEAK_MEMORY:
        return f"{LEAK_MEMORY[key.kind]} of pod {key.pod}"
    what = _WHAT[key.kind]
    if key.pod is None:
        return f"{what} of the selected pods"
    where = "" if key.device is None else f" on device {key.device}"
    return f"{what}{where} of pod {key.pod}"


def value(key: ViolationKey, v: int) -> str:
    """A measured value or limit: bytes, or bytes per hour for a leak."""
    return f"{format_bytes(v)}/h" if key.kind in LEAK_MEMORY else format_bytes(v)


def leak_detail(m: Measure) -> str:
    """A leak's figures: growth, its lower bound, the window, the threshold and the
    projected exhaustion; empty when ``m`` has no figures (unknown data)."""
    f = m.leak
    if f is None:
        return ""
    text = (
        f"{LEAK_MEMORY.get(m.key.kind, 'VRAM')} grows {format_bytes(f.growth)}/h (lower bound {format_bytes(f.low)}/h) over "
        f"{format_seconds(f.window_seconds)}, threshold {format_bytes(m.limit)}/h"
    )
    if f.seconds_left is not None and f.cap is not None:
        text += f"; projected to reach {format_bytes(f.cap)} in {format_seconds(f.seconds_left)}"
    return text


def step_text(
    budget: BudgetRef,
    rec: ViolationRecord,
    m: Measure,
    next_action: Action | None,
    next_time: datetime | None,
    done: Action | None,
    cpu: str | None = None,
    done_text: str | None = None,
) -> str:
    """The Event text of a step: budget, subject, measured value, limit and since
    when, what was ``done`` (the CPU limit ``cpu`` for Throttle; ``done_text``,
    when given, says it instead), next step and when."""
    key = rec.key
    head = f"budget {budget.namespace}/{budget.name}: "
    if key.kind in LEAK_MEMORY:
        detail = leak_detail(m) or f"{LEAK_MEMORY[key.kind]} grows {value(key, m.observed or 0)}, threshold {value(key, m.limit)}"
        head += f"pod {key.pod} leaks: {detail}."  # the detail names the memory
    else:
        head += (
            f"{subject(key)} is {format_bytes(m.observed)}, above its {key.kind} limit "
            f"{format_bytes(m.limit)} since {format_time(rec.since)}."
        )
    if done_text is not None:
        head += f" {done_text}"
    elif done == Action.THROTTLE:
        head += f" Throttled: CPU limit set to {cpu}."
    elif done is not None:
        head += f" {Action(done).info.done.capitalize()}."
    if next_action is None:
        return head + " No further step."
    if next_time is None:
        return head + f" Next: {next_action} when the projected exhaustion is near."
    return head + f" Next: {next_action} at {format_time(next_time)}."


def dry_run_text(action: Action, text: str) -> str:
    """A DryRunStep's text: ``dry run: would <verb>.`` and the step's text."""
    return f"dry run: would {Action(action).info.verb}. {text}"


def throttle_reapplied_text(text: str, cpu: str) -> str:
    """A re-applied Throttle (for logs only: it posts no Event)."""
    return f"{text} Throttle re-applied: CPU limit set to {cpu} again."


def throttle_impossible_text(text: str, reason: str) -> str:
    """A Throttle step that could resize no container."""
    return f"{text} Throttle impossible: {reason}"


def capped_text(hard: Mapping[str, int], floors: Mapping[str, int]) -> str:
    """What a Cap step set: the hard limit per device and, where it starts above
    its level (``floors``), that it follows the pod's use down to the level."""
    parts = []
    for uuid in sorted(hard):
        part = f"{format_bytes(hard[uuid])} on {uuid}"
        if hard[uuid] > floors.get(uuid, hard[uuid]):
            part += f", down to {format_bytes(floors[uuid])} as the pod frees memory"
        parts.append(part)
    return f"Capped: GPU memory hard limit {'; '.join(parts)}."


def cap_impossible_text(text: str, reason: str) -> str:
    """A Cap step that could set no limit."""
    return f"{text} Cap impossible: {reason}"


def cap_status_text(devices: Sequence[tuple[str, PodMemoryLimit | None]], impossible: str | None) -> str:
    """How a fired Cap stands, for the status message: impossible and why, or per
    device what the node agent reports (held, pending, failed and why)."""
    if impossible is not None:
        return f"cap impossible: {impossible}"
    parts = []
    for uuid, e in devices:
        if e is None:
            parts.append(f"cap on {uuid}: not reported yet")
        elif e.state == "Applied" and e.hard_limit_bytes is not None:
            parts.append(f"cap on {uuid}: {format_bytes(e.hard_limit_bytes)} held")
        else:
            parts.append(f"cap on {uuid}: {e.state} ({e.reason})" + (f": {e.message}" if e.message else ""))
    return "; ".join(parts)


def recovered_text(budget: BudgetRef, key: ViolationKey, observed: int, limit: int, cause: str) -> str:
    """A violation closed: the value it is back to, the limit and the cause."""
    return (
        f"budget {budget.namespace}/{budget.name}: {subject(key)} back to "
        f"{value(key, observed)} (limit {value(key, limit)}): violation closed ({cause})"
    )


def budget_gone_text(key: ViolationKey, pod: str) -> str:
    """A pod's violation closed because its budget was deleted or recreated."""
    return f"budget {key.namespace}/{key.budget} is gone: {key.label()} violation on pod {pod} closed"


def orphaned_throttle_text(pod: str) -> str:
    """CPU put back on a pod that vramguard throttled and no violation holds."""
    return f"pod {pod} is throttled by vramguard without an open violation: CPU restored"


def warning_text(budget: BudgetRef, m: Measure, threshold: float, next_action: Action | None) -> str:
    """Usage above the warning threshold: value, share of the limit, the threshold
    and what comes next if it goes on."""
    observed = m.observed or 0
    text = (
        f"budget {budget.namespace}/{budget.name}: {subject(m.key)} is "
        f"{format_bytes(observed)}, {observed / m.limit:.0%} of its {m.key.kind} limit "
        f"{format_bytes(m.limit)} (warning threshold {threshold:.0%})."
    )
    return text + (f" Next: a violation, then {next_action}." if next_action else "")


def violation_message(
    rec: ViolationRecord,
    m: Measure | None,
    observed: int | None,
    limit: int | None,
    throttle_impossible: str | None,
    cap: str | None = None,
) -> str:
    """The message of a ``status.violations`` entry (at most 1024 characters);
    ``cap``: how its Cap stands (``cap_status_text``)."""
    if rec.opened_at is None:
        msg = f"above the limit since {format_time(rec.since)}, within the tolerance"
    elif m is None or m.over is None:
        msg = "no fresh measured data: escalation paused"
    else:
        msg = leak_detail(m) or f"{subject(rec.key)} {format_bytes(observed)} > {format_bytes(limit)}"
        if throttle_impossible is not None:
            msg += f"; throttle impossible: {throttle_impossible}"
        if cap:
            msg += f"; {cap}"
    return msg[:1024]


def pod_message(records: Iterable[ViolationRecord], ladder_of: Callable[[ViolationKey], Ladder | None]) -> str:
    """The value of ``vramguard.io/violation``: per violation, budget, kind,
    values, since, the last step and the next one with its time."""
    lines = []
    for r in sorted(records, key=lambda r: (r.key.budget, r.key.kind, r.key.device or "")):
        unit = "/h" if r.key.kind in LEAK_MEMORY else ""
        text = f"budget {r.key.budget}: {r.key.label()}"
        if r.observed_bytes is not None and r.limit_bytes is not None:
            text += f" {format_bytes(r.observed_bytes)}{unit} > {format_bytes(r.limit_bytes)}{unit}"
        text += f" since {format_time(r.since)}"
        if r.step is not None and r.step_time is not None:
            text += f"; {r.step} at {format_time(r.step_time)}"
        ladder = ladder_of(r.key)
        rung = ladder.next_after(r.step) if ladder is not None else None
        if rung is not None and r.opened_at is not None and rung.after_seconds != float("inf"):
            text += f"; next {rung.action} at {format_time(r.opened_at + timedelta(seconds=rung.after_seconds))}"
        lines.append(text)
    return "; ".join(lines)


def restore_problem(namespace: str, pod: str, left: list[str]) -> str:
    """A recorded original CPU that is not put back (the container is not at a
    throttle target), for ``EngineOutput.problems``."""
    return (
        f"pod {namespace}/{pod} annotation {ANNOTATION_ORIGINAL_CPU}: "
        f"{', '.join(left) or 'no valid entry'}: not restored (no violation throttled "
        "the container to its current CPU limit); annotation removed"
    )


# --- device pressure (engine.pressure_out) ------------------------------------------


def pressure_head(v: Verdict) -> str:
    """``device GPU-1 on node-a has 3.1Gi free (under 5%: 3.9Gi)``, or, when
    the room a pod within its share needs set the threshold, ``... has 3.1Gi
    free, less than the 9.8Gi pod chat needs to reach its share of 19.8Gi``."""
    d, rule, o = v.device, v.rule, v.room_for
    head = f"device {d.uuid} on {d.node} has {format_bytes(d.free)} free"
    if o is not None:
        return f"{head}, less than the {format_bytes(o.room)} pod {o.pod.name} needs to reach its share of {format_bytes(o.share)}"
    return head if rule is None else f"{head} (under {rule.text()}: {format_bytes(v.min_free)})"


def _protects(v: Verdict) -> str:
    n = len(v.protected)
    if n == 0:
        return "to keep memory free for pods within their shares"
    return f"to protect {n} pod{'s' if n > 1 else ''} within {'their shares' if n > 1 else 'its share'}"


def _budget_head(o: Occupant) -> str:
    return f"budget {o.home.namespace}/{o.home.name}: " if o.home is not None and o.home.name else ""


def pressure_evict_text(v: Verdict, o: Occupant, dry_run: bool) -> str:
    """The Event of a device-pressure eviction of ``o`` (or of the one that
    would be, in DryRun): the budget, the device's free memory and threshold,
    what the pod holds above its share, whom it protects and what comes next."""
    what = (
        f"pod {o.pod.name}, {format_bytes(o.above)} above its share of {format_bytes(o.share)} "
        f"({format_bytes(o.used)} on the device), {_protects(v)}"
    )
    if dry_run:
        return f"dry run: would evict. {_budget_head(o)}{pressure_head(v)}; would evict {what}. Nothing done."
    return (
        f"{_budget_head(o)}{pressure_head(v)}; evicting {what}. Next: no other pod on this device until it is "
        f"gone; then another only if free memory is still under {format_bytes(v.min_free)}."
    )


def pressure_exhausted_text(v: Verdict) -> str:
    """No pod above its share could be evicted (the actions layer adds why)."""
    n = len(v.protected)
    who = f"its {n} pod{'s' if n > 1 else ''} within {'their shares' if n > 1 else 'its share'}" if n else "its pods"
    return (
        f"{pressure_head(v)}; no pod above its share could be evicted: the device will run out of memory, "
        f"and {who} may be killed by out-of-memory errors."
    )


def pressure_entry_message(v: Verdict | None, o: Occupant, state: str) -> str:
    """The message of a DevicePressure entry in a budget's status."""
    if state == Action.EVICT and v is not None:
        return (
            f"evicting: {pressure_head(v)}; {format_bytes(o.above)} above its share of {format_bytes(o.share)}"
        )[:1024]
    if state == "DryRun" and v is not None:
        return (
            f"would evict (dry run): {pressure_head(v)}; {format_bytes(o.above)} above its share of "
            f"{format_bytes(o.share)}"
        )[:1024]
    if state == "Leaving":
        return "evicted for device pressure: waiting for its memory to be freed"
    return "no fresh, complete data on the device: kept as it was"
def state_rejected(namespace: str, pod: str, annotations: Mapping[str, str]) -> str:
    """A pod whose escalation state is not sealed by this operator's key."""
    shown = {k: annotations[k][:120] for k in (ANNOTATION_VIOLATIONS, ANNOTATION_ORIGINAL_CPU) if k in annotations}
    why = "has no seal" if ANNOTATION_STATE_SIGNATURE not in annotations else "does not match its seal"
    return (
        f"pod {namespace}/{pod}: its vramguard state {shown} {why} (it was not written by this operator: "
        "edited by hand, forged, or written under another state key): not obeyed, and replaced by the "
        "state the operator holds"
    )[:1024]


def state_too_large(why: str) -> str:
    """A pod whose violations annotation is larger than any the operator writes."""
    return f"{why}: not obeyed (not written by this operator), and replaced by the state the operator holds"[:1024]


def evaluation_failed(err: BaseException) -> str:
    """A budget whose evaluation raised: the error, and that it is skipped."""
    return (
        f"evaluating this budget raised {type(err).__name__}: {str(err)[:300]}; it is skipped (its escalation "
        "state kept, nothing decided) until it changes; other budgets are not affected"
    )


def evaluation_timeout(seconds: float) -> str:
    """A budget whose evaluation ran out of time."""
    return (
        f"evaluating this budget took longer than {format_seconds(seconds)}; it is skipped (its escalation state "
        "kept, nothing decided) until it changes or 10 minutes pass; other budgets are not affected"
    )


def report_invalid(node: str, reason: str) -> str:
    """A node report whose numbers are not believed."""
    return f"the report of node {node} is not believed: {reason}; no action on its pods until it is consistent"
