"""The ``vramguard-agent`` command: run, once, attribute.

A click group; the flags of each subcommand, their environment variables and
defaults are in ``settings`` (shown in ``--help``), so the DaemonSet
configures the agent through env: NODE_NAME, VRAMGUARD_BACKEND,
VRAMGUARD_SAMPLE_INTERVAL, ... The simulators' own commands (``fake-host``,
``simgpu-driver``) are ``vramguard-sim``'s, in the vramguard-sim distribution.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import click

from vramguard_api.cliargs import CONTEXT, run_main
from vramguard_api.kube import api_client

from . import backends
from .agent import Agent, AgentConfig, build
from .cgroups import attribute_pid
from .settings import PARAMETERS, agent_config, publish_policy

log = logging.getLogger("vramguard_agent")


def _logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _with_node(cfg: AgentConfig) -> AgentConfig:
    """``cfg`` with its node: the flag's or ``NODE_NAME``'s, else the backend's
    default (the only node of a sim scenario). Raises ``click.UsageError`` when
    there is none, ``ValueError`` for a backend that is not installed."""
    if cfg.node_name:
        return cfg
    node = backends.load(cfg.backend).default_node(cfg)
    if node:
        return replace(cfg, node_name=node)
    raise click.UsageError("--node (or NODE_NAME) is required")


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


# --- run ---------------------------------------------------------------------


def cmd_run(**params: Any) -> int:
    """Run the agent until SIGTERM/SIGINT."""
    _logging(params["log_level"])
    policy = publish_policy(params)
    cfg = _with_node(agent_config(params, policy))
    api = _api(cfg.kubeconfig)
    if api is None:
        return 2
    agent = Agent(cfg, build(cfg, api, publish=True))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "agent starting: node=%s backend=%s interval=%ss heartbeat=%ss deadband=%sB/%s metrics=%s enforce-caps=%s",
        cfg.node_name,
        cfg.backend,
        cfg.sample_interval_s,
        policy.heartbeat_s,
        policy.deadband_bytes,
        policy.deadband_fraction,
        cfg.metrics_address,
        cfg.enforce_caps,
    )
    agent.run(stop)
    return 0


# --- once --------------------------------------------------------------------


def cmd_once(**params: Any) -> int:
    """Take one sample and print the NodeGPUUsage status as JSON."""
    _logging(params["log_level"])
    cfg = _with_node(agent_config(params))
    api = _api(cfg.kubeconfig) if cfg.kubeconfig else None
    if cfg.kubeconfig and api is None:
        return 2
    parts = build(cfg, api)
    try:
        if parts.watcher is not None:
            parts.watcher.list_once()
        result = parts.tick()  # with --enforce-caps unset (once has no such flag): no limit is applied
    finally:
        parts.close()
    json.dump(result.status.to_api(), sys.stdout, indent=2 if params["pretty"] else None)
    sys.stdout.write("\n")
    why = result.unreadable
    if why is not None:
        print(f"vramguard-agent once: no GPU device can be read: {why}", file=sys.stderr)
        return 1
    return 0


# --- attribute ---------------------------------------------------------------


def cmd_attribute(pid: int, proc_root: Any) -> int:
    """Print which pod and container a host pid belongs to, or why none."""
    _logging("INFO")
    try:
        found = attribute_pid(pid, proc_root)
    except OSError as err:
        print(f"vramguard-agent: cannot read {proc_root}/{pid}/cgroup: {err.strerror or err}", file=sys.stderr)
        return 1
    print(json.dumps(found.to_json()))
    return 0


# --- the group ---------------------------------------------------------------

CALLBACKS: dict[str, Callable[..., int]] = {
    "run": cmd_run,
    "once": cmd_once,
    "attribute": cmd_attribute,
}


def group() -> click.Group:
    """The ``vramguard-agent`` command group with every subcommand."""
    top = click.Group("vramguard-agent", help="vramguard node agent", context_settings=CONTEXT)
    click.version_option(package_name="vramguard", prog_name="vramguard-agent",
                         message="%(prog)s %(version)s")(top)
    for name, (params, help_text) in PARAMETERS.items():
        top.add_command(click.Command(name, params=params(), callback=CALLBACKS[name], help=help_text,
                                      context_settings=CONTEXT))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vramguard-agent``; returns the exit status (2 with a
    message on stderr for a bad flag, value or scenario: ``run_main``)."""
    return run_main("vramguard-agent", lambda: group().main(args=list(argv) if argv is not None else None,
                                                            prog_name="vramguard-agent", standalone_mode=False))


if __name__ == "__main__":
    sys.exit(main())
