"""Inputs and outputs of the pure policy engine (``engine.evaluate``).

The engine is a function ``evaluate(EngineInput) -> EngineOutput``: no clock,
no API calls, no globals. Everything it needs is in ``EngineInput``; everything
the operator must do afterwards is in ``EngineOutput``:

- ``decisions``: one typed decision per escalation step, warning or recovery,
  each with the Event to post (on the pod, when there is one, and on the budget);
- ``pod_patches``: the merged annotation changes per pod (a JSON merge patch:
  ``None`` removes a key), which hold the escalation state and the throttled
  pods' original CPU resources;
- ``statuses``: the desired ``GPUMemoryBudgetStatus`` per budget; the writer
  compares its API form (``to_api()``) with the current status as read from
  the API server and writes only when they differ (the controller writes the
  JSON merge patch from one to the other when it is not empty;
  ``budget_status.status_changed`` is the same test);
- ``problems``: malformed state found on objects, for the log;
- ``devices``: the devices a device-pressure rule applies to, as the rule saw
  them (``DevicePressureReport``), for metrics and ``vramguard top``.

Decisions of a DryRun budget (or of an exempt namespace) are ``DryRunStep``
objects, never ``Annotate``/``Throttle``/``Evict`` (``SIDE_EFFECT_DECISIONS``).
The steps they stand for are recorded in status with ``dryRun: true`` and do
not count as fired once the budget enforces.

Escalation state is read back from the objects, never kept in memory: from each
budget's ``status.violations`` and from each pod's ``vramguard.io/violations``
annotation (see ``ANNOTATION_VIOLATIONS``). So the caller passes budgets *with
their status* and pods *with their annotations*; after applying an output, the
next evaluation sees the new state. See docs/engine.md for the semantics.

The types are defined in ``engine.keys`` (annotation keys, Event reasons,
references), ``engine.inputs``, ``engine.outputs`` and ``engine.records``
(``ViolationRecord``); this module is the one import path for all of them.

Apply order for one pod (the engine never returns a Throttle and a restoring
Recover for the same pod in one output):

1. Throttle: write the pod patch first (it records the original CPU resources),
   then resize through ``pods/resize``. Throttle is level-triggered too: while
   a violation holds a pod at Throttle (and the budget enforces, on fresh data)
   and the pod's CPU is not at the step's target (a resize that was refused or
   timed out, an operator restart between the patch and the resize, or a
   container raised again since), a ``Throttle`` with ``reapply=True`` carries
   the resize again. A re-apply is no new step: post no Event for it (its
   ``event`` is filled only for logs) and count it apart in metrics.
2. Recover with ``restore``: resize first; write the pod patch (which removes
   ``vramguard.io/original-cpu``) only when the resize succeeded, so that a
   failed restore is retried at the next evaluation.
3. Cap: write the pod patch (it holds ``vramguard.io/memory-limits``, which
   the pod's node agent applies); the decision itself carries only the Event.
   Cap is level-triggered through that annotation: each evaluation derives
   the limits the pod should have from its records and its use, and the patch
   changes the annotation only when they change (``engine.caps``).
4. Evict: write the pod patch (if any), then call the Eviction API. Evict is
   level-triggered: it is returned at every evaluation while it is due and the
   pod exists and is not terminating, so a 429 (PodDisruptionBudget) or a
   rate-limited eviction is simply retried later. The pod terminating or
   disappearing is the record that it fired (for a Total violation: the pod
   chosen for it, ``ViolationRecord.evict_target_uid``). The eviction rate
   limiter lives in the actions layer (the engine sees time only through ``now``).
"""

from __future__ import annotations

from vramguard_operator.engine.inputs import (
    DEFAULT_FRESHNESS_SECONDS,
    DEFAULT_RECOVERY_MARGIN,
    MAX_STATUS_ENTRIES,
    ContainerFacts,
    EffectivePolicy,
    EngineConfig,
    EngineInput,
    HeldBudget,
    PodFacts,
    QuietPods,
)
from vramguard_operator.engine.keys import (
    ANNOTATION_MEMORY_LIMITS,
    ANNOTATION_MESSAGE,
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_PREFIX,
    ANNOTATION_STATE_SIGNATURE,
    ANNOTATION_VIOLATIONS,
    EVENT_ABOVE_WARNING,
    EVENT_CAP_IMPOSSIBLE,
    EVENT_CAPPED,
    EVENT_DEVICE_PRESSURE,
    EVENT_DEVICE_WILL_RUN_OUT,
    EVENT_DRY_RUN,
    EVENT_EVALUATION_FAILED,
    EVENT_EVALUATION_TIMEOUT,
    EVENT_EVICTING,
    EVENT_INVALID_SPEC,
    EVENT_LEAK_DETECTED,
    EVENT_LIMIT_EXCEEDED,
    EVENT_RECOVERED,
    EVENT_REPORT_INVALID,
    EVENT_STATE_REJECTED,
    EVENT_THROTTLE_IMPOSSIBLE,
    EVENT_THROTTLED,
    BudgetRef,
    PodRef,
    ViolationKey,
)
from vramguard_operator.engine.outputs import (
    SIDE_EFFECT_DECISIONS,
    Annotate,
    BudgetStatusUpdate,
    Cap,
    ContainerCPU,
    Decision,
    DecisionAction,
    DecisionBase,
    DevicePressureReport,
    DryRunStep,
    EngineOutput,
    EventSpec,
    EventType,
    Evict,
    ObjectProblem,
    PodMemoryLimits,
    PodPatch,
    Recover,
    Throttle,
    Warn,
)
from vramguard_operator.engine.pressure import PressureRule
from vramguard_operator.engine.records import ViolationRecord

__all__ = [
    "ANNOTATION_MEMORY_LIMITS",
    "ANNOTATION_MESSAGE",
    "ANNOTATION_ORIGINAL_CPU",
    "ANNOTATION_PREFIX",
    "ANNOTATION_STATE_SIGNATURE",
    "ANNOTATION_VIOLATIONS",
    "DEFAULT_FRESHNESS_SECONDS",
    "DEFAULT_RECOVERY_MARGIN",
    "EVENT_ABOVE_WARNING",
    "EVENT_DEVICE_PRESSURE",
    "EVENT_DEVICE_WILL_RUN_OUT",
    "EVENT_CAPPED",
    "EVENT_CAP_IMPOSSIBLE",
    "EVENT_DRY_RUN",
    "EVENT_EVALUATION_FAILED",
    "EVENT_EVALUATION_TIMEOUT",
    "EVENT_EVICTING",
    "EVENT_INVALID_SPEC",
    "EVENT_LEAK_DETECTED",
    "EVENT_LIMIT_EXCEEDED",
    "EVENT_RECOVERED",
    "EVENT_REPORT_INVALID",
    "EVENT_STATE_REJECTED",
    "EVENT_THROTTLED",
    "EVENT_THROTTLE_IMPOSSIBLE",
    "MAX_STATUS_ENTRIES",
    "SIDE_EFFECT_DECISIONS",
    "Annotate",
    "BudgetRef",
    "BudgetStatusUpdate",
    "Cap",
    "ContainerCPU",
    "ContainerFacts",
    "Decision",
    "DecisionAction",
    "DecisionBase",
    "DevicePressureReport",
    "DryRunStep",
    "EffectivePolicy",
    "EngineConfig",
    "EngineInput",
    "EngineOutput",
    "EventSpec",
    "EventType",
    "Evict",
    "HeldBudget",
    "ObjectProblem",
    "PodFacts",
    "PodMemoryLimits",
    "PodPatch",
    "QuietPods",
    "PodRef",
    "PressureRule",
    "Recover",
    "Throttle",
    "ViolationKey",
    "ViolationRecord",
    "Warn",
]
