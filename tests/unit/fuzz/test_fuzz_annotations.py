"""Hostile escalation state on pods next to a canary (issue 17, item 7):
records forged, malformed or nested without end, original CPU made up,
seals that do not verify, CPU limits that are not quantities; with and
without a state key. No exception escapes; the canary is evaluated exactly
as when alone; with a key, no forged original CPU is ever restored."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_operator.engine.types import EngineConfig, Recover
from vramguard_operator.plan.entries import budget_entry, pod_entry, report_entry

from .harness import (
    GI,
    HOSTILE_NODE,
    KEY,
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
from .strategies import JUNK, original_cpu_annotation, quantity, violations_annotation

pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("ignore::UserWarning")]
ALONE = {key: canary_part(run(canary_snapshot(), EngineConfig(state_key=key))) for key in (None, KEY)}

annotations = st.fixed_dictionaries({}, optional={
    "vramguard.io/violations": violations_annotation(),
    "vramguard.io/original-cpu": original_cpu_annotation(),
    "vramguard.io/violation": st.text(max_size=30),
    "vramguard.io/state-signature": st.one_of(st.text(max_size=70), st.just("v1:" + "0" * 64)),
})


@given(st.lists(st.tuples(annotations, st.one_of(quantity(), JUNK)), min_size=1, max_size=3),
       st.sampled_from([None, KEY]), st.lists(st.integers(0, 60), min_size=3, max_size=3))
@fuzz_settings()
def test_pod_state(pods: list[tuple[dict[str, Any], Any]], key: bytes | None, usage: list[int]) -> None:
    snap = canary_snapshot()
    snap.budgets["h1"] = [budget_entry(budget_obj("h1", "b0")), budget_entry(budget_obj("h1", "b1", vram="40Gi"))]
    entries = []
    for i, (ann, cpu) in enumerate(pods):
        try:
            entries.append(pod_entry(pod_body("h1", f"h{i}", HOSTILE_NODE, ann, cpu=cpu if isinstance(cpu, str) else
                                              str(cpu))))
        except ValueError:
            tally("annotations", "pods refused by the index")
    snap.pods["h1"] = entries
    snap.reports[HOSTILE_NODE] = report_entry(report_obj(
        HOSTILE_NODE, {f"h{i}": usage[i] * GI for i in range(len(pods))}, "h1"))
    outs = check_canary("annotations", snap, EngineConfig(state_key=key), ALONE[key])
    if key is not None:
        for o in outs:
            for d in o.decisions:
                if isinstance(d, Recover) and d.restore:  # nothing vramguard sealed: nothing to restore
                    raise AssertionError(f"restored CPU from unsealed state: {d.restore}")
    tally("annotations", "with a state key" if key else "without a state key")
