"""``vramguard simulate``: the fleet simulation, the same seed with vramguard
off and on, and the figures that say what vramguard prevented (docs/simulation.md).

A thin layer over ``simulate.run.compare``: flags in, figures out (a table, or
JSON with ``--json``). Works without a cluster, kopf or a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from vramguard_api.cliargs import duration_arg
from vramguard_sim.simulate.nodes import parse_nodes
from vramguard_sim.simulate.policyfile import load_policy
from vramguard_sim.simulate.results import render
from vramguard_sim.simulate.run import SimulationConfig, compare
from vramguard_sim.simulate.workloads import DEFAULT_MIX, parse_mix

DEFAULT_MIX_TEXT = ",".join(f"{k}={v:g}" for k, v in DEFAULT_MIX.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vramguard simulate``."""
    parser.add_argument(
        "--nodes",
        default="20",
        help="GPU nodes: a number of time-sliced nodes (8 GPUs x 4 replicas), or counts by kind, "
        "e.g. time-slicing=16,mps=2,mig=1,vgpu=1 (default 20)",
    )
    parser.add_argument("--duration", "--hours", dest="hours_s", metavar="DURATION", default=24 * 3600.0,
                        type=duration_arg("--duration", legacy_unit_s=3600.0, positive=True, maximum_s=365 * 86400.0),
                        help="simulated time, a Go duration (default 24h; --hours N, a bare number of hours, "
                        "is deprecated)")
    parser.add_argument("--seed", type=_seed, default=1,
                        help="seed of the workload mix and the scheduler, 0 to 2^32-1 (default 1)")
    parser.add_argument(
        "--mix",
        default=DEFAULT_MIX_TEXT,
        help=f"proportions by workload kind (default {DEFAULT_MIX_TEXT})",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help="YAML file of GPUMemoryPolicies and GPUMemoryBudgets vramguard runs with "
        "(default: the built-in policy, docs/simulation.md)",
    )
    parser.add_argument(
        "--load", type=float, default=0.9, help="fraction of the GPU replicas the workloads keep busy (default 0.9)"
    )
    parser.add_argument(
        "--tick",
        metavar="DURATION",
        type=duration_arg("--tick", legacy_unit_s=1.0, positive=True, maximum_s=3600.0),
        default=10.0,
        help="time between samples: the agent's sampling interval, the time step of memory "
        "and of vramguard's decisions (default 10s; a bare number of seconds is deprecated)",
    )
    parser.add_argument(
        "--no-caps",
        dest="caps",
        action="store_false",
        help="skip the third run, vramguard on with driver-enforced memory limits (node agents with "
        "--enforce-caps; docs/simulation.md)",
    )
    parser.add_argument("--json", action="store_true", help="print the runs' figures as JSON")


def progress_line(hours: float, caps: bool) -> Callable[[str, float], None]:
    """A progress line on stderr, rewritten in place (a terminal): the run (1 of 3: vramguard off,
    on, with caps) and the simulated hours done."""
    runs = ("off", "on", "caps") if caps else ("off", "on")
    names = {"off": "vramguard off", "on": "vramguard on", "caps": "on, with caps"}

    def show(run: str, done: float) -> None:
        sys.stderr.write(f"\rsimulate: run {runs.index(run) + 1} of {len(runs)} ({names[run]}): "
                         f"{done:.0f}h of {hours:g}h simulated ")
        sys.stderr.flush()

    return show


def _seed(text: str) -> int:
    """A seed in [0, 2^32) (numpy's SeedSequence takes any, but a bound keeps the flag's type honest)."""
    if not text.strip().isdigit() or int(text) >= 2**32:
        raise argparse.ArgumentTypeError(f"{text!r}: want a whole number from 0 to {2**32 - 1}")
    return int(text)


def config_from(args: argparse.Namespace) -> SimulationConfig:
    """The simulation the flags ask for; raises ``ValueError`` naming the flag."""
    return SimulationConfig(
        nodes=parse_nodes(args.nodes),
        hours=args.hours_s / 3600.0,
        seed=args.seed,
        mix=parse_mix(args.mix),
        load=args.load,
        tick_s=args.tick,
        policy=load_policy(args.policy),
    )


def run(args: argparse.Namespace) -> int:
    """Run both simulations; 0 on success, 2 on bad input (message on stderr)."""
    try:
        config = config_from(args)
    except ValueError as err:
        print(f"vramguard simulate: {err}", file=sys.stderr)
        return 2
    assert config.policy is not None
    show = progress_line(config.hours, args.caps) if sys.stderr.isatty() and not args.json else None
    result = compare(config, config.policy, caps=args.caps, progress=show)
    if show is not None:
        sys.stderr.write("\n")
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(result))
    return 0
