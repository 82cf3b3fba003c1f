"""The ladder's one table: the API's half (vramguard_api.steps) and the engine's
(engine.steps.STEP_FIRING) cover the same steps, and what derives from them agrees."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramguard_api.budget import EscalationStep, GPUMemoryBudgetSpec
from vramguard_api.steps import ACTION_DOC, ACTIONS, BLOCKING_STEPS, LADDER_ORDER, STEPS, Action, rank_cel
from vramguard_operator.engine.records import step_rank
from vramguard_operator.engine.steps import STEP_FIRING


def test_every_step_has_both_rows_in_rank_order():
    assert list(STEPS) == list(ACTIONS) == list(Action)
    assert set(STEP_FIRING) == set(Action)
    assert [a.rank for a in ACTIONS] == list(range(len(ACTIONS)))
    assert [step_rank(a) for a in ACTIONS] == [0, 1, 2, 3] and step_rank(None) == -1
    assert LADDER_ORDER == "Annotate, Throttle, Cap, Evict"
    # only Evict waits for its effect before it is recorded
    assert [a for a, f in STEP_FIRING.items() if f.level_triggered] == [Action.EVICT]
    assert BLOCKING_STEPS == {Action.THROTTLE, Action.CAP, Action.EVICT}


def test_names_serialize_as_the_api_strings():
    assert [str(a) for a in Action] == ["Annotate", "Throttle", "Cap", "Evict"]
    assert f"DryRun{Action.EVICT}" == "DryRunEvict"
    step = EscalationStep.model_validate({"action": "Throttle", "after": "5m"})
    assert step.action is Action.THROTTLE
    assert step.to_api()["action"] == "Throttle"
    with pytest.raises(ValueError, match="action"):
        EscalationStep.model_validate({"action": "Delete"})


def test_crd_rule_and_description_derive_from_the_table():
    assert rank_cel("a") == (
        "(a.action == 'Annotate' ? 0 : (a.action == 'Throttle' ? 1 : (a.action == 'Cap' ? 2 : 3)))"
    )
    for a, info in STEPS.items():
        assert f"{a}: {info.does}" in ACTION_DOC
    schema = GPUMemoryBudgetSpec.model_json_schema(by_alias=True)
    escalation = schema["$defs"]["EscalationStep"]["properties"]["action"]
    assert escalation["enum"] == ["Annotate", "Throttle", "Cap", "Evict"] and "$ref" not in escalation


def test_every_event_reason_a_step_posts_is_documented():
    events = (Path(__file__).resolve().parents[3] / "docs" / "operator.md").read_text()
    table = [line for line in events.splitlines() if line.startswith("| `")]
    for action, firing in STEP_FIRING.items():
        for reason in firing.reasons:
            assert any(f"`{reason}`" in row.split("|")[1] for row in table), (action, reason)
