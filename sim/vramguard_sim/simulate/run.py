"""Running the fleet simulation: one configuration, or the same seed with
vramguard off and on.

    from vramguard_sim.simulate.run import SimulationConfig, compare
    from vramguard_sim.simulate.policyfile import load_policy
    print(compare(SimulationConfig(seed=7), load_policy(None)).to_json())
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from vramguard_sim.gpumem import REASON_HARD_LIMIT, REASON_SOFT_LIMIT
from vramguard_sim.simulate.control import ControlConfig, Vramguard
from vramguard_sim.simulate.fleet import Fleet
from vramguard_sim.simulate.nodes import build_nodes
from vramguard_sim.simulate.ooms import verdict
from vramguard_sim.simulate.policyfile import PolicySet
from vramguard_sim.simulate.results import Comparison, RunFigures
from vramguard_sim.simulate.workloads import DEFAULT_MIX, KINDS, generate

MAX_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """What to simulate: ``nodes`` (count by node kind, ``nodes.NODE_KINDS``),
    ``hours`` of simulated time, ``seed``, the workload ``mix`` (proportions by
    kind, ``workloads.KINDS``), ``load`` (the fraction of GPU replicas the
    workloads keep busy), ``tick_s`` (the agent's sampling interval: the time
    step of memory and of vramguard's decisions), and ``policy`` (None:
    vramguard off). Raises ``ValueError`` naming the field for values out of range."""

    nodes: Mapping[str, int] = field(default_factory=lambda: {"time-slicing": 20})
    hours: float = 24.0
    seed: int = 1
    mix: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    load: float = 0.9
    tick_s: float = 10.0
    policy: PolicySet | None = None
    control: ControlConfig = field(default_factory=ControlConfig)

    def __post_init__(self) -> None:
        if not 0 < self.hours <= 24 * 365:
            raise ValueError(f"hours: {self.hours!r} is not in (0, 8760]")
        if not 0 < self.load <= 2:
            raise ValueError(f"load: {self.load!r} is not in (0, 2]")
        if not (1 <= self.tick_s <= 600 and float(self.tick_s).is_integer()):
            raise ValueError(f"tick_s: {self.tick_s!r} is not a whole number of seconds in [1, 600]")
        if sum(self.nodes.values()) <= 0:
            raise ValueError(f"nodes: {dict(self.nodes)!r} has no node")
        unknown = set(self.mix) - set(KINDS)
        if unknown:
            raise ValueError(f"mix: unknown kinds {sorted(unknown)} (known: {', '.join(KINDS)})")


Progress = Callable[[float], None]
"""Called with the simulated hours done, once per simulated hour and at the end."""


def simulate(config: SimulationConfig, progress: Progress | None = None) -> RunFigures:
    """Run one configuration to the end and return its figures; ``progress`` hears each simulated hour."""
    started, cpu = time.perf_counter(), time.process_time()
    nodes = build_nodes(dict(config.nodes))
    slots = sum(g.capacity for n in nodes for g in n.gpus)
    workloads = generate(config.seed, config.mix, slots, config.hours, config.load)
    fleet = Fleet(nodes, workloads, config.seed, config.tick_s)
    guard = Vramguard(config.policy, fleet, config.control) if config.policy is not None else None
    steps = round(config.hours * 3600 / config.tick_s)
    per_hour = max(1, round(3600 / config.tick_s))
    for i in range(1, steps + 1):
        t = i * config.tick_s
        fleet.step(t)
        if guard is not None:
            guard.step(t)
        if progress is not None and (i % per_hour == 0 or i == steps):
            progress(t / 3600)
    return _figures(fleet, guard, steps * config.tick_s, time.perf_counter() - started, time.process_time() - cpu)


def compare(config: SimulationConfig, policy: PolicySet, caps: bool = True,
            progress: Callable[[str, float], None] | None = None) -> Comparison:
    """The same seed with vramguard off, then on with ``policy``, then (with
    ``caps``) on with the same policy and driver-enforced memory limits: the
    node agents apply them (``--enforce-caps``) and the devices enforce them.
    ``progress`` hears (the run's name: off, on, caps; simulated hours done)."""
    def hears(name: str) -> Progress | None:
        return None if progress is None else (lambda hours: progress(name, hours))

    off = simulate(replace(config, policy=None), hears("off"))
    on = simulate(replace(config, policy=policy), hears("on"))
    with_caps = None
    if caps:
        with_caps = simulate(replace(config, policy=policy, control=replace(config.control, caps=True)),
                             hears("caps"))
    setup = {
        "seed": config.seed,
        "hours": config.hours,
        "nodes": ",".join(f"{k}={v}" for k, v in config.nodes.items()),
        "gpu_replicas": sum(g.capacity for n in build_nodes(dict(config.nodes)) for g in n.gpus),
        "mix": {k: round(v, 4) for k, v in config.mix.items()},
        "load": config.load,
        "tick_s": config.tick_s,
        "policy": policy.source,
    }
    return Comparison(setup, off, on, caps=with_caps)


def _figures(fleet: Fleet, guard: Vramguard | None, duration_s: float, wall_s: float, cpu_s: float) -> RunFigures:
    innocent = [o for o in fleet.ooms if verdict(o).innocent]  # the live classifier (simulate.ooms)
    by_reason: dict[str, int] = {}
    for o in fleet.ooms:
        by_reason[o.reason] = by_reason.get(o.reason, 0) + 1
    by_kind: dict[str, int] = {}
    for o in innocent:
        by_kind[o.kind] = by_kind.get(o.kind, 0) + 1
    in_use = fleet.memory_integral / duration_s
    c = guard.counts if guard is not None else None
    return RunFigures(
        vramguard=guard is not None,
        innocent_ooms=len(innocent),
        over_share_ooms=len(fleet.ooms) - len(innocent),
        hard_limit_ooms=by_reason.get(REASON_HARD_LIMIT, 0),
        soft_limit_evictions=by_reason.get(REASON_SOFT_LIMIT, 0),
        innocent_ooms_by_kind=by_kind,
        actions_within_limits=len(c.within_limits) if c else 0,
        evictions=c.evictions if c else 0,
        evictions_blocked=c.evictions_blocked if c else 0,
        evictions_rate_limited=c.evictions_rate_limited if c else 0,
        pressure_evictions=c.pressure_evictions if c else 0,
        actions=dict(c.decisions) if c else {},
        dry_run_steps=c.dry_run_steps if c else 0,
        gpu_memory_in_use_bytes=in_use,
        gpu_memory_in_use_fraction=in_use / fleet.usable_bytes,
        jobs_completed=fleet.jobs_completed,
        jobs_failed=fleet.jobs_failed,
        container_restarts=fleet.restarts,
        engine_evaluations=c.evaluations if c else 0,
        pods_evaluated=c.pods_evaluated if c else 0,
        wall_seconds=wall_s,
        cpu_seconds=cpu_s,
        within_limits_examples=tuple(c.within_limits[:MAX_EXAMPLES]) if c else (),
    )
