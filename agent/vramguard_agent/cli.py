"""The ``vramguard-agent`` command: run, once, attribute, fake-host, simgpu-driver.

A click group; the flags of each subcommand, their environment variables and
defaults are in ``settings`` (shown in ``--help``), so the DaemonSet
configures the agent through env: NODE_NAME, VRAMGUARD_BACKEND,
VRAMGUARD_SAMPLE_INTERVAL, ...
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

from .agent import Agent, AgentConfig, build
from .cgroups import attribute_pid
from .settings import PARAMETERS, agent_config, publish_policy

log = logging.getLogger("vramguard_agent")


def _logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _with_node(cfg: AgentConfig) -> AgentConfig:
    """``cfg`` with its node: the flag's or ``NODE_NAME``'s, else the only node
    of a sim scenario. Raises ``click.UsageError`` when there is none."""
    if cfg.node_name:
        return cfg
    if cfg.backend == "sim" and cfg.scenario:
        from .scenario import load_scenario

        nodes = load_scenario(cfg.scenario).nodes
        if len(nodes) == 1:
            return replace(cfg, node_name=nodes[0].name)
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
        result = parts.sampler.sample()
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


# --- fake-host ---------------------------------------------------------------


def cmd_fake_host(scenario: Any, node: str | None, out: Any, at: float, kubeconfig: str | None) -> int:
    """Write a simulated node's /proc and cgroup trees under --out."""
    from .pods import PodIndex, PodWatcher
    from .scenario import load_scenario
    from .sim import FakeHost, assign_pids, resolve

    _logging("INFO")
    loaded = load_scenario(scenario)
    if not node:
        if len(loaded.nodes) != 1:
            raise click.UsageError("--node is required when the scenario has several nodes")
        node = loaded.nodes[0].name
    found = loaded.node(node)
    pods = {}
    if kubeconfig:
        from kubernetes import client

        index = PodIndex()
        PodWatcher(client.CoreV1Api(api_client(kubeconfig)), found.name, index).list_once()
        pods = index.snapshot()
    identities = resolve(found, pods)
    pids = assign_pids(found)
    host = FakeHost(out, found)
    host.write(identities, pids, at)
    owners = {str(pid): _owner(found, p) for pid, p in pids.items()}
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


# --- simgpu-driver ------------------------------------------------------------


def cmd_simgpu_driver(socket: Any, node: str, gpus: str, driver_version: str, log_level: str) -> int:
    """Serve the simulated driver until SIGTERM/SIGINT (docs/real-node.md)."""
    import yaml
    from pydantic import TypeAdapter

    from .scenario import SimGPU
    from .simdriver import SimDriver, serve_in_thread

    _logging(log_level)
    specs = TypeAdapter(list[SimGPU]).validate_python(yaml.safe_load(gpus))
    driver = SimDriver(node, specs, driver_version)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = serve_in_thread(socket, driver)
    log.info("simulated driver %s serving %s: %s", driver_version, socket,
             ", ".join(f"{d.uuid} {n} {d.total_bytes} bytes" for d, n in zip(driver.devices, driver.names, strict=True)))
    stop.wait()
    server.shutdown()
    server.server_close()
    socket.unlink(missing_ok=True)
    return 0


# --- the group ---------------------------------------------------------------

CALLBACKS: dict[str, Callable[..., int]] = {
    "run": cmd_run,
    "once": cmd_once,
    "attribute": cmd_attribute,
    "fake-host": cmd_fake_host,
    "simgpu-driver": cmd_simgpu_driver,
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
