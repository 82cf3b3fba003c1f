"""Short runs of the whole simulation: determinism, the two runs' common
ground, vramguard's actions applied as the controller applies them. Mechanics, not
figures. That the triggers decide as evaluating everything would is the
equivalence suite's (tests/unit/operator/test_incremental_equivalence.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from vramguard_api.memlimits import memory_limits_of
from vramguard_operator.cli.main import main
from vramguard_operator.engine.types import ANNOTATION_MEMORY_LIMITS
from vramguard_sim.gpumem import REASON_HARD_LIMIT, REASON_SOFT_LIMIT
from vramguard_sim.simulate.control import ControlConfig, Vramguard
from vramguard_sim.simulate.fleet import Fleet
from vramguard_sim.simulate.nodes import build_nodes
from vramguard_sim.simulate.policyfile import DEFAULT_POLICY, load_policy, parse_policy
from vramguard_sim.simulate.run import SimulationConfig, compare, simulate
from vramguard_sim.simulate.workloads import generate

from .policies import ACTING, ANNOTATE_ONLY, CAPPING, MIX, PRESSURE_LINE, SMALL


def figures(result):
    out = result.to_json()
    out.pop("wall_seconds")
    out.pop("cpu_seconds")
    return out


def test_same_seed_same_result_and_another_seed_another():
    on = replace(SMALL, hours=0.5, policy=load_policy(None))
    assert figures(simulate(on)) == figures(simulate(on))
    assert figures(simulate(replace(on, seed=4))) != figures(simulate(on))


def test_off_and_on_see_the_same_fleet_and_annotations_change_nothing_physical():
    c = compare(SMALL, parse_policy(ANNOTATE_ONLY, "annotate-only"))
    assert not c.off.vramguard and c.on.vramguard
    assert c.on.actions.get("Annotate", 0) > 0  # the implicit budgets annotate
    # annotating is not physical: the fleet lives through the same hour
    for key in ("innocent_ooms", "over_share_ooms", "jobs_completed", "gpu_memory_in_use_bytes"):
        assert getattr(c.off, key) == getattr(c.on, key), key
    assert c.on.actions_within_limits == 0 and c.on.pressure_evictions == 0


def test_the_built_in_device_pressure_rule_evicts_only_pods_above_their_share():
    c = compare(replace(SMALL, mix=MIX), load_policy(None))
    assert c.on.pressure_evictions > 0 and c.on.actions.get("Evict", 0) >= c.on.pressure_evictions
    assert c.on.actions_within_limits == 0, c.on.within_limits_examples
    assert c.off.pressure_evictions == 0


def test_acting_budgets_throttle_and_evict_never_on_a_pod_within_its_limits():
    config = replace(SMALL, mix=MIX, policy=parse_policy(ACTING, "test"))
    r = simulate(config)
    assert r.actions.get("Throttle", 0) > 0 and r.evictions > 0
    assert r.actions_within_limits == 0, r.within_limits_examples
    # the policy's rate limit (2 a minute, burst 2) holds over the run
    assert r.evictions <= 2 + 2 * config.hours * 60


def test_dry_run_changes_nothing_physical():
    dry = ACTING.replace("mode: Enforce", "mode: DryRun")
    c = compare(replace(SMALL, tick_s=30.0, mix=MIX), parse_policy(dry, "dry"))
    assert c.on.dry_run_steps > 0 and not c.on.actions and c.on.evictions == 0
    assert c.on.innocent_ooms == c.off.innocent_ooms and c.on.jobs_completed == c.off.jobs_completed


def test_nothing_is_done_in_an_exempt_namespace():
    finetune_only = ACTING.split("---")[:2]  # the policy and the research budget
    # without the device-pressure rule, which may evict elsewhere
    exempt = "---".join(finetune_only).replace(PRESSURE_LINE, "").replace("  mode: Enforce", "  mode: Enforce\n  exemptNamespaces: [research]")
    r = simulate(replace(SMALL, mix=MIX, policy=parse_policy(exempt, "exempt")))
    assert r.dry_run_steps > 0  # the violations are seen and reported...
    assert not r.actions.get("Throttle") and r.evictions == 0  # ...and nothing is done about them
    assert all(k == "Annotate" for k in r.actions)  # implicit budgets elsewhere still annotate


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Pod", "document 1: kind 'Pod'"),
        ("apiVersion: vramguard.io/v1alpha1\nkind: GPUMemoryBudget\nmetadata: {name: b, namespace: default}\n"
         "spec: {selector: {}, limits: {perPod: {vram: 1Gi}}}", "metadata.namespace 'default'"),
        ("apiVersion: vramguard.io/v1alpha1\nkind: GPUMemoryPolicy\nmetadata: {name: p}\nspec: {mode: Sometimes}",
         "document 1: spec.mode"),
        ("", "no GPUMemoryPolicy"),
        ("a: [", "not YAML"),
    ],
)
def test_bad_policy_files_name_the_document_and_the_field(text, message):
    with pytest.raises(ValueError, match=message):
        parse_policy(text, "p.yaml")


def test_the_command_prints_both_runs_as_json(capsys, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(DEFAULT_POLICY)
    argv = ["simulate", "--nodes", "time-slicing=1,mig=1", "--hours", "0.25", "--seed", "9", "--policy", str(policy)]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["seed"] == 9 and out["setup"]["policy"] == str(policy)
    assert set(out) == {"setup", "off", "on", "caps"}
    for run in ("off", "on", "caps"):
        assert {"innocent_ooms", "over_share_ooms", "actions_within_limits", "evictions",
                "gpu_memory_in_use_bytes", "jobs_completed"} <= set(out[run])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "innocent OOM kills (within share)" in text and "on, with caps" in text
    assert main([*argv, "--json", "--no-caps"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"setup", "off", "on"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mix", "training=1,gaming=2"], "--mix: 'gaming=2'"),
        (["--mix", "training=0"], "gives every kind 0"),
        (["--nodes", "tpu=3"], "--nodes: 'tpu=3'"),
        (["--hours", "0"], "'0': want a duration above 0s"),
        (["--duration", "9000h"], "'9000h': want at most 8760h"),
        (["--nodes", "99999999999"], "--nodes: '99999999999' is 99999999999 nodes, above the maximum of 10000"),
        (["--seed", "-1"], "'-1': want a whole number from 0 to 4294967295"),
        (["--tick", "0s"], "'0s': want a duration above 0s"),
        (["--policy", "/nonexistent.yaml"], "--policy /nonexistent.yaml"),
    ],
)
def test_bad_flags_are_named(capsys, flags, message):
    assert main(["simulate", *flags]) == 2
    assert message in capsys.readouterr().err



def run_fleet(config: SimulationConfig) -> tuple[Fleet, Vramguard]:
    """A run as ``simulate`` does it, returning the fleet and the operator."""
    nodes = build_nodes(dict(config.nodes))
    slots = sum(g.capacity for n in nodes for g in n.gpus)
    fleet = Fleet(nodes, generate(config.seed, config.mix, slots, config.hours, config.load), config.seed,
                  config.tick_s)
    assert config.policy is not None
    guard = Vramguard(config.policy, fleet, config.control)
    for i in range(1, round(config.hours * 3600 / config.tick_s) + 1):
        fleet.step(i * config.tick_s)
        guard.step(i * config.tick_s)
    return fleet, guard


def test_with_caps_the_driver_evicts_pods_above_their_share_first_never_within():
    config = replace(SMALL, mix=MIX, policy=load_policy(None), control=ControlConfig(caps=True))
    fleet, guard = run_fleet(config)
    victims = [o for o in fleet.ooms if o.reason == REASON_SOFT_LIMIT]
    assert victims and all(o.held_bytes > o.share_bytes for o in victims)
    assert guard.counts.within_limits == []
    written = [p for p in fleet.pods.values() if ANNOTATION_MEMORY_LIMITS in p.facts.annotations]
    assert written and all(
        {lim.soft_limit for lim in memory_limits_of(p.facts.annotations).values()} == {p.gpu.share_bytes}  # type: ignore[union-attr]
        for p in written
    )
    # without agents that enforce them, the same policy writes no limits and nothing is evicted by the driver
    fleet, _ = run_fleet(replace(config, control=ControlConfig()))
    assert not any(ANNOTATION_MEMORY_LIMITS in p.facts.annotations for p in fleet.pods.values())
    assert not [o for o in fleet.ooms if o.reason != "device-full"]


def test_a_budgets_cap_fails_the_capped_pods_own_allocations_only():
    config = replace(SMALL, mix=MIX, policy=parse_policy(CAPPING, "capping"), control=ControlConfig(caps=True))
    fleet, guard = run_fleet(config)
    hard = [o for o in fleet.ooms if o.reason == REASON_HARD_LIMIT]
    assert guard.counts.decisions.get("Cap", 0) > 0 and hard
    assert all(o.namespace == "research" and not o.within_share for o in hard)
    assert guard.counts.within_limits == []
    # the same budget where the agents leave limits alone: the step is impossible and nothing bites
    fleet, guard = run_fleet(replace(config, control=ControlConfig()))
    assert not [o for o in fleet.ooms if o.reason == REASON_HARD_LIMIT]


def test_progress_is_a_line_per_simulated_hour_on_a_terminal_and_silent_with_json(capsys, monkeypatch):
    heard: list[tuple[str, float]] = []
    config = SimulationConfig(nodes={"time-slicing": 1}, hours=2.5, seed=3, tick_s=60.0, policy=load_policy(None))
    assert config.policy is not None
    compare(config, config.policy, caps=False, progress=lambda run, hours: heard.append((run, hours)))
    assert heard == [("off", 1.0), ("off", 2.0), ("off", 2.5), ("on", 1.0), ("on", 2.0), ("on", 2.5)]
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    argv = ["simulate", "--nodes", "1", "--duration", "1h", "--tick", "1m", "--no-caps"]
    assert main([*argv, "--json"]) == 0 and capsys.readouterr().err == ""
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "\rsimulate: run 2 of 2 (vramguard on): 1h of 1h simulated" in err and err.endswith("\n")
