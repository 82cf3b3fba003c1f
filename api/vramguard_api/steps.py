"""The escalation ladder's steps: one table, the API's half of it.

A step's name and rank (its place on the ladder) are API: budgets name them in
``spec.enforcement.escalation[].action``, status and pod annotations record
them, the CRD enumerates them and its CEL rule orders them. What a step means to
a user (``does``, ``blocks``) is API too: the CRD's description and docs say it.
What the operator does to fire one (the decision it builds, its Event reasons)
is behaviour, and lives in the engine's half of the table
(``vramguard_operator.engine.steps.STEP_FIRING``), keyed by these members.

To add a step: a member of :class:`Action` at its rank, a row of :data:`STEPS`,
a row of the engine's table, and its applier in the controller (docs/layout.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import WithJsonSchema


class Action(StrEnum):
    # A step of the ladder, in rank order (the order of definition). No docstring
    # on purpose: pydantic would copy it into every CRD field of this type.
    ANNOTATE = "Annotate"
    THROTTLE = "Throttle"
    CAP = "Cap"
    EVICT = "Evict"

    @property
    def rank(self) -> int:
        """Position on the ladder: Annotate 0 < Throttle 1 < Cap 2 < Evict 3."""
        return STEP_RANKS[self]

    @property
    def info(self) -> StepInfo:
        """This step's row of :data:`STEPS`."""
        return STEPS[self]


STEP_RANKS: dict[str, int] = {a: i for i, a in enumerate(Action)}
"""Step name -> rank; a plain string finds its member's rank (a StrEnum hashes as its value)."""


@dataclass(frozen=True, slots=True)
class StepInfo:
    """A step's meaning: ``does`` (the CRD's description of the action), ``verb``
    and ``done`` (its words in Events and status: "throttle", "throttled"),
    ``blocks`` (what it holds back besides the pod: a total violation at this step,
    enforced, denies the budget's new pods at admission; None: nothing)."""

    does: str
    verb: str
    done: str
    blocks: str | None = None


STEPS: dict[Action, StepInfo] = {
    Action.ANNOTATE: StepInfo(
        does="pod annotations and Warning Events.",
        verb="annotate",
        done="annotated",
    ),
    Action.THROTTLE: StepInfo(
        does="lower the pod's CPU limit through the pods/resize subresource.",
        verb="throttle",
        done="throttled",
        blocks="new pods of the budget, for a total violation (admission)",
    ),
    Action.CAP: StepInfo(
        does="a driver-enforced hard limit on the pod's GPU memory per device (NVML per-cgroup memory limits, "
        "applied by the node agent; where a device cannot hold one the step is recorded as impossible).",
        verb="cap",
        done="capped",
        blocks="new pods of the budget, for a total violation (admission)",
    ),
    Action.EVICT: StepInfo(
        does="the Eviction API (PodDisruptionBudgets respected).",
        verb="evict",
        done="evicting",
        blocks="new pods of the budget, for a total violation (admission)",
    ),
}
"""Every step's meaning, in rank order: the one table the CRD (``budget.py``),
the engine's wording (``engine.messages``) and admission (``BLOCKING_STEPS``)
read; status, pod annotations and ``vramguard top`` show the members' names."""

ACTIONS: tuple[Action, ...] = tuple(Action)
"""The steps in rank order."""
LADDER_ORDER = ", ".join(ACTIONS)
"""The ladder in words: "Annotate, Throttle, Cap, Evict"."""
BLOCKING_STEPS: frozenset[Action] = frozenset(a for a, s in STEPS.items() if s.blocks is not None)
"""The steps at which a total violation, enforced, blocks the budget's new pods."""
ACTION_DOC = " ".join(f"{a}: {s.does}" for a, s in STEPS.items())
"""The CRD description of ``escalation[].action``: each step and what it does."""


def rank_cel(x: str) -> str:
    """A CEL expression of the rank of ``{x}.action`` (the CRD's rule that delays grow
    along the ladder): nested conditionals, the last step the fallback."""
    expr = str(ACTIONS[-1].rank)
    for a in reversed(ACTIONS[:-1]):
        expr = f"({x}.action == '{a}' ? {a.rank} : {expr})"
    return expr


ActionField = Annotated[Action, WithJsonSchema({"enum": [a.value for a in ACTIONS], "type": "string"})]
""":class:`Action` as a model field: its schema inline (the CRD's enum where the
field is, as for any other enum of the API), not a shared definition."""
