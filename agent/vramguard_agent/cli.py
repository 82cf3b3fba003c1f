"""The ``vramguard-agent`` command: run, once, attribute, fake-host.

Every ``run``/``once`` flag has an environment variable (shown in ``--help``),
so the DaemonSet configures the agent through env: NODE_NAME,
VRAMGUARD_BACKEND, VRAMGUARD_SAMPLE_INTERVAL, ...
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vramguard_api.cliargs import duration_arg as _duration
from vramguard_api.cliargs import quantity_arg as _quantity
from vramguard_api.kube import api_client
from vramguard_api.units import parse_duration, quantity_to_bytes

from .agent import DEFAULT_METRICS_ADDRESS, Agent, AgentConfig, build
from .cgroups import attribute_pid
from .history import DEFAULT_MAX_POINTS, DEFAULT_TREND_INTERVAL_S, DEFAULT_WINDOW_S
from .memory import DEFAULT_REFRESH_S
from .publish import (
    DEFAULT_DEADBAND_BYTES,
    DEFAULT_DEADBAND_FRACTION,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_MIN_INTERVAL_S,
    PublishPolicy,
)

log = logging.getLogger("vramguard_agent")


def _env(name: str, default: Any) -> Any:
    return os.environ.get(name, default)


def _whole(flag: str, env: str, low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low``. The error names the flag and
    its variable (argparse converts string defaults taken from the environment
    with this too), never a traceback."""

    def parse(value: str) -> int:
        try:
            number: int | None = int(value, 10)
        except ValueError:
            number = None
        if number is None or number < low:
            raise argparse.ArgumentTypeError(f"want a whole number >= {low} ({flag} or env {env}), got {value!r}")
        return number

    return parse


LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def _log_level(value: str) -> str:
    """An argparse type: a logging level name, any case; returned upper-case."""
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"want one of {', '.join(LOG_LEVELS)} (--log-level or env VRAMGUARD_LOG_LEVEL), got {value!r}"
        )
    return level


def _real(flag: str, env: str, ok: Callable[[float], bool], want: str) -> Callable[[str], float]:
    """An argparse type: a finite number for which ``ok`` holds (``want`` says
    which, in the error, with the flag and its variable)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and ok(number)):
            raise argparse.ArgumentTypeError(f"want {want} ({flag} or env {env}), got {value!r}")
        return number

    return parse


_fraction = _real("--deadband-fraction", "VRAMGUARD_DEADBAND_FRACTION", lambda x: 0 <= x < 1, "a number in [0, 1)")
_speed = _real("--sim-speed", "VRAMGUARD_SIM_SPEED", lambda x: x > 0, "a positive number")


def _sampling_flags(p: argparse.ArgumentParser, kubeconfig_env: bool) -> None:
    p.add_argument("--node", default=_env("NODE_NAME", None), help="node name (env NODE_NAME)")
    p.add_argument(
        "--backend",
        choices=["nvml", "sim"],
        default=_env("VRAMGUARD_BACKEND", "nvml"),
        help="GPU backend (env VRAMGUARD_BACKEND)",
    )
    p.add_argument(
        "--scenario",
        type=Path,
        default=_env("VRAMGUARD_SCENARIO", None),
        help="sim scenario file (env VRAMGUARD_SCENARIO)",
    )
    p.add_argument(
        "--proc-root",
        type=Path,
        default=_env("VRAMGUARD_PROC_ROOT", None),
        help="the host's /proc (env VRAMGUARD_PROC_ROOT; default /proc, or the sim's fake tree)",
    )
    p.add_argument(
        "--cgroup-root",
        type=Path,
        default=_env("VRAMGUARD_CGROUP_ROOT", None),
        help="the host's cgroup mount (env VRAMGUARD_CGROUP_ROOT; default /sys/fs/cgroup)",
    )
    p.add_argument(
        "--sample-interval",
        type=_duration("--sample-interval", "VRAMGUARD_SAMPLE_INTERVAL"),
        default=_env("VRAMGUARD_SAMPLE_INTERVAL", "10s"),
        help="sampling interval, Go duration (env VRAMGUARD_SAMPLE_INTERVAL; default 10s)",
    )
    p.add_argument(
        "--history-window",
        type=_duration("--history-window", "VRAMGUARD_HISTORY_WINDOW"),
        default=_env("VRAMGUARD_HISTORY_WINDOW", f"{int(DEFAULT_WINDOW_S)}s"),
        help="per-pod history window (env VRAMGUARD_HISTORY_WINDOW; default 2h)",
    )
    p.add_argument(
        "--history-points",
        type=_whole("--history-points", "VRAMGUARD_HISTORY_POINTS", 3),
        default=_env("VRAMGUARD_HISTORY_POINTS", str(DEFAULT_MAX_POINTS)),
        help=f"points kept per pod (env VRAMGUARD_HISTORY_POINTS; default {DEFAULT_MAX_POINTS})",
    )
    p.add_argument(
        "--trend-interval",
        type=_duration("--trend-interval", "VRAMGUARD_TREND_INTERVAL"),
        default=_env("VRAMGUARD_TREND_INTERVAL", f"{int(DEFAULT_TREND_INTERVAL_S)}s"),
        help="how often trend features are recomputed (env VRAMGUARD_TREND_INTERVAL; default 5m)",
    )
    p.add_argument(
        "--ram-interval",
        type=_duration("--ram-interval", "VRAMGUARD_RAM_INTERVAL"),
        default=_env("VRAMGUARD_RAM_INTERVAL", f"{int(DEFAULT_REFRESH_S)}s"),
        help="how often a pod's RAM and OOM kills are re-read from the cgroup files; 0s: every sample "
        "(env VRAMGUARD_RAM_INTERVAL; default 30s)",
    )
    p.add_argument(
        "--sim-offset",
        type=_duration("--sim-offset", "VRAMGUARD_SIM_OFFSET"),
        default=_env("VRAMGUARD_SIM_OFFSET", "0s"),
        help="sim: scenario time at start (env VRAMGUARD_SIM_OFFSET)",
    )
    p.add_argument(
        "--sim-speed",
        type=_speed,
        default=_env("VRAMGUARD_SIM_SPEED", "1"),
        help="sim: scenario seconds per wall-clock second; histories and trends are kept in "
        "scenario time, sampleTime stays wall-clock (env VRAMGUARD_SIM_SPEED; default 1)",
    )
    if kubeconfig_env:
        p.add_argument(
            "--kubeconfig",
            default=_env("KUBECONFIG", None),
            help="kubeconfig (default: in-cluster, then KUBECONFIG)",
        )
    else:
        p.add_argument(
            "--kubeconfig",
            default=None,
            help="list this node's pods from this cluster for their names",
        )
    p.add_argument(
        "--log-level",
        type=_log_level,
        default=_env("VRAMGUARD_LOG_LEVEL", "INFO"),
        help="log level (env VRAMGUARD_LOG_LEVEL)",
    )


def _config(args: argparse.Namespace, policy: PublishPolicy | None = None) -> AgentConfig:
    return AgentConfig(
        node_name=args.node,
        backend=args.backend,
        scenario=Path(args.scenario) if args.scenario else None,
        proc_root=Path(args.proc_root) if args.proc_root else None,
        cgroup_root=Path(args.cgroup_root) if args.cgroup_root else None,
        sample_interval_s=_seconds(args.sample_interval, "--sample-interval"),
        policy=policy or PublishPolicy(),
        history_window_s=_seconds(args.history_window, "--history-window"),
        history_points=args.history_points,
        trend_interval_s=_seconds(args.trend_interval, "--trend-interval"),
        ram_interval_s=_seconds(args.ram_interval, "--ram-interval"),
        metrics_address=getattr(args, "metrics_address", None) or None,
        kubeconfig=args.kubeconfig,
        sim_offset_s=_seconds(args.sim_offset, "--sim-offset"),
        sim_speed=float(args.sim_speed),
    )


def _node_name(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.node:
        return
    if args.backend == "sim" and args.scenario:
        from .scenario import load_scenario

        nodes = load_scenario(args.scenario).nodes
        if len(nodes) == 1:
            args.node = nodes[0].name
            return
    parser.error("--node (or NODE_NAME) is required")


# --- run ---------------------------------------------------------------------


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the agent until SIGTERM/SIGINT."""
    _node_name(args, parser)
    policy = PublishPolicy(
        heartbeat_s=_seconds(args.heartbeat, "--heartbeat"),
        min_interval_s=_seconds(args.min_report_interval, "--min-report-interval"),
        deadband_bytes=args.deadband
        if isinstance(args.deadband, int)
        else quantity_to_bytes(args.deadband, "--deadband"),
        deadband_fraction=float(args.deadband_fraction),
    )
    cfg = _config(args, policy)
    api = _api(cfg.kubeconfig)
    if api is None:
        return 2
    agent = Agent(cfg, build(cfg, api, publish=True))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "agent starting: node=%s backend=%s interval=%ss heartbeat=%ss deadband=%sB/%s metrics=%s",
        cfg.node_name,
        cfg.backend,
        cfg.sample_interval_s,
        policy.heartbeat_s,
        policy.deadband_bytes,
        policy.deadband_fraction,
        cfg.metrics_address,
    )
    agent.run(stop)
    return 0


def _api(kubeconfig: str | None) -> Any:
    """An API client, or None (with the reason on stderr) when no configuration loads."""
    try:
        return api_client(kubeconfig)
    except Exception as err:  # noqa: BLE001 - ConfigException, a missing or malformed file
        print(
            f"vramguard-agent: cannot load a Kubernetes configuration ({kubeconfig or 'in-cluster'}): {err}",
            file=sys.stderr,
        )
        return None


def _seconds(value: Any, flag: str) -> float:
    # Defaults taken from the environment arrive as strings.
    return value if isinstance(value, float) else parse_duration(str(value), field=flag)


# --- once --------------------------------------------------------------------


def cmd_once(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Take one sample and print the NodeGPUUsage status as JSON."""
    _node_name(args, parser)
    cfg = _config(args)
    api = _api(cfg.kubeconfig) if args.kubeconfig else None
    if args.kubeconfig and api is None:
        return 2
    parts = build(cfg, api)
    try:
        if parts.watcher is not None:
            parts.watcher.list_once()
        result = parts.sampler.sample()
    finally:
        parts.close()
    json.dump(result.status.to_api(), sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")
    return 0


# --- attribute ---------------------------------------------------------------


def cmd_attribute(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Print which pod and container a host pid belongs to, or why none."""
    try:
        found = attribute_pid(args.pid, args.proc_root)
    except OSError as err:
        print(
            f"vramguard-agent: cannot read {args.proc_root}/{args.pid}/cgroup: {err.strerror or err}",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(found.to_json()))
    return 0


# --- fake-host ---------------------------------------------------------------


def cmd_fake_host(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Write a simulated node's /proc and cgroup trees under --out."""
    from .pods import PodIndex, PodWatcher
    from .scenario import load_scenario
    from .sim import FakeHost, assign_pids, resolve

    scenario = load_scenario(args.scenario)
    if not args.node:
        if len(scenario.nodes) != 1:
            parser.error("--node is required when the scenario has several nodes")
        args.node = scenario.nodes[0].name
    node = scenario.node(args.node)
    pods = {}
    if args.kubeconfig:
        from kubernetes import client

        index = PodIndex()
        PodWatcher(client.CoreV1Api(api_client(args.kubeconfig)), node.name, index).list_once()
        pods = index.snapshot()
    identities = resolve(node, pods)
    pids = assign_pids(node)
    host = FakeHost(args.out, node)
    host.write(identities, pids, _seconds(args.at, "--at"))
    owners = {str(pid): _owner(node, p) for pid, p in pids.items()}
    print(
        json.dumps(
            {"procRoot": str(host.proc_root), "cgroupRoot": str(host.cgroup_root), "pids": owners},
            indent=2,
        )
    )
    return 0


def _owner(node: Any, process: Any) -> str:
    for pod in node.pods:
        for c in pod.containers:
            if any(p is process for p in c.processes):
                return f"{pod.namespace}/{pod.name}/{c.name}"
    return "host"


# --- parser ------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    top = argparse.ArgumentParser(prog="vramguard-agent", description="vramguard node agent")
    sub = top.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="sample, serve metrics and write this node's NodeGPUUsage")
    _sampling_flags(run, kubeconfig_env=True)
    run.add_argument(
        "--heartbeat",
        default=_env("VRAMGUARD_HEARTBEAT", f"{int(DEFAULT_HEARTBEAT_S)}s"),
        type=_duration("--heartbeat", "VRAMGUARD_HEARTBEAT"),
        help="write at least this often (env VRAMGUARD_HEARTBEAT; default 30s)",
    )
    run.add_argument(
        "--min-report-interval",
        default=_env("VRAMGUARD_MIN_REPORT_INTERVAL", f"{int(DEFAULT_MIN_INTERVAL_S)}s"),
        type=_duration("--min-report-interval", "VRAMGUARD_MIN_REPORT_INTERVAL"),
        help="write at most this often (env VRAMGUARD_MIN_REPORT_INTERVAL; default 5s)",
    )
    run.add_argument(
        "--deadband",
        default=_env("VRAMGUARD_DEADBAND", DEFAULT_DEADBAND_BYTES),
        type=_quantity("--deadband", "VRAMGUARD_DEADBAND"),
        help="absolute dead-band, a quantity (env VRAMGUARD_DEADBAND; default 64Mi)",
    )
    run.add_argument(
        "--deadband-fraction",
        default=_env("VRAMGUARD_DEADBAND_FRACTION", DEFAULT_DEADBAND_FRACTION),
        type=_fraction,
        help="relative dead-band (env VRAMGUARD_DEADBAND_FRACTION; default 0.02)",
    )
    run.add_argument(
        "--metrics-address",
        default=_env("VRAMGUARD_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS),
        help="host:port of /metrics, /healthz, /readyz; empty disables (env VRAMGUARD_METRICS_ADDRESS; default :9402)",
    )
    run.set_defaults(func=cmd_run)

    once = sub.add_parser("once", help="take one sample and print the NodeGPUUsage status as JSON")
    _sampling_flags(once, kubeconfig_env=False)
    once.add_argument("--pretty", action="store_true", help="indent the JSON")
    once.set_defaults(func=cmd_once)

    attribute = sub.add_parser("attribute", help="which pod and container a host pid belongs to")
    attribute.add_argument("pid", type=int)
    attribute.add_argument("--proc-root", type=Path, default=Path(_env("VRAMGUARD_PROC_ROOT", "/proc")))
    attribute.set_defaults(func=cmd_attribute)

    fake = sub.add_parser("fake-host", help="write a simulated node's fake /proc and cgroup trees")
    fake.add_argument("--scenario", type=Path, required=True)
    fake.add_argument("--node", default=_env("NODE_NAME", None))
    fake.add_argument("--out", type=Path, required=True, help="directory to write proc/ and cgroup/ into")
    fake.add_argument("--at", default="0s", type=_duration("--at"), help="scenario time of the memory files")
    fake.add_argument("--kubeconfig", default=None, help="resolve pod uids and container ids from this cluster")
    fake.set_defaults(func=cmd_fake_host)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vramguard-agent``."""
    top = parser()
    args = top.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args, top))
    except (ValueError, KeyError) as err:
        print(f"vramguard-agent: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
