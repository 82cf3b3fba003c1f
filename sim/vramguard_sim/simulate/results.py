"""The figures of a run and of a comparison (vramguard off, on, and on with
driver-enforced memory limits: "with caps"), as text and JSON.

- ``innocent_ooms``: OOM kills of pods that stayed within their share: what
  the killed process held plus the allocation that failed was at most its
  share of the device (usable / replicas, or the MIG device). The mission's
  number: vramguard exists to bring it to zero.
- ``over_share_ooms``: OOM kills of pods that asked for more than their share.
- ``actions_within_limits``: Annotate, Throttle or Evict decisions on a pod
  whose measured value (the simulation's own, not the engine's) was within
  the limit the decision names. Must be 0.
- ``evictions``: evictions the Eviction API accepted (after the rate limit and
  PodDisruptionBudgets); ``evictions_blocked`` / ``_rate_limited``: refused;
  ``pressure_evictions``: those of them for device pressure.
- ``gpu_memory_in_use``: device memory used (processes and overhead),
  averaged over the run, in bytes and as a fraction of the fleet's usable memory.
- ``jobs_completed`` / ``jobs_failed``: Jobs that finished their work / that
  exhausted their ``backoffLimit``.
- ``hard_limit_ooms`` / ``soft_limit_evictions`` (with caps): OOM kills by a
  pod's own hard limit, and pods the driver evicted above their soft limit
  to make room for another's allocation (both counted in the OOM kills above).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from vramguard_api.steps import ACTIONS
from vramguard_api.units import format_bytes


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One run's figures (module doc). ``vramguard``: whether it ran."""

    vramguard: bool
    innocent_ooms: int
    over_share_ooms: int
    innocent_ooms_by_kind: Mapping[str, int]
    actions_within_limits: int
    evictions: int
    evictions_blocked: int
    evictions_rate_limited: int
    pressure_evictions: int
    actions: Mapping[str, int]
    dry_run_steps: int
    gpu_memory_in_use_bytes: float
    gpu_memory_in_use_fraction: float
    jobs_completed: int
    jobs_failed: int
    container_restarts: int
    engine_evaluations: int
    pods_evaluated: int
    wall_seconds: float
    cpu_seconds: float
    within_limits_examples: tuple[str, ...] = ()
    hard_limit_ooms: int = 0
    soft_limit_evictions: int = 0

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form (plain types)."""
        out = asdict(self)
        out["innocent_ooms_by_kind"] = dict(self.innocent_ooms_by_kind)
        out["actions"] = dict(self.actions)
        out["within_limits_examples"] = list(self.within_limits_examples)
        out["wall_seconds"] = round(self.wall_seconds, 3)
        out["cpu_seconds"] = round(self.cpu_seconds, 3)
        out["gpu_memory_in_use_bytes"] = int(self.gpu_memory_in_use_bytes)
        out["gpu_memory_in_use_fraction"] = round(self.gpu_memory_in_use_fraction, 6)
        return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """The same seed with vramguard off, on, and (``caps``, None when not run)
    on with driver-enforced memory limits; and what was simulated."""

    setup: Mapping[str, Any]
    off: RunFigures
    on: RunFigures
    notes: tuple[str, ...] = field(default=())
    caps: RunFigures | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: ``setup``, ``off``, ``on`` and ``caps`` (when run)."""
        out = {"setup": dict(self.setup), "off": self.off.to_json(), "on": self.on.to_json()}
        if self.caps is not None:
            out["caps"] = self.caps.to_json()
        return out


def _change(off: float, on: float) -> str:
    if off == on:
        return "="
    if off == 0:
        return "new"
    return f"{(on - off) / off * 100:+.0f}%"


def _rows(off: RunFigures, on: RunFigures) -> list[tuple[str, str, str, str]]:
    """The table's rows for one run beside ``off``: label, off, the run, change."""
    return [
        ("innocent OOM kills (within share)", str(off.innocent_ooms), str(on.innocent_ooms),
         _change(off.innocent_ooms, on.innocent_ooms)),
        ("OOM kills above share", str(off.over_share_ooms), str(on.over_share_ooms),
         _change(off.over_share_ooms, on.over_share_ooms)),
        ("  by a hard limit / evicted above a soft limit", "-",
         f"{on.hard_limit_ooms} / {on.soft_limit_evictions}", ""),
        ("actions on pods within all limits", "-", str(on.actions_within_limits), "must be 0"),
        ("evictions", "-", str(on.evictions), ""),
        ("  for device pressure", "-", str(on.pressure_evictions), ""),
        ("  blocked by a PDB / rate-limited", "-", f"{on.evictions_blocked} / {on.evictions_rate_limited}", ""),
        ("annotate / throttle / cap / evict decisions", "-",
         " / ".join(str(on.actions.get(a, 0)) for a in ACTIONS), ""),
        ("GPU memory in use (time average)",
         f"{format_bytes(off.gpu_memory_in_use_bytes)} {off.gpu_memory_in_use_fraction:.1%}",
         f"{format_bytes(on.gpu_memory_in_use_bytes)} {on.gpu_memory_in_use_fraction:.1%}",
         _change(off.gpu_memory_in_use_bytes, on.gpu_memory_in_use_bytes)),
        ("jobs completed", str(off.jobs_completed), str(on.jobs_completed),
         _change(off.jobs_completed, on.jobs_completed)),
        ("jobs failed (backoffLimit)", str(off.jobs_failed), str(on.jobs_failed), ""),
        ("container restarts", str(off.container_restarts), str(on.container_restarts), ""),
        ("engine evaluations / pods evaluated", "-", f"{on.engine_evaluations} / {on.pods_evaluated}", ""),
        ("wall time (CPU time)", f"{off.wall_seconds:.1f}s ({off.cpu_seconds:.1f}s)",
         f"{on.wall_seconds:.1f}s ({on.cpu_seconds:.1f}s)", ""),
    ]


def render(c: Comparison) -> str:
    """The comparison as a table (what ``vramguard simulate`` prints): off, on
    and the change, then with caps and its change against off."""
    s = c.setup
    lines = [
        f"vramguard simulate: seed {s['seed']}, {s['hours']:g}h, nodes {s['nodes']} "
        f"({s['gpu_replicas']} GPU replicas), load {s['load']:g}, tick {s['tick_s']:g}s",
        f"mix: {', '.join(f'{k}={v:.2f}' for k, v in s['mix'].items())}; policy: {s['policy']}",
        "",
    ]
    off, on = c.off, c.on
    rows: list[tuple[str, ...]] = [("", "vramguard off", "vramguard on", "change")]
    rows += _rows(off, on)
    if c.caps is not None:
        rows[0] += ("on, with caps", "change")
        rows[1:] = [r + cap[2:] for r, cap in zip(rows[1:], _rows(off, c.caps), strict=True)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(r, widths, strict=True))).rstrip())
    runs = [off, on] if c.caps is None else [off, on, c.caps]
    kinds = sorted({k for r in runs for k in r.innocent_ooms_by_kind})
    by_kind = ", ".join(f"{k} {'/'.join(str(r.innocent_ooms_by_kind.get(k, 0)) for r in runs)}" for k in kinds)
    if by_kind:
        lines.append(f"innocent OOM kills by workload kind ({'/'.join(['off', 'on', 'caps'][:len(runs)])}): {by_kind}")
    lines.extend(on.within_limits_examples)
    if c.caps is not None:
        lines.extend(c.caps.within_limits_examples)
    lines.extend(c.notes)
    return "\n".join(lines) + "\n"
