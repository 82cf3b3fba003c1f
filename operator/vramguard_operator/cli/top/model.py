"""What ``vramguard top`` shows, as data: the snapshot it reads and the rows,
limits and device figures it builds (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

DEFAULT_FRESHNESS_S = 60.0

# States, most severe first; a pod shows the first that holds.
STATES = ("leak", "capped", "throttled", "violating", "warning", "ok")
_SEVERITY = {s: len(STATES) - i for i, s in enumerate(STATES)}
# Limit paths of a budget's spec and status.limitSources, and their short names in the table.
LIMIT_NAMES = {
    "perDevice": "dev",
    "perPod.vram": "pod",
    "perPod.ram": "ram",
    "total.vram": "total",
    "total.ram": "total-ram",
}


@dataclass(frozen=True)
class Snapshot:
    """What ``build_rows`` needs, in API form (JSON-like dicts, camelCase keys).

    ``namespace_labels``: labels by namespace name (policies select namespaces by
    them); ``now``: timezone-aware, for report freshness; ``notes``: what could
    not be read (shown under the table)."""

    pods: Sequence[Mapping[str, Any]]
    budgets: Sequence[Mapping[str, Any]] = ()
    policies: Sequence[Mapping[str, Any]] = ()
    reports: Sequence[Mapping[str, Any]] = ()
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    freshness_s: float = DEFAULT_FRESHNESS_S
    notes: Sequence[str] = ()


@dataclass(frozen=True)
class DeviceFigure:
    """A pod's VRAM on one device. ``label``: ``gpu<index>``, ``gpu<index>/<MIG
    profile>`` for a MIG device; bytes None when unknown."""

    label: str
    uuid: str
    used_bytes: int | None


@dataclass(frozen=True)
class Limit:
    """One effective limit of a pod: ``name`` (``dev``, ``pod``, ``ram``,
    ``total``, ``total-ram``), the limit and the usage it is compared with
    (bytes; for ``dev`` on the device where the ratio is highest, for totals the
    sum over the budget's selected pods), and its source."""

    name: str
    limit_bytes: int
    used_bytes: int | None
    source: str

    @property
    def ratio(self) -> float | None:
        """used / limit, None when the usage is unknown or the limit is 0."""
        if self.used_bytes is None or self.limit_bytes <= 0:
            return None
        return self.used_bytes / self.limit_bytes


@dataclass(frozen=True)
class CapFigure:
    """A pod's driver-enforced memory limits on one device (bytes, None: none):
    ``state`` and ``reason`` as its node agent reports them (``Applied``,
    ``Pending``, ``Failed``, ``Unsupported``, ``Disabled``), ``Wanted`` while the
    annotation's limits are not reported yet."""

    label: str
    uuid: str
    hard_bytes: int | None
    soft_bytes: int | None
    state: str
    reason: str


@dataclass(frozen=True)
class Row:
    """One pod in the table. ``pressure``: the highest usage/limit ratio over its
    limits (None without a measured limit); ``growth_bytes_per_hour`` from the
    agent's trend features; ``why``: the violations and warnings behind
    ``state``; ``stale``: its node's report is older than the freshness bound
    (or missing); ``caps``: its driver-enforced memory limits per device."""

    namespace: str
    pod: str
    node: str | None
    vram_bytes: int | None
    devices: tuple[DeviceFigure, ...]
    ram_bytes: int | None
    limits: tuple[Limit, ...]
    growth_bytes_per_hour: float | None
    trend_leak: bool | None
    state: str
    why: tuple[str, ...]
    pressure: float | None
    stale: bool
    caps: tuple[CapFigure, ...] = ()
    last_oom: str | None = None  # the pod's latest OOM record: kind and age (vramguard oom has the verdict)
    diagnosis: str | None = None  # engine.diagnosis at the policy defaults; None: nothing known
    swap_bytes: int | None = None  # swap in use by the pod's cgroup
    ram_pressure: float | None = None  # the pod's memory PSI "some" avg10, percent (cgroup v2)

    @property
    def binding(self) -> Limit | None:
        """The limit with the highest usage ratio (else the first one)."""
        measured = [lim for lim in self.limits if lim.ratio is not None]
        if measured:
            return max(measured, key=lambda lim: lim.ratio or 0.0)
        return self.limits[0] if self.limits else None

    def sort_key(self) -> tuple[int, float, str, str]:
        """State first (leak, capped, throttled, violating, warning, ok), then pressure."""
        return (-_SEVERITY[self.state], -(self.pressure or 0.0), self.namespace, self.pod)

