"""The escalation state on pods, as the engine reads it and writes it back.

Reading: each pod's ``vramguard.io/violations`` records, checked entry by
entry (``records.records_from_annotation``), and, when the operator has a
state key, checked as a whole against its seal (``seal``): state that does
not verify is not believed. Such a pod is evaluated as if it carried no state
(the engine sees it without its vramguard annotations), the problem is
reported on the pod, and its annotations are rewritten from what the engine
does believe (the budgets' records) at once.

Writing: the annotation patch of each pod whose state changed, sealed, and
the second patch that marks the Events of its steps posted (``PodPatch``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field, replace

from vramguard_operator.engine import messages
from vramguard_operator.engine.inputs import PodFacts
from vramguard_operator.engine.keys import (
    ANNOTATION_MEMORY_LIMITS,
    ANNOTATION_MESSAGE,
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_STATE_SIGNATURE,
    ANNOTATION_VIOLATIONS,
    EVENT_STATE_REJECTED,
    ViolationKey,
)
from vramguard_operator.engine.ladder import Ladder
from vramguard_operator.engine.outputs import ObjectProblem, PodPatch
from vramguard_operator.engine.records import ViolationRecord, read_records, records_bound, records_to_annotation
from vramguard_operator.engine.seal import has_state, sealed, verify
from vramguard_operator.engine.throttle import Original, original_to_annotation

_STATE_KEYS = (ANNOTATION_VIOLATIONS, ANNOTATION_ORIGINAL_CPU, ANNOTATION_STATE_SIGNATURE, ANNOTATION_MESSAGE)

PodRecords = dict[str, dict[ViolationKey, ViolationRecord]]


@dataclass(slots=True)
class PodStates:
    """What the pods' annotations hold: ``pods`` as the engine sees them (a pod
    whose state is not believed without its vramguard annotations),
    ``records`` by pod uid, the pods to rewrite (``dirty``: malformed entries
    or state not believed), the annotations as they are on the object
    (``raw``, by uid) and what was wrong, for the log and for Events."""

    pods: list[PodFacts] = field(default_factory=list)
    records: PodRecords = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)
    raw: dict[str, Mapping[str, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    object_problems: list[ObjectProblem] = field(default_factory=list)

    def reject(self, pod: PodFacts, why: str) -> None:
        """``pod``'s state is not obeyed (``why``: one line): the engine sees
        it without its vramguard annotations, the operator's state replaces
        them, and one ``StateRejected`` Event says so."""
        self.pods.append(replace(pod, annotations={k: v for k, v in pod.annotations.items() if k not in _STATE_KEYS}))
        self.dirty.add(pod.uid)
        self.problems.append(why)
        self.object_problems.append(ObjectProblem("Pod", pod.namespace, pod.name, pod.uid, EVENT_STATE_REJECTED, why))


def read_pod_states(
    pods: Iterable[PodFacts], key: bytes | None, budgets: Mapping[str, int] | None = None
) -> PodStates:
    """Read every pod's state (``key``: the state key; None checks no seal).
    ``budgets``: the number of budgets per namespace, bounding the records a
    pod's annotation may hold (``records.records_bound``); None: no bound."""
    out = PodStates()
    for pod in pods:
        out.raw[pod.uid] = pod.annotations
        if key is not None and has_state(pod.annotations) and not verify(key, pod.uid, pod.annotations):
            out.reject(pod, messages.state_rejected(pod.namespace, pod.name, pod.annotations))
            continue
        text = pod.annotations.get(ANNOTATION_VIOLATIONS)
        if not text:
            out.pods.append(pod)
            continue
        bound = None if budgets is None else records_bound(budgets.get(pod.namespace, 0))
        records, problems, too_large = read_records(text, pod.namespace, pod.name, bound)
        if too_large is not None:
            out.reject(pod, messages.state_too_large(too_large))
            continue
        out.pods.append(pod)
        out.records[pod.uid] = {r.key: r for r in records}
        if problems:
            out.problems.extend(problems)
            out.dirty.add(pod.uid)
    return out


@dataclass(frozen=True, slots=True)
class PatchFacts:
    """What the pod patches are built from: the pods as the engine saw them and
    their annotations as they are, the records after the evaluation, the
    pods whose state changed, the originals to record, the steps whose Events
    are posted now, each budget's ladder, the state key and the
    ``vramguard.io/memory-limits`` values to write (None: remove)."""

    pods: Mapping[str, PodFacts]
    raw: Mapping[str, Mapping[str, str]]
    records: Mapping[str, Mapping[ViolationKey, ViolationRecord]]
    dirty: Set[str]
    new_original: Mapping[str, Original]
    explained: Set[tuple[str, ViolationKey]]
    ladder_of: Callable[[ViolationKey], Ladder | None]
    key: bytes | None
    new_limits: Mapping[str, str | None] = field(default_factory=dict)


def pod_patches(f: PatchFacts) -> Iterable[PodPatch]:
    """The annotation patches of every pod whose state changed, or whose steps'
    Events are posted now (sorted by namespace, name): the state first (with
    the steps fired now marked unposted), then the records marked posted."""
    pods = f.pods
    touched = f.dirty | {uid for uid, _ in f.explained}
    for uid in sorted(touched, key=lambda u: (pods[u].namespace, pods[u].name, u)):
        pod, raw = pods[uid], f.raw[uid]
        recs = f.records.get(uid, {})
        want: dict[str, str | None] = {}
        if uid in f.dirty:
            want = {
                ANNOTATION_VIOLATIONS: records_to_annotation(recs.values()) if recs else None,
                ANNOTATION_MESSAGE: messages.pod_message(recs.values(), f.ladder_of) if recs else None,
            }
            if uid in f.new_original:
                orig = f.new_original[uid]
                want[ANNOTATION_ORIGINAL_CPU] = original_to_annotation(orig) if orig else None
            elif ANNOTATION_ORIGINAL_CPU in raw and ANNOTATION_ORIGINAL_CPU not in pod.annotations:
                want[ANNOTATION_ORIGINAL_CPU] = None  # not believed: removed
            if uid in f.new_limits:  # not sealed: only the operator may write it (the chart's admission policy)
                want[ANNOTATION_MEMORY_LIMITS] = f.new_limits[uid]
            _seal(want, raw, uid, f.key)
        patch = {k: v for k, v in want.items() if raw.get(k) != v}
        explained = _explained(recs, uid, f, {**raw, **want})
        if patch or explained:
            yield PodPatch(pod.ref, patch, explained or None)


def _seal(want: dict[str, str | None], raw: Mapping[str, str], uid: str, key: bytes | None) -> None:
    """Add the seal of the pod's state after ``want`` (with a key; none: left alone)."""
    if key is None:
        return
    final = {**raw, **want}
    want[ANNOTATION_STATE_SIGNATURE] = sealed(key, uid, final)


def _explained(
    recs: Mapping[ViolationKey, ViolationRecord], uid: str, f: PatchFacts, after: Mapping[str, str | None]
) -> dict[str, str | None]:
    """The patch marking posted the records whose Events are posted now."""
    flip = [k for k, r in recs.items() if not r.events_posted and (uid, k) in f.explained]
    if not flip:
        return {}
    posted = [replace(r, events_posted=True) if k in flip else r for k, r in recs.items()]
    text = records_to_annotation(posted)
    out: dict[str, str | None] = {ANNOTATION_VIOLATIONS: text}
    _seal(out, {k: v for k, v in after.items() if v is not None}, uid, f.key)
    return out
