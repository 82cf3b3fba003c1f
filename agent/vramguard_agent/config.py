"""The settings of one agent (``AgentConfig``), which the command line fills
(``settings``) and the run loop (``agent``) and the backends (``backends``) read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vramguard_api.history import DEFAULT_MAX_POINTS, DEFAULT_TREND_INTERVAL_S, DEFAULT_WINDOW_S

from .memory import DEFAULT_REFRESH_S
from .publish import PublishPolicy

DEFAULT_SAMPLE_INTERVAL_S = 10.0
DEFAULT_METRICS_ADDRESS = ":9402"


@dataclass(slots=True)
class AgentConfig:
    """Settings of one agent (the CLI fills them from flags and the environment).

    ``backend`` names an entry point of ``backends.GROUP`` (``nvml``; ``sim`` and
    ``simdriver`` with vramguard-sim). ``scenario``, ``sim_*`` and ``simgpu_socket``
    are read by the simulated backends only. Durations are seconds.
    """

    node_name: str
    backend: str = "nvml"
    scenario: Path | None = None
    proc_root: Path | None = None
    cgroup_root: Path | None = None
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S
    policy: PublishPolicy = field(default_factory=PublishPolicy)
    history_window_s: float = DEFAULT_WINDOW_S
    history_points: int = DEFAULT_MAX_POINTS
    trend_interval_s: float = DEFAULT_TREND_INTERVAL_S
    ram_interval_s: float = DEFAULT_REFRESH_S
    metrics_address: str | None = DEFAULT_METRICS_ADDRESS
    kubeconfig: str | None = None
    sim_offset_s: float = 0.0
    sim_speed: float = 1.0
    sim_driver_state: Path | None = None
    enforce_caps: bool = False
    pod_uid: str | None = None
    simgpu_socket: Path | None = None
