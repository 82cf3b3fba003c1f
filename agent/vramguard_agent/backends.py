"""The GPU backends the agent samples with, found by name through entry points.

``--backend NAME`` names an entry point of the group ``vramguard.agent_backends``
(``importlib.metadata``, the Python packaging registry of plugins) whose object is
a ``Backend``: how to build the parts the agent samples with, and, optionally,
the node a configuration without ``--node`` means. The product registers
``nvml`` (nvidia-ml-py over the host's driver, below). The simulators are a
distribution of their own, vramguard-sim, which registers ``sim`` (a scenario's
node played through a fake NVML on a fake host) and ``simdriver`` (the local
cluster's real node: the same NVML calls, answered by its simulated driver);
the agent never imports them, and a name no installed distribution registers is
refused with the package to install (docs/agent.md, "Backends").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .config import AgentConfig
from .gpu import GPUBackend
from .pods import PodMeta

GROUP = "vramguard.agent_backends"
INSTALL_HINT = "the simulated backends (sim, simdriver) come with pip install 'vramguard[sim]' (a checkout: pip install ./sim)"

ApiPods = Callable[[], Mapping[str, PodMeta]]


class BackendNotInstalled(ValueError):
    """No installed distribution registers the backend asked for."""


@dataclass(slots=True)
class BackendParts:
    """What a backend hands the agent.

    ``gpu`` is sampled each tick; ``nvml`` is the ``pynvml`` module (or a stand-in)
    that the memory-limit calls go through; ``proc_root`` and ``cgroup_root`` are
    the host's trees the sampler reads; ``pods`` returns the node's pods by cgroup
    uid; ``container_names`` extra container id → name pairs; ``history_clock``
    the seconds histories are kept in (None: the wall clock); a change of
    ``cache_key()`` clears the pid attribution cache; ``cleanup`` runs at close.
    """

    gpu: GPUBackend
    nvml: Any
    proc_root: Path
    cgroup_root: Path
    pods: ApiPods
    container_names: Callable[[], Mapping[str, str]] = dict
    history_clock: Callable[[], float] | None = None
    cache_key: Callable[[], object] = lambda: None
    cleanup: list[Callable[[], None]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Backend:
    """One kind of backend. ``build(cfg, api_pods)`` assembles its parts
    (``api_pods``: the pods the API server shows, None without one; raises
    ``ValueError`` naming the flag for a configuration it cannot use);
    ``default_node(cfg)`` is the node meant when no ``--node`` is given, if any."""

    build: Callable[[AgentConfig, ApiPods | None], BackendParts]
    default_node: Callable[[AgentConfig], str | None] = lambda cfg: None


def installed() -> list[str]:
    """The names of every installed backend, sorted."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def load(name: str) -> Backend:
    """The backend registered as ``name``. Raises ``BackendNotInstalled`` (one line:
    the name, the installed ones, what to install) when none is."""
    for ep in entry_points(group=GROUP, name=name):
        backend = ep.load()
        if not isinstance(backend, Backend):
            raise TypeError(f"entry point {GROUP}:{name} ({ep.value}) is not a vramguard_agent.backends.Backend")
        return backend
    raise BackendNotInstalled(not_installed(name))


def not_installed(name: str) -> str:
    """The one-line refusal of a backend no installed distribution registers."""
    return f"backend {name!r} is not installed (installed: {', '.join(installed()) or 'none'}); {INSTALL_HINT}"


def host_roots(cfg: AgentConfig) -> tuple[Path, Path]:
    """The host's /proc and cgroup mount: the flags', else /proc and /sys/fs/cgroup.

    Raises ``ValueError`` (one line naming the flag) when a given one is no directory:
    checked here, not at parse time, because they are the pod's mounts."""
    for flag, given, want in (("--proc-root", cfg.proc_root, "/proc"), ("--cgroup-root", cfg.cgroup_root, "cgroup mount")):
        if given is not None and not given.is_dir():
            raise ValueError(f"{flag} {given}: no such directory (want the host's {want}, mounted into the agent)")
    return cfg.proc_root or Path("/proc"), cfg.cgroup_root or Path("/sys/fs/cgroup")


def _nvml(cfg: AgentConfig, api_pods: ApiPods | None) -> BackendParts:
    from .nvml import NVMLBackend

    if cfg.simgpu_socket is not None:
        raise ValueError("--simgpu-socket: the simulated driver is read by --backend simdriver, not nvml")
    gpu = NVMLBackend()
    proc_root, cgroup_root = host_roots(cfg)
    return BackendParts(gpu, gpu.library, proc_root, cgroup_root, api_pods or dict)


NVML = Backend(_nvml)
"""nvidia-ml-py over the host's driver: the product's backend."""
