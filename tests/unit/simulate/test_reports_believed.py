"""The fleet simulation's node reports, as the agent would write them, break
no rule of ``engine/report_checks`` (issue 32): under the acting policy
(throttles, evictions with their grace periods, device pressure) every report
the engine reads is believed, so the simulation's figures measure decisions,
not refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vramguard_operator.engine import measure
from vramguard_sim.simulate.policyfile import parse_policy
from vramguard_sim.simulate.run import simulate

from .test_simulate import ACTING, MIX, SMALL


def test_every_simulated_report_is_believed(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str | None] = []
    real = measure.report_problem

    def recording(st):  # type: ignore[no-untyped-def]
        checked.append(real(st))
        return checked[-1]

    monkeypatch.setattr(measure, "report_problem", recording)
    r = simulate(replace(SMALL, mix=MIX, policy=parse_policy(ACTING, "test")))
    assert r.evictions > 0 and len(checked) > 100
    assert [p for p in checked if p is not None] == []
