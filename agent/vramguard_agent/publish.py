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
  changed). Trend features and sample times alone never trigger a write.

With the defaults a node whose usage is steady writes once per 30 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramguard_api.usage import NodeGPUUsageStatus

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


def decide(
    last: NodeGPUUsageStatus | None,
    last_time_s: float | None,
    current: NodeGPUUsageStatus,
    now_s: float,
    policy: PublishPolicy = PublishPolicy(),
) -> Decision:
    """Decide whether ``current`` is written, given the last written report and its time."""
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


def significant_change(old: NodeGPUUsageStatus, new: NodeGPUUsageStatus, policy: PublishPolicy) -> str | None:
    """A description of the first change beyond the dead-band, or None."""
    old_shape, new_shape = shape(old), shape(new)
    if old_shape != new_shape:
        return "shape changed"
    old_values, new_values = amounts(old), amounts(new)
    for key, before in old_values.items():
        after = new_values[key]
        if before is not None and after is not None and _beyond(before, after, policy):
            return f"{'/'.join(key)} moved from {before} to {after} bytes"
    return None


def _beyond(before: int, after: int, policy: PublishPolicy) -> bool:
    band = max(policy.deadband_bytes, policy.deadband_fraction * max(before, after))
    return abs(after - before) > band


def shape(status: NodeGPUUsageStatus) -> tuple[Any, ...]:
    """Everything compared exactly: what exists, known-ness, health, counts, conditions."""
    return (
        tuple(
            (d.uuid, d.health, d.processes_complete, d.memory is None, d.process_bytes is None) for d in status.devices
        ),
        tuple(
            (
                p.uid,
                p.name,
                p.attribution,
                p.oom_kills,
                p.vram_bytes is None,
                p.ram_working_set_bytes is None,
                tuple((d.uuid, d.used_bytes is None) for d in p.devices),
                tuple(
                    (
                        c.container_id,
                        c.name,
                        c.oom_kills,
                        c.vram_bytes is None,
                        c.ram_working_set_bytes is None,
                    )
                    for c in p.containers
                ),
            )
            for p in status.pods
        ),
        tuple((u.pid, u.device) for u in status.unattributed),
        tuple((c.type, c.status, c.reason) for c in status.conditions or []),
        status.truncated,
    )


def amounts(status: NodeGPUUsageStatus) -> dict[tuple[str, ...], int | None]:
    """Every figure compared with the dead-band, keyed by where it is."""
    values: dict[tuple[str, ...], int | None] = {}
    for d in status.devices:
        values[("device", d.uuid, "used")] = d.memory.used_bytes if d.memory else None
    for p in status.pods:
        values[("pod", p.uid, "vram")] = p.vram_bytes
        values[("pod", p.uid, "ram")] = p.ram_working_set_bytes
        for du in p.devices:
            values[("pod", p.uid, du.uuid)] = du.used_bytes
        for c in p.containers:
            values[("pod", p.uid, c.container_id, "vram")] = c.vram_bytes
            values[("pod", p.uid, c.container_id, "ram")] = c.ram_working_set_bytes
    return values
