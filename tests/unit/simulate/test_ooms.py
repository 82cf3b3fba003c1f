"""The fleet simulation's OOM kills through the live classifier: the verdicts say what
the driver saw, and "innocent" counts exactly the kills within the share (so the
figures of docs/simulation.md stay the same)."""

from __future__ import annotations

from dataclasses import replace

from vramguard_sim.gpumem import REASON_DEVICE_FULL
from vramguard_sim.simulate.control import ControlConfig
from vramguard_sim.simulate.ooms import verdict
from vramguard_sim.simulate.policyfile import load_policy

from .test_simulate import MIX, SMALL, run_fleet


def test_every_simulated_kill_gets_the_verdict_of_its_cause_and_innocence_means_within_share():
    seen = set()
    for caps in (False, True):
        config = replace(SMALL, hours=2.0, mix=MIX, policy=load_policy(None), control=ControlConfig(caps=caps))
        fleet, _ = run_fleet(config)
        for o in fleet.ooms:
            v = verdict(o)
            assert v.kind == ("GPUOutOfMemory" if o.reason == REASON_DEVICE_FULL else "CapKill")
            assert v.innocent == o.within_share
            assert v.blame == ("Innocent" if o.within_share else "Own")
            seen.add((v.kind, v.blame))
    # The seed shows each case the figures count.
    assert {("GPUOutOfMemory", "Innocent"), ("GPUOutOfMemory", "Own"), ("CapKill", "Own")} <= seen
