"""The ``vramguard-sim`` command: the simulators' tools, apart from the agent's command.

- ``fake-host`` writes a simulated node's /proc and cgroup trees (what the agent's
  ``--proc-root`` and ``--cgroup-root`` then read);
- ``simgpu-driver`` serves the local cluster's real node its simulated GPUs
  (docs/real-node.md), which the agent reads with ``--backend simdriver``.

Same conventions as ``vramguard-agent`` (click; a flag's environment variable
in its help; exit 2 with a one-line message for a bad flag, value or scenario).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from vramguard_api.cliargs import Duration, LogLevel, env_option
from vramguard_api.kube import api_client

log = logging.getLogger("vramguard_sim")

PATH = click.Path(path_type=Path)

REAL_NODE_GPUS = "[{model: NVIDIA H100 80GB HBM3, memory: 81559Mi, reserved: 579Mi}]"
"""The simulated driver's default devices: the real node's labels (hack/cluster/realnode-config.sh)."""


def _logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


# --- fake-host ---------------------------------------------------------------


def fake_host_parameters() -> list[click.Parameter]:
    """The options of ``vramguard-sim fake-host``."""
    return [
        click.Option(["--scenario"], type=PATH, required=True, help="sim scenario file"),
        env_option("--node", "NODE_NAME", help="node name (env NODE_NAME)"),
        click.Option(["--out"], type=PATH, required=True, help="directory to write proc/ and cgroup/ into"),
        click.Option(["--at"], default="0s", type=Duration(), help="scenario time of the memory files"),
        click.Option(["--kubeconfig"], help="resolve pod uids and container ids from this cluster"),
    ]


def cmd_fake_host(scenario: Any, node: str | None, out: Any, at: float, kubeconfig: str | None) -> int:
    """Write a simulated node's /proc and cgroup trees under --out."""
    from vramguard_agent.pods import PodIndex, PodWatcher

    from .scenario import load_scenario
    from .simbackend import FakeHost, assign_pids, resolve

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


def simgpu_driver_parameters() -> list[click.Parameter]:
    """The options of ``vramguard-sim simgpu-driver``."""
    return [
        click.Option(["--socket"], type=PATH, required=True, help="the Unix socket to serve (pods mount it)"),
        env_option("--node", "NODE_NAME", "real-node-1", help="node name, for the devices' UUIDs (env NODE_NAME)"),
        click.Option(["--gpus"], default=REAL_NODE_GPUS, show_default=True,
                     help="the devices, a YAML list of scenario GPUs (model, count, memory, reserved, overhead)"),
        click.Option(["--driver-version"], default="570.133.20", show_default=True, help="what NVML reports"),
        env_option("--log-level", "VRAMGUARD_LOG_LEVEL", "INFO", type=LogLevel(),
                   help="log level (env VRAMGUARD_LOG_LEVEL)"),
    ]


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

COMMANDS: dict[str, tuple[Callable[[], list[click.Parameter]], Callable[..., int], str]] = {
    "fake-host": (fake_host_parameters, cmd_fake_host, "write a simulated node's fake /proc and cgroup trees"),
    "simgpu-driver": (
        simgpu_driver_parameters, cmd_simgpu_driver, "serve simulated GPUs that real processes use (the real node)"
    ),
}
"""subcommand -> (its parameters, its callback, its help)"""


def group() -> click.Group:
    """The ``vramguard-sim`` command group with every subcommand."""
    top = click.Group("vramguard-sim", help="vramguard's simulators (the vramguard-sim distribution)")
    for name, (params, callback, help_text) in COMMANDS.items():
        top.add_command(click.Command(name, params=params(), callback=callback, help=help_text))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vramguard-sim``; returns the exit status (2 with a
    message on stderr for a bad flag, value or scenario)."""
    try:
        rv = group().main(args=list(argv) if argv is not None else None, prog_name="vramguard-sim",
                          standalone_mode=False)
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except (ValueError, KeyError) as err:
        print(f"vramguard-sim: {err}", file=sys.stderr)
        return 2
    except click.Abort:
        return 1
    return int(rv or 0)
