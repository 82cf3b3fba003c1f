"""Escalation state: the violation records persisted on pods and budgets.

A violation's record (``ViolationRecord``) is read back at every evaluation
from two places and merged, so that a restart between an action and a status
write neither forgets a violation nor repeats a step:

- the budget's ``status.violations`` (every violation, including pending ones
  and those of DryRun budgets; a step reached while the budget was not
  enforcing carries ``dryRun: true``, and the engine disregards it once the
  budget enforces);
- the pod annotation ``vramguard.io/violations`` (Enforce only: every open
  violation that reached a step on that pod, written together with the action).

Merging keeps the earliest ``since``/``openedAt`` and the furthest step.

The annotation is input from an object that others can write: every field of
every entry is checked (type, value, time range) and a bad entry is reported
and skipped, never passed on to the engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast, get_args

from vramguard_api.budget import GPUMemoryBudget, ViolationKind
from vramguard_api.steps import ACTIONS, STEP_RANKS, Action
from vramguard_api.usage import MAX_DEVICES
from vramguard_operator.engine.keys import ViolationKey

TOTAL_KINDS = frozenset({"TotalVRAM", "TotalRAM"})
_KINDS = frozenset(get_args(ViolationKind)) - {"DevicePressure"}  # kept in budget status only
# Record times outside this range are refused: the engine adds ladder delays to
# them, and datetime arithmetic near year 1 or 9999 overflows.
_MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_TIME = datetime(3000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ViolationRecord:
    """Persisted escalation state of one violation (as stored in the pod annotation
    ``vramguard.io/violations`` and, without budget/uid, in ``status.violations``).

    ``since``: usage first above the limit. ``opened_at``: when the violation
    opened (None while pending within the tolerance). ``step``/``step_time``:
    the last step that fired (Evict is recorded once the pod is terminating).
    ``observed_bytes``/``limit_bytes``: the values when that step fired (so the
    annotation changes only on transitions, not with every sample).
    ``dry_run``: ``step`` only would have fired (the budget was not enforcing);
    once the budget enforces, such a step is disregarded and the ladder fires
    the due steps for real. ``evict_target_uid``: for a Total violation whose
    Evict is due, the uid of the pod chosen for eviction; the step is recorded
    once that pod is terminating or gone. ``events_posted``: on a pod, whether
    the Events of ``step`` (on the pod and the budget's copy) were posted: a
    step's record is written before its action with False and marked True
    once its Events are posted, so that an operator stopped in between posts
    them at its next evaluation (the annotation says ``"eventsPosted":
    false`` only while they are not; a status record is always True).
    All times are whole seconds (metav1.Time's resolution).
    """

    key: ViolationKey
    budget_uid: str
    since: datetime
    opened_at: datetime | None = None
    step: Action | None = None
    step_time: datetime | None = None
    observed_bytes: int | None = None
    limit_bytes: int | None = None
    dry_run: bool = False
    evict_target_uid: str | None = None
    events_posted: bool = True


def step_rank(step: Action | None) -> int:
    """Position of ``step`` along Annotate < Throttle < Cap < Evict (``Action.rank``); -1 for None."""
    return -1 if step is None else STEP_RANKS[step]


_THROTTLE_RANK = Action.THROTTLE.rank
_CAP_RANK = Action.CAP.rank


def throttled(rec: ViolationRecord) -> bool:
    """Whether a Throttle step really fired for ``rec`` (not only in a dry run)."""
    return step_rank(rec.step) >= _THROTTLE_RANK and not rec.dry_run


def capped(rec: ViolationRecord) -> bool:
    """Whether ``rec`` reached its Cap step for real (not only in a dry run)."""
    return step_rank(rec.step) >= _CAP_RANK and not rec.dry_run


# --- time ------------------------------------------------------------------------


def whole_seconds(t: datetime) -> datetime:
    """``t`` in UTC, truncated to whole seconds (metav1.Time's resolution), so
    that state survives a round trip through the API unchanged.

    Raises ``ValueError`` for a naive datetime (the engine needs UTC)."""
    if t.tzinfo is None:
        raise ValueError(f"now: naive datetime {t.isoformat()} (want timezone-aware UTC)")
    return t.astimezone(UTC).replace(microsecond=0)


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``: ``2024-05-01T10:00:00Z``."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: Any, field: str) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"{field}: want an RFC 3339 time, got {value!r}")
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
        t = whole_seconds(t if t.tzinfo else t.replace(tzinfo=UTC))
    except (ValueError, OverflowError):
        raise ValueError(f"{field}: invalid RFC 3339 time {value!r}") from None
    if not _MIN_TIME <= t < _MAX_TIME:
        raise ValueError(f"{field}: time {value!r} outside {_MIN_TIME.year}..{_MAX_TIME.year - 1}")
    return t


# --- the pod annotation ------------------------------------------------------------


def record_to_json(rec: ViolationRecord) -> dict[str, Any]:
    """One record as the pod annotation stores it (the pod is the annotated one
    for per-pod kinds, none for totals)."""
    out: dict[str, Any] = {
        "budget": rec.key.budget,
        "budgetUID": rec.budget_uid,
        "kind": rec.key.kind,
    }
    if rec.key.device is not None:
        out["device"] = rec.key.device
    out["since"] = format_time(rec.since)
    if rec.opened_at is not None:
        out["openedAt"] = format_time(rec.opened_at)
    if rec.step is not None:
        out["step"] = rec.step
    if rec.step_time is not None:
        out["stepTime"] = format_time(rec.step_time)
    if rec.observed_bytes is not None:
        out["observedBytes"] = rec.observed_bytes
    if rec.limit_bytes is not None:
        out["limitBytes"] = rec.limit_bytes
    if rec.evict_target_uid is not None:
        out["evictTargetUID"] = rec.evict_target_uid
    if not rec.events_posted:
        out["eventsPosted"] = False
    return out


def records_to_annotation(records: Iterable[ViolationRecord]) -> str:
    """The value of ``vramguard.io/violations``: compact JSON list, sorted by key."""
    ordered = sorted(records, key=lambda r: (r.key.budget, r.key.kind, r.key.device or ""))
    return json.dumps([record_to_json(r) for r in ordered], separators=(",", ":"))


RECORDS_PER_BUDGET = len(_KINDS) - 1 + MAX_DEVICES
"""The most records one budget can write on one pod: one per kind, DeviceVRAM
once per device (``MAX_DEVICES``, the report's bound)."""
RECORD_BYTES = 512
"""Bytes allowed per record in the annotation (a record's compact JSON is
about 200-300 bytes: ``record_to_json``)."""


def records_bound(budgets: int) -> int:
    """The most records ``vramguard.io/violations`` can hold on a pod of a
    namespace with ``budgets`` budgets (given or held): theirs, and two more
    budgets' (the policy's implicit budget, and one deleted whose records
    are still to close)."""
    return (budgets + 2) * RECORDS_PER_BUDGET


def records_from_annotation(text: str, namespace: str, pod: str) -> tuple[list[ViolationRecord], list[str]]:
    """Parse ``vramguard.io/violations`` of pod ``namespace/pod``.

    Returns the records and a list of problems (one per malformed entry, naming
    the pod, the entry, the field and the value); malformed entries are
    skipped, the rest kept. Never raises on any text.
    """
    records, problems, _ = read_records(text, namespace, pod, None)
    return records, problems


def read_records(
    text: str, namespace: str, pod: str, max_records: int | None
) -> tuple[list[ViolationRecord], list[str], str | None]:
    """``records_from_annotation`` with a bound: a list of more than
    ``max_records`` entries (or a text longer than ``RECORD_BYTES`` each) is
    rejected as a whole, unparsed: no records, and the third value says why
    (one line). None: no bound."""
    where = f"pod {namespace}/{pod} annotation vramguard.io/violations"
    if max_records is not None and len(text) > max_records * RECORD_BYTES:
        return [], [], (f"{where}: {len(text)} bytes, more than the {max_records * RECORD_BYTES} "
                        f"that {max_records} records (what the budgets of its namespace could write) take")
    try:
        data = json.loads(text)
    except ValueError as err:
        return [], [f"{where}: invalid JSON {text[:80]!r}: {err}"], None
    except RecursionError:
        return [], [f"{where}: JSON nested too deeply {text[:80]!r}"], None
    if not isinstance(data, list):
        return [], [f"{where}: want a JSON list, got {text[:80]!r}"], None
    if max_records is not None and len(data) > max_records:
        return [], [], (f"{where}: {len(data)} records, more than the {max_records} "
                        "the budgets of its namespace could have written")
    records: list[ViolationRecord] = []
    problems: list[str] = []
    for i, entry in enumerate(data):
        try:
            records.append(_record_from_json(entry, namespace, pod))
        except ValueError as err:
            problems.append(f"{where}[{i}]: {err}"[:1024])
    return records, problems, None


def _record_from_json(entry: Any, namespace: str, pod: str) -> ViolationRecord:
    """One entry of the annotation; raises ``ValueError`` naming the field and
    the value on any entry ``record_to_json`` would not have written."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"entry: want a JSON object, got {_short(entry)}")
    kind = entry.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise ValueError(f"kind: want one of {', '.join(sorted(_KINDS))}, got {_short(kind)}")
    budget = entry.get("budget")
    if not isinstance(budget, str) or not budget:
        raise ValueError(f"budget: want a budget name, got {_short(budget)}")
    step = entry.get("step")
    if step is not None and (not isinstance(step, str) or step not in ACTIONS):
        raise ValueError(f"step: want one of {', '.join(ACTIONS)}, got {_short(step)}")
    device = _opt_str(entry, "device")
    if (device is None) == (kind == "DeviceVRAM"):
        want = "a device UUID for DeviceVRAM" if kind == "DeviceVRAM" else f"no device for {kind}"
        raise ValueError(f"device: want {want}, got {_short(device)}")
    _opt_str(entry, "pod")  # the annotated pod is the record's pod; a written one must still be text
    if "since" not in entry:
        raise ValueError("since: missing")
    key = ViolationKey(namespace, budget, cast(ViolationKind, kind), None if kind in TOTAL_KINDS else pod, device)
    return ViolationRecord(
        key=key,
        budget_uid=_opt_str(entry, "budgetUID") or "",
        since=_parse_time(entry["since"], "since"),
        opened_at=_opt_time(entry.get("openedAt"), "openedAt"),
        step=None if step is None else Action(step),
        step_time=_opt_time(entry.get("stepTime"), "stepTime"),
        observed_bytes=_opt_int(entry.get("observedBytes"), "observedBytes"),
        limit_bytes=_opt_int(entry.get("limitBytes"), "limitBytes"),
        evict_target_uid=_opt_str(entry, "evictTargetUID"),
        events_posted=_opt_bool(entry.get("eventsPosted"), "eventsPosted", True),
    )


def _opt_bool(value: Any, field: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{field}: want true or false, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _opt_str(entry: Mapping[str, Any], field: str) -> str | None:
    value = entry.get(field)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{field}: want a string, got {_short(value)}")
    return value


def _opt_time(value: Any, field: str) -> datetime | None:
    return None if value is None else _parse_time(value, field)


def _opt_int(value: Any, field: str) -> int | None:
    if value is None:
        return None
    # bool is an int in Python, not in JSON
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field}: want a non-negative integer, got {_short(value)}")
    return value


# --- the budget status ----------------------------------------------------------------


def records_from_status(budget: GPUMemoryBudget) -> list[ViolationRecord]:
    """The records held in ``budget.status.violations``."""
    status = budget.status
    if status is None or not status.violations:
        return []
    ns = budget.metadata.namespace or ""
    name = budget.metadata.name or ""
    uid = budget.metadata.uid or ""
    out = []
    for v in status.violations:
        key = ViolationKey(ns, name, v.kind, None if v.kind in TOTAL_KINDS else v.pod, v.device)
        out.append(
            ViolationRecord(
                key=key,
                budget_uid=uid,
                since=whole_seconds(v.since),
                opened_at=None if v.opened_at is None else whole_seconds(v.opened_at),
                step=v.step,
                step_time=None if v.step_time is None else whole_seconds(v.step_time),
                dry_run=bool(v.dry_run),
                evict_target_uid=v.evict_target_uid,
            )
        )
    return out


def merge_records(a: ViolationRecord, b: ViolationRecord) -> ViolationRecord:
    """Merge two records of the same key: earliest since/openedAt, furthest step
    (a step that fired beats one that only would have fired, at equal rank);
    the furthest step's Events count as posted only when every record of it
    says so."""
    further, other = (a, b) if (step_rank(a.step), not a.dry_run) >= (step_rank(b.step), not b.dry_run) else (b, a)
    opened = [t for t in (a.opened_at, b.opened_at) if t is not None]
    observed = further.observed_bytes if further.observed_bytes is not None else other.observed_bytes
    limit = further.limit_bytes if further.limit_bytes is not None else other.limit_bytes
    same_step = (other.step, other.dry_run) == (further.step, further.dry_run)
    return replace(
        further,
        since=min(a.since, b.since),
        opened_at=min(opened) if opened else None,
        budget_uid=a.budget_uid or b.budget_uid,
        observed_bytes=observed,
        limit_bytes=limit,
        evict_target_uid=further.evict_target_uid or other.evict_target_uid,
        events_posted=further.events_posted and (other.events_posted or not same_step),
    )


def event_key(budget_uid: str, key: ViolationKey, opened_at: datetime | None, what: str) -> str:
    """The identity of an Event about one violation (``EventSpec.key``): the
    budget's uid, the violation, when it opened (one occurrence of it) and
    what happened (a step, ``Recovered``). The same step of the same
    violation always has the same key, so its Event is posted once."""
    opened = "" if opened_at is None else format_time(opened_at)
    parts = (key.namespace, key.budget, budget_uid, key.kind, key.pod or "", key.device or "", opened, what)
    return "|".join(parts)
