"""The agent's simulated backends, registered as entry points of
``vramguard.agent_backends`` (``sim/pyproject.toml``; the agent finds them by
name, ``vramguard_agent.backends``):

- ``sim``: one node of a scenario (``--scenario``, ``--sim-offset``,
  ``--sim-speed``, ``--sim-driver-state``) played through a fake NVML on a fake
  host (``simbackend.SimBackend``). Without ``--proc-root`` the fake host is
  written to a temporary directory, removed at the end; without an API server
  the scenario's own pod names stand in for the API's. Histories are kept in
  scenario time, which may run faster than the clock;
- ``simdriver``: the local cluster's real node (docs/real-node.md): the agent's
  own ``NVMLBackend`` over ``drivernvml.DriverNVML``, the NVML calls answered by
  the simulated driver at ``--simgpu-socket``; /proc and cgroups are the host's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from vramguard_agent.backends import ApiPods, Backend, BackendParts, host_roots
from vramguard_agent.config import AgentConfig
from vramguard_agent.nvml import NVMLBackend

from .drivernvml import DriverNVML
from .scenario import load_scenario
from .simbackend import SimBackend


def _scenario(cfg: AgentConfig, api_pods: ApiPods | None) -> BackendParts:
    if cfg.scenario is None:
        raise ValueError("backend sim: --scenario is required")
    node = load_scenario(cfg.scenario).node(cfg.node_name)
    proc_root, cgroup_root = host_roots(cfg)
    host_root: Path | None = None
    cleanup: list[Callable[[], None]] = []
    if cfg.proc_root is None:
        # No tree given: the simulation writes its own fake host and removes it at the end.
        root = host_root = Path(tempfile.mkdtemp(prefix=f"vramguard-sim-{cfg.node_name}-"))
        cleanup.append(lambda: shutil.rmtree(root, ignore_errors=True))
        proc_root, cgroup_root = host_root / "proc", cfg.cgroup_root or host_root / "cgroup"
    sim = SimBackend(
        node, api_pods=api_pods or dict, host_root=host_root, offset_s=cfg.sim_offset_s, speed=cfg.sim_speed,
        driver_state=cfg.sim_driver_state,
    )
    return BackendParts(
        sim, sim.fake, proc_root, cgroup_root,
        pods=api_pods or sim.pod_metas,  # without an API server, the scenario's own names stand in
        container_names=sim.container_names,
        history_clock=sim.now,
        cache_key=lambda: sim.identity_version,  # re-homed pids once the pods' uids are learnt from the API
        cleanup=cleanup,
    )


def _only_node(cfg: AgentConfig) -> str | None:
    """The scenario's node when it has only one."""
    if cfg.scenario is None:
        return None
    nodes = load_scenario(cfg.scenario).nodes
    return nodes[0].name if len(nodes) == 1 else None


def _driver(cfg: AgentConfig, api_pods: ApiPods | None) -> BackendParts:
    if cfg.simgpu_socket is None:
        raise ValueError("backend simdriver: --simgpu-socket is required")
    nvml = DriverNVML(cfg.simgpu_socket)
    proc_root, cgroup_root = host_roots(cfg)
    return BackendParts(NVMLBackend(nvml), nvml, proc_root, cgroup_root, api_pods or dict)


SCENARIO = Backend(_scenario, default_node=_only_node)
"""``--backend sim``."""
DRIVER = Backend(_driver)
"""``--backend simdriver``."""
