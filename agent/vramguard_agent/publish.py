"""When to write the node's report: a pure dead-band and heartbeat decision.

A report is written
- at once when there is none yet;
- when ``heartbeat_s`` has passed since the last write (so readers can tell a
  live agent from a dead one by ``sampleTime``);
- otherwise at most every ``min_interval_s``, and only when something changed
  beyond the dead-band: a pod's or container's VRAM or RAM working set, or a
  device's used memory, moved by more than
  ``max(deadband_bytes, deadband_fraction * max(old, new))``, or the report's
  shape changed (pods, containers or devices came or went, an unknown value
  became known or the reverse, a health, completeness, attribution, OOM-kill
  count or condition status changed, the list of unattributed processes
  changed, a device's memory-limit support or a pod's memory limits — state,
  reason, the limits the driver holds — changed). Trend features and sample
  times alone never trigger a write.

With the defaults a node whose usage is steady writes once per 30 s.

The decision reads ``Digest``s of the plain ``report.NodeReport`` (or of the
API model, which has the same attribute names): taking one costs a fraction of
building the API model, which happens only for the reports written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramguard_api.usage import NodeGPUUsageStatus

from .report import NodeReport

MIB = 1024 * 1024
DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_MIN_INTERVAL_S = 5.0
DEFAULT_DEADBAND_BYTES = 64 * MIB
DEFAULT_DEADBAND_FRACTION = 0.02


@dataclass(frozen=True, slots=True)
class PublishPolicy:
    """Dead-band and heartbeat settings (seconds, bytes, a fraction in [0, 1))."""

    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    min_interval_s: float = DEFAULT_MIN_INTERVAL_S
    deadband_bytes: int = DEFAULT_DEADBAND_BYTES
    deadband_fraction: float = DEFAULT_DEADBAND_FRACTION

    def __post_init__(self) -> None:
        if self.heartbeat_s <= 0 or self.min_interval_s < 0 or self.min_interval_s > self.heartbeat_s:
            raise ValueError(
                "publish policy: need 0 <= min_interval_s <= heartbeat_s, got "
                f"{self.min_interval_s} and {self.heartbeat_s}"
            )
        if self.deadband_bytes < 0 or not 0 <= self.deadband_fraction < 1:
            raise ValueError(
                f"publish policy: deadband_bytes ({self.deadband_bytes}) must be >= 0 and "
                f"deadband_fraction ({self.deadband_fraction}) in [0, 1)"
            )


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether to write now, and why (for logs and metrics)."""

    write: bool
    reason: str


Report = NodeReport | NodeGPUUsageStatus
"""Either form of a node's report: they share attribute names."""


@dataclass(frozen=True, slots=True)
class Digest:
    """What the decision compares of a report: its ``shape`` (compared exactly)
    and its ``amounts`` (bytes, in an order fixed by the shape: equal shapes
    align them; compared with the dead-band). ``source`` names a moved amount."""

    shape: tuple[Any, ...]
    amounts: tuple[int | None, ...]
    source: Report


def digest(report: Report) -> Digest:
    """The digest of a report, in one pass (it is taken every sample).

    Shape: what exists (devices, pods, their devices and containers, unattributed
    processes), which values are known, health, completeness, names,
    attribution, OOM-kill counts, condition statuses, truncation, memory-limit
    support and pods' memory limits. Amounts: each
    device's used memory, each pod's and container's VRAM and RAM working set,
    each pod's VRAM per device."""
    shape: list[Any] = []
    amounts: list[int | None] = []
    for d in report.devices:
        shape.append(
            (d.uuid, d.health, d.processes_complete, d.memory is None, d.process_bytes is None, d.memory_limits_reason)
        )
        amounts.append(d.memory.used_bytes if d.memory else None)
    for p in report.pods:
        shape.append(
            (
                p.uid,
                p.name,
                p.attribution,
                p.oom_kills,
                p.vram_bytes is None,
                p.ram_working_set_bytes is None,
                len(p.devices),
                len(p.containers),
            )
        )
        amounts += (p.vram_bytes, p.ram_working_set_bytes)
        if p.memory_limits or p.memory_limits_error:
            limits = tuple(
                (e.uuid, e.state, e.reason, e.hard_limit_bytes, e.soft_limit_bytes) for e in p.memory_limits or []
            )
            shape.append((limits, p.memory_limits_error))
        for du in p.devices:
            shape.append((du.uuid, du.used_bytes is None))
            amounts.append(du.used_bytes)
        for c in p.containers:
            shape.append((c.container_id, c.name, c.oom_kills, c.vram_bytes is None, c.ram_working_set_bytes is None))
            amounts += (c.vram_bytes, c.ram_working_set_bytes)
    shape.append(tuple((u.pid, u.device) for u in report.unattributed))
    shape.append(tuple((c.type, c.status, c.reason) for c in report.conditions or []))
    shape.append(report.truncated)
    return Digest(tuple(shape), tuple(amounts), report)


def amount_names(report: Report) -> list[str]:
    """Where each of ``digest(report).amounts`` is, in the same order
    (``device/<uuid>/used``, ``pod/<uid>/vram``, ``pod/<uid>/<device uuid>``, ...)."""
    names = [f"device/{d.uuid}/used" for d in report.devices]
    for p in report.pods:
        names += (f"pod/{p.uid}/vram", f"pod/{p.uid}/ram")
        names += (f"pod/{p.uid}/{du.uuid}" for du in p.devices)
        for c in p.containers:
            names += (f"pod/{p.uid}/{c.container_id}/vram", f"pod/{p.uid}/{c.container_id}/ram")
    return names


def decide(
    last: Digest | None,
    last_time_s: float | None,
    current: Digest,
    now_s: float,
    policy: PublishPolicy = PublishPolicy(),
) -> Decision:
    """Decide whether the report digested in ``current`` is written, given the
    digest of the last written report and its time (seconds)."""
    if last is None or last_time_s is None:
        return Decision(True, "first report")
    elapsed = now_s - last_time_s
    if elapsed >= policy.heartbeat_s:
        return Decision(True, "heartbeat")
    if elapsed < policy.min_interval_s:
        return Decision(False, "minimum interval")
    change = significant_change(last, current, policy)
    if change is not None:
        return Decision(True, change)
    return Decision(False, "within dead-band")


def significant_change(old: Digest, new: Digest, policy: PublishPolicy) -> str | None:
    """A description of the first change beyond the dead-band, or None."""
    if old.shape != new.shape:
        return "shape changed"
    for i, (before, after) in enumerate(zip(old.amounts, new.amounts, strict=True)):
        if before is not None and after is not None and _beyond(before, after, policy):
            return f"{amount_names(new.source)[i]} moved from {before} to {after} bytes"
    return None


def _beyond(before: int, after: int, policy: PublishPolicy) -> bool:
    band = max(policy.deadband_bytes, policy.deadband_fraction * max(before, after))
    return abs(after - before) > band
