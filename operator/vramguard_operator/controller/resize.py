"""Throttle and restore: in-place CPU resize through the ``pods/resize``
subresource (a strategic merge patch of each container's CPU limit and, where
given, request; memory is left alone).

A refusal becomes a ``ThrottleFailed`` or ``RestoreFailed`` Event and a note
for the budget's status (``ResizeOutcome.error``); a pod that is gone or was
replaced (404, 409) is left alone. A throttle re-applied (its resize did not
take earlier) is resized again without a new Event or action count; one
whose Events were not posted when it fired (``repost``) posts them once the
pod is at the target.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from vramguard_api.steps import Action
from vramguard_operator.controller import crashpoints
from vramguard_operator.controller.events import EVENT_RESTORE_FAILED, EVENT_THROTTLE_FAILED, DecisionEvents
from vramguard_operator.controller.kubeapi import API_ERRORS, error_status, error_text
from vramguard_operator.engine.types import ContainerCPU, Decision, EventSpec, PodRef, Recover, Throttle

log = logging.getLogger("vramguard.actions")

ResizeCall = Callable[[PodRef, Sequence[ContainerCPU]], dict[str, Any]]
"""The API call: resize the pod's containers; returns the pod the API server
returned; raises one of ``kubeapi.API_ERRORS``."""


def resize_patch(ref: PodRef, containers: Iterable[ContainerCPU]) -> dict[str, Any]:
    """Strategic merge patch for ``pods/resize``: each container's CPU limit and,
    where given, request (containers merge by name; memory is left alone)."""
    specs = []
    for c in containers:
        resources: dict[str, Any] = {"limits": {"cpu": c.limit}}
        if c.request is not None:
            resources["requests"] = {"cpu": c.request}
        specs.append({"name": c.name, "resources": resources})
    return {"metadata": {"uid": ref.uid}, "spec": {"containers": specs}}


def merged_resize(decisions: Iterable[Throttle | Recover]) -> tuple[ContainerCPU, ...]:
    """The containers of several throttles or restores of one pod, one per name
    (the last wins), sorted by name."""
    by_name: dict[str, ContainerCPU] = {}
    for d in decisions:
        for c in d.resize if isinstance(d, Throttle) else d.restore:
            by_name[c.name] = c
    return tuple(by_name[n] for n in sorted(by_name))


def is_reapply(d: Decision) -> bool:
    """Whether ``d`` re-applies a throttle that fired earlier (its resize did not
    take): resized again, without a new action count."""
    return bool(getattr(d, "reapply", False))


def is_silent(d: Decision) -> bool:
    """Whether ``d`` is resized without an Event: a re-applied throttle whose
    Events were posted when it fired."""
    return is_reapply(d) and not d.repost


@dataclass(frozen=True, slots=True)
class ResizeOutcome:
    """What a resize came to: the pod the API server returned (``pod``), or,
    when it was refused or got no answer, the note for the budget status
    (``error``); both None when the pod is gone or was replaced."""

    pod: dict[str, Any] | None = None
    error: str | None = None
    explained: bool = True

    @property
    def ok(self) -> bool:
        """Whether the resize was accepted."""
        return self.pod is not None


class Resizer:
    """Resizes pods for Throttle and restoring Recover decisions and explains
    the outcome."""

    def __init__(self, resize_pod: ResizeCall, events: DecisionEvents) -> None:
        self.resize_pod = resize_pod
        self.events = events

    def resize(
        self, pod: PodRef, containers: Sequence[ContainerCPU], decisions: Sequence[Throttle | Recover]
    ) -> ResizeOutcome:
        """Resize ``pod``'s containers for ``decisions`` (all throttles or all
        restores); a failure is logged, explained and counted ``failed``."""
        try:
            return ResizeOutcome(pod=self.resize_pod(pod, containers))
        except API_ERRORS as err:
            return self._failed(pod, containers, decisions, err)

    def _failed(
        self,
        pod: PodRef,
        containers: Sequence[ContainerCPU],
        decisions: Sequence[Throttle | Recover],
        err: Exception,
    ) -> ResizeOutcome:
        text = error_text(err)
        restore = isinstance(decisions[0], Recover)
        what = "restoring the CPU of" if restore else "throttling"
        log.warning("%s pod %s/%s: %s", what, pod.namespace, pod.name, text)
        if error_status(err) in (404, 409):
            return ResizeOutcome()
        refused = "refused" if isinstance(err, ApiException) else "failed"
        reason = EVENT_RESTORE_FAILED if restore else EVENT_THROTTLE_FAILED
        cpu = ", ".join(f"{c.name}={c.limit}" for c in containers)
        explained = True
        for d in decisions:
            if is_silent(d):  # noted in the status; its Event was posted when it fired
                continue
            msg = (
                f"budget {d.budget.namespace}/{d.budget.name}: {what} pod {pod.name} "
                f"(CPU limit {cpu}) through pods/resize failed: {text}"
            )
            explained = self.events.explain(d, EventSpec("Warning", reason, msg)) and explained
            self.events.metrics.action(d.action, "failed", pod.namespace)
        return ResizeOutcome(error=f"resize {refused}: {text}", explained=explained)

    def throttle(self, pod: PodRef, throttles: Sequence[Throttle]) -> tuple[ResizeOutcome | None, bool]:
        """Resize for the throttles (no outcome when none needs a resize), then
        post the Events of the steps that fired now or are reposted (a silent
        re-application posts none). Returns the outcome and whether every
        Event is there. Counts only steps that fired now."""
        explained = True
        possible = [t for t in throttles if t.impossible_reason is None and t.resize]
        for t in throttles:
            if is_silent(t) or t in possible:
                continue
            # impossible, or nothing to resize (already at or below the throttled limit)
            explained = self.events.explain(t, t.event) and explained
            if not t.repost:
                result = "impossible" if t.impossible_reason is not None else "success"
                self.events.metrics.action(Action.THROTTLE, result, pod.namespace)
        if not possible:
            return None, explained
        outcome = self.resize(pod, merged_resize(possible), possible)
        if not outcome.ok:
            return outcome, explained and outcome.explained
        crashpoints.reached("after-resize")
        for t in possible:
            if is_silent(t):
                continue
            explained = self.events.explain(t, t.event) and explained
            if not t.repost:
                self.events.metrics.action(Action.THROTTLE, "success", pod.namespace)
        return outcome, explained
