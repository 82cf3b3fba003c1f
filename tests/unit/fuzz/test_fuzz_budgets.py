"""Hostile budgets next to a canary (issue 17, item 7): as a watch delivers them
(parsed by the operator's index entry: those the models refuse are held), and
as models holding what the API no longer admits (stored under an older CRD,
so never validated). No exception escapes; the canary is evaluated exactly as
when alone."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_api.budget import EscalationStep, GPUMemoryBudget, LeakDetection
from vramguard_api.limits import DeviceLimit, MemoryLimit
from vramguard_api.meta import LabelSelector, LabelSelectorRequirement
from vramguard_operator.engine.types import EngineConfig
from vramguard_operator.plan.entries import BudgetEntry, Versioned, budget_entry, pod_entry, report_entry

from .harness import (
    GI,
    HOSTILE_NODE,
    budget_obj,
    canary_part,
    canary_snapshot,
    check_canary,
    fuzz_settings,
    pod_body,
    report_obj,
    run,
    tally,
)
from .strategies import JUNK, budget_body, duration, fraction, quantity

pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("ignore::UserWarning")]
ALONE = canary_part(run(canary_snapshot(), EngineConfig()))


def with_hostile_pods(snap: Any) -> Any:
    snap.pods["h1"] = [pod_entry(pod_body("h1", n, HOSTILE_NODE)) for n in ("h0", "h1")]
    snap.reports[HOSTILE_NODE] = report_entry(report_obj(HOSTILE_NODE, {"h0": 41 * GI, "h1": 3 * GI}, "h1"))
    return snap


NAMES = [("h1", "b0"), ("h1", "b1"), ("h2", "b2")]


@given(st.tuples(*(budget_body(ns, n, f"uid-{ns}-{n}") for ns, n in NAMES)), st.integers(1, len(NAMES)))
@fuzz_settings()
def test_budgets_as_delivered(drawn: tuple[dict[str, Any], ...], count: int) -> None:
    bodies = drawn[:count]
    snap = with_hostile_pods(canary_snapshot())
    for body in bodies:
        e = budget_entry(body)
        snap.budgets.setdefault(body["metadata"]["namespace"], []).append(e)
        tally("budgets", "held (do not parse)" if e.value.budget is None else "parsed")
    check_canary("budgets", snap, EngineConfig(), ALONE)


def _memory() -> st.SearchStrategy[Any]:
    return st.builds(MemoryLimit.model_construct, vram=quantity(), ram=quantity())


def _overrides() -> st.SearchStrategy[dict[str, Any]]:
    """Fields of a valid budget replaced by values the models refuse."""
    requirement = st.builds(LabelSelectorRequirement.model_construct, key=st.one_of(st.text(max_size=70), JUNK),
                            operator=st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Equals"]),
                            values=st.one_of(st.none(), st.lists(st.text(max_size=70), max_size=3)))
    return st.fixed_dictionaries({}, optional={
        "limits.per_pod": _memory(),
        "limits.total": _memory(),
        "limits.per_device": st.builds(DeviceLimit.model_construct, vram=st.one_of(st.none(), quantity()),
                                       fraction=st.one_of(st.none(), fraction())),
        "warning_threshold": fraction(),
        "tolerance.overshoot_percent": st.one_of(st.integers(-(2**70), 2**70), JUNK),
        "tolerance.duration": duration(),
        "enforcement.escalation": st.lists(st.builds(
            EscalationStep.model_construct, action=st.sampled_from(["Annotate", "Throttle", "Evict", "X"]),
            after=duration(), cpu_limit=st.one_of(st.none(), quantity())), max_size=4),
        "leak_detection": st.builds(LeakDetection.model_construct, enabled=st.booleans(),
                                    min_growth_per_hour=quantity(), min_window=duration(),
                                    min_evidence=duration(),
                                    evict_before=st.one_of(st.none(), duration())),
        "selector": st.builds(LabelSelector.model_construct, match_labels=st.one_of(
            st.none(), st.dictionaries(st.text(max_size=70), st.text(max_size=70), max_size=2)),
            match_expressions=st.one_of(st.none(), st.lists(requirement, max_size=2))),
    })


def older_crd_budget(name: str, overrides: dict[str, Any]) -> GPUMemoryBudget:
    b = GPUMemoryBudget.model_validate(budget_obj("h1", name, vram="40Gi"))
    for path, value in overrides.items():
        target: Any = b.spec
        *parents, last = path.split(".")
        for p in parents:
            target = getattr(target, p)
        setattr(target, last, value)
    return b


@given(st.lists(_overrides(), min_size=1, max_size=2))
@fuzz_settings()
def test_budgets_stored_under_an_older_crd(overrides: list[dict[str, Any]]) -> None:
    snap = with_hostile_pods(canary_snapshot())
    for i, o in enumerate(overrides):
        b = older_crd_budget(f"old{i}", o)
        entry = BudgetEntry("h1", f"old{i}", 1, b)
        snap.budgets.setdefault("h1", []).append(Versioned(f"uid-old{i}", "1", entry))
    outs = check_canary("budgets (older CRD)", snap, EngineConfig(), ALONE)
    held = {p.name for o in outs for p in o.object_problems if p.kind == "GPUMemoryBudget"}
    for i in range(len(overrides)):
        tally("budgets (older CRD)", "held" if f"old{i}" in held else "evaluated")
