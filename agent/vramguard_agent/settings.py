"""The settings of ``vramguard-agent``: every flag of ``run``, ``once`` and
``attribute`` with its environment variable, default and
help, read by click (``vramguard_api.cliargs``, the same parsers and messages
as the ``vramguard`` command) into ``AgentConfig`` and ``PublishPolicy``.

Each ``run``/``once`` setting comes from its flag, else its variable (the
DaemonSet sets ``NODE_NAME`` through the downward API), else its default. A bad
value is refused with a message naming the flag, the variable and the value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from vramguard_api.cliargs import Duration, Environment, LogLevel, Number, Quantity, WholeNumber, env_option
from vramguard_api.history import DEFAULT_MAX_POINTS, DEFAULT_TREND_INTERVAL_S, DEFAULT_WINDOW_S

from . import backends
from .config import DEFAULT_METRICS_ADDRESS, AgentConfig
from .memory import DEFAULT_REFRESH_S
from .publish import (
    DEFAULT_DEADBAND_BYTES,
    DEFAULT_DEADBAND_FRACTION,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_MIN_INTERVAL_S,
    PublishPolicy,
)

PATH = click.Path(path_type=Path)


class BackendName(click.ParamType):
    """The name of an installed GPU backend (``backends``: an entry point)."""

    name = "backend"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value not in backends.installed():
            self.fail(backends.not_installed(str(value)), param, ctx)
        return str(value)


def _sampling_parameters(run: bool) -> list[click.Parameter]:
    """The options ``run`` and ``once`` share (``run``: ``--kubeconfig`` also
    from ``KUBECONFIG``)."""
    env = env_option
    return [
        env("--node", "NODE_NAME", help="node name (env NODE_NAME)"),
        env("--backend", "VRAMGUARD_BACKEND", "nvml", type=BackendName(),
            help="GPU backend: nvml; with vramguard-sim installed also sim (a scenario) and simdriver (the "
            "local cluster's simulated driver) (env VRAMGUARD_BACKEND; default nvml)"),
        env("--scenario", "VRAMGUARD_SCENARIO", type=PATH, help="sim: scenario file (env VRAMGUARD_SCENARIO)"),
        env("--proc-root", "VRAMGUARD_PROC_ROOT", type=PATH,
            help="the host's /proc (env VRAMGUARD_PROC_ROOT; default /proc, or the sim's fake tree)"),
        env("--cgroup-root", "VRAMGUARD_CGROUP_ROOT", type=PATH,
            help="the host's cgroup mount (env VRAMGUARD_CGROUP_ROOT; default /sys/fs/cgroup)"),
        env("--sample-interval", "VRAMGUARD_SAMPLE_INTERVAL", "10s", type=Duration(),
            help="sampling interval, Go duration (env VRAMGUARD_SAMPLE_INTERVAL; default 10s)"),
        env("--history-window", "VRAMGUARD_HISTORY_WINDOW", f"{int(DEFAULT_WINDOW_S)}s", type=Duration(),
            help="per-pod history window (env VRAMGUARD_HISTORY_WINDOW; default 2h)"),
        env("--history-points", "VRAMGUARD_HISTORY_POINTS", str(DEFAULT_MAX_POINTS), type=WholeNumber(3),
            help=f"points kept per pod (env VRAMGUARD_HISTORY_POINTS; default {DEFAULT_MAX_POINTS})"),
        env("--trend-interval", "VRAMGUARD_TREND_INTERVAL", f"{int(DEFAULT_TREND_INTERVAL_S)}s", type=Duration(),
            help="how often trend features are recomputed (env VRAMGUARD_TREND_INTERVAL; default 5m)"),
        env("--ram-interval", "VRAMGUARD_RAM_INTERVAL", f"{int(DEFAULT_REFRESH_S)}s", type=Duration(),
            help="how often a pod's RAM and OOM kills are re-read from the cgroup files; 0s: every sample "
            "(env VRAMGUARD_RAM_INTERVAL; default 30s)"),
        env("--simgpu-socket", "VRAMGUARD_SIMGPU_SOCKET", type=PATH, empty_is_unset=True,
            help="simdriver: the simulated driver's socket, read instead of libnvidia-ml (the local "
            "cluster's real node, docs/real-node.md; env VRAMGUARD_SIMGPU_SOCKET)"),
        env("--sim-offset", "VRAMGUARD_SIM_OFFSET", "0s", type=Duration(),
            help="sim: scenario time at start (env VRAMGUARD_SIM_OFFSET)"),
        env("--sim-speed", "VRAMGUARD_SIM_SPEED", "1", type=Number(lambda x: x > 0, "a positive number"),
            help="sim: scenario seconds per wall-clock second; histories and trends are kept in "
            "scenario time, sampleTime stays wall-clock (env VRAMGUARD_SIM_SPEED; default 1)"),
        env("--sim-driver-state", "VRAMGUARD_SIM_DRIVER_STATE", type=PATH,
            empty_is_unset=True,
            help="sim: a file the simulated driver keeps its per-cgroup memory limits in, so that a restarted "
            "agent finds them as on a real node (env VRAMGUARD_SIM_DRIVER_STATE; default: none kept)"),
        env("--kubeconfig", "KUBECONFIG", help="kubeconfig (default: in-cluster, then KUBECONFIG)")
        if run
        else click.Option(["--kubeconfig"], help="list this node's pods from this cluster for their names"),
        env("--log-level", "VRAMGUARD_LOG_LEVEL", "INFO", type=LogLevel(), help="log level (env VRAMGUARD_LOG_LEVEL)"),
        env("--pod-uid", "POD_UID", empty_is_unset=True,
            help="the agent's own pod uid (downward API): the cgroup the memory-limit probe reads (env POD_UID)"),
    ]


def run_parameters() -> list[click.Parameter]:
    """The options of ``vramguard-agent run``."""
    env = env_option
    return [
        *_sampling_parameters(run=True),
        env("--heartbeat", "VRAMGUARD_HEARTBEAT", f"{int(DEFAULT_HEARTBEAT_S)}s", type=Duration(),
            help="write at least this often (env VRAMGUARD_HEARTBEAT; default 30s)"),
        env("--min-report-interval", "VRAMGUARD_MIN_REPORT_INTERVAL", f"{int(DEFAULT_MIN_INTERVAL_S)}s",
            type=Duration(), help="write at most this often (env VRAMGUARD_MIN_REPORT_INTERVAL; default 5s)"),
        env("--deadband", "VRAMGUARD_DEADBAND", DEFAULT_DEADBAND_BYTES, type=Quantity(),
            help="absolute dead-band, a quantity (env VRAMGUARD_DEADBAND; default 64Mi)"),
        env("--deadband-fraction", "VRAMGUARD_DEADBAND_FRACTION", DEFAULT_DEADBAND_FRACTION,
            type=Number(lambda x: 0 <= x < 1, "a number in [0, 1)"),
            help="relative dead-band (env VRAMGUARD_DEADBAND_FRACTION; default 0.02)"),
        env("--metrics-address", "VRAMGUARD_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS,
            help="host:port of /metrics, /healthz, /readyz; empty disables "
            "(env VRAMGUARD_METRICS_ADDRESS; default :9402)"),
        env("--enforce-caps/--no-enforce-caps", "VRAMGUARD_ENFORCE_CAPS", False, type=click.BOOL,
            empty_is_unset=True,
            help="apply the memory limits of pods' vramguard.io/memory-limits annotations through NVML (needs "
            "root and CAP_SYS_ADMIN); off, only report whether devices support them "
            "(env VRAMGUARD_ENFORCE_CAPS; default off)"),
    ]


def once_parameters() -> list[click.Parameter]:
    """The options of ``vramguard-agent once``."""
    return [*_sampling_parameters(run=False), click.Option(["--pretty"], is_flag=True, help="indent the JSON")]


def attribute_parameters() -> list[click.Parameter]:
    """The argument and option of ``vramguard-agent attribute``."""
    return [
        click.Argument(["pid"], type=int),
        env_option("--proc-root", "VRAMGUARD_PROC_ROOT", "/proc", type=PATH,
                   help="the host's /proc (env VRAMGUARD_PROC_ROOT; default /proc)"),
    ]


PARAMETERS = {
    "run": (run_parameters, "sample, serve metrics and write this node's NodeGPUUsage"),
    "once": (once_parameters, "take one sample and print the NodeGPUUsage status as JSON"),
    "attribute": (attribute_parameters, "which pod and container a host pid belongs to"),
}
"""subcommand -> (its parameters, its help)"""


def publish_policy(params: Mapping[str, Any]) -> PublishPolicy:
    """The dead-band and heartbeat of ``run`` from its read values. Raises
    ``ValueError`` when the minimum interval exceeds the heartbeat."""
    return PublishPolicy(
        heartbeat_s=params["heartbeat"],
        min_interval_s=params["min_report_interval"],
        deadband_bytes=params["deadband"],
        deadband_fraction=params["deadband_fraction"],
    )


def agent_config(params: Mapping[str, Any], policy: PublishPolicy | None = None) -> AgentConfig:
    """``AgentConfig`` from the read values of ``run`` or ``once`` (``policy``:
    ``run``'s; the default for ``once``, which writes nothing)."""
    return AgentConfig(
        node_name=params["node"],
        backend=params["backend"],
        scenario=params["scenario"],
        proc_root=params["proc_root"],
        cgroup_root=params["cgroup_root"],
        sample_interval_s=params["sample_interval"],
        policy=policy or PublishPolicy(),
        history_window_s=params["history_window"],
        history_points=params["history_points"],
        trend_interval_s=params["trend_interval"],
        ram_interval_s=params["ram_interval"],
        metrics_address=params.get("metrics_address") or None,
        kubeconfig=params["kubeconfig"],
        sim_offset_s=params["sim_offset"],
        sim_speed=params["sim_speed"],
        sim_driver_state=params.get("sim_driver_state"),
        enforce_caps=params.get("enforce_caps", False),  # run only: once never applies limits
        pod_uid=params["pod_uid"],
        simgpu_socket=params["simgpu_socket"],
    )


@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed command line: the subcommand and the values of its parameters
    (seconds, bytes, paths, numbers; None for what is unset)."""

    command: str
    params: dict[str, Any]


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Parsed:
    """What ``vramguard-agent ARGV`` is told, reading the variables of ``env``
    (default: the process's). Raises ``click.UsageError`` (a
    ``click.BadParameter`` naming flag, variable and value)."""
    if not argv or argv[0] not in PARAMETERS:
        raise click.UsageError(f"want a command: {', '.join(PARAMETERS)}")
    name, (params, _) = argv[0], PARAMETERS[argv[0]]
    command = click.Command(name, params=params())
    obj = Environment(env) if env is not None else None
    with command.make_context(f"vramguard-agent {name}", list(argv[1:]), obj=obj) as ctx:
        return Parsed(name, dict(ctx.params))
