"""Driver-enforced memory limits as the engine decides them: the hard limits
of the Cap step and the soft limits at each pod's share (``softLimits:
Share``), written on the pod in ``vramguard.io/memory-limits``
(``vramguard_api.memlimits``), which its node agent applies through NVML's
per-cgroup memory limits and reports on in ``NodeGPUUsage``.

What a pod should hold is derived at every evaluation, never remembered
elsewhere (so a restart of the operator neither loses nor duplicates a limit):

- **hard** (Cap): each violation that reached its Cap step for real holds the
  pod at a *level* per device (``cap_levels``: the step's ``hardLimit``, else
  the violated limit). The hard limit written is the level, or the pod's use
  on that device when higher, rounded up to ``GRANULE`` — and it only ever
  follows that use down (``hard_limit``): a driver on Linux's ``dmem``
  controller does not apply a hard limit below the cgroup's current use (the
  agent would report ``NotHeld``), while a limit at the current use stops the
  pod's growth at once and still binds. Several violations on one device: the
  lowest level.
- **soft** (guarantees): a pod's share on a device (``shares``): its budget's
  per-device limit there (a DRA claim's or a sharer's grant, the policy's
  default share, or ``perDevice``), else ``perPod.vram`` for a pod on one
  device. Several budgets: the lowest. Never above the hard limit.

Limits are written only for GPUs (MIG devices cannot hold them) that do not
report memory limits unsupported, on nodes whose agent does not say it leaves
them alone (``enforceCaps: false``). On unknown data — the pod's report stale
or missing, its use unknown, the pod not running — the annotation is kept as
it is. Nothing here is worded for people (``messages``) or decides a step
(``steps``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vramguard_api.budget import GPUMemoryBudgetSpec
from vramguard_api.limits import DeviceLimit
from vramguard_api.memlimits import (
    MAX_LIMIT_BYTES,
    MIN_HARD_LIMIT_BYTES,
    DeviceMemoryLimit,
    MemoryLimitsError,
    format_memory_limits,
    is_gpu_uuid,
    memory_limits_of,
)
from vramguard_api.usage import PodMemoryLimit
from vramguard_operator.engine.inputs import PodFacts
from vramguard_operator.engine.keys import ANNOTATION_MEMORY_LIMITS
from vramguard_operator.engine.measure import BudgetLimits, Measure, Node, PodData

GRANULE = MIN_HARD_LIMIT_BYTES
"""Hard limits are whole multiples of 256 MiB above the level: the annotation
(and the driver's limit) changes only when the pod's use moves by that much."""
_VRAM_KINDS = frozenset({"PodVRAM", "DeviceVRAM", "TotalVRAM", "Leak"})


@dataclass(frozen=True, slots=True)
class LimitsWant:
    """What one or more budgets want of one pod's memory limits: the level of
    the hard limit and the soft limit per device (bytes by UUID), or ``hold``:
    the data cannot tell, keep the annotation as it is."""

    hard: Mapping[str, int] = field(default_factory=dict)
    soft: Mapping[str, int] = field(default_factory=dict)
    hold: bool = False

    def merged(self, other: LimitsWant) -> LimitsWant:
        """Both wants: the lowest level and share per device; hold if either holds."""
        return LimitsWant(_lowest(self.hard, other.hard), _lowest(self.soft, other.soft), self.hold or other.hold)


HOLD = LimitsWant(hold=True)


def _lowest(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for uuid, value in b.items():
        out[uuid] = min(value, out.get(uuid, value))
    return out


# --- the Cap step's levels -------------------------------------------------------------


def cap_levels(
    m: Measure, d: PodData, hard_limit: DeviceLimit | None, held: Mapping[str, int] | None = None
) -> dict[str, int] | None:
    """The level of the hard limit per device of pod ``d`` for violation ``m``
    (bytes by UUID; the devices where ``d`` holds memory); None when ``d``'s use
    is unknown. Empty for a RAM violation (the driver limits GPU memory only).

    With the step's ``hard_limit``: that, on each device (a fraction of an
    unknown usable memory falls back to the default). Default: DeviceVRAM, the
    device's limit; PodVRAM, the pod's limit split over its devices by their
    use; TotalVRAM (``d`` the pod chosen for the step), the pod's use less the
    total's excess, split the same way; Leak, the hard limit the pod holds
    (``held``: bytes by UUID, from its annotation), else its use: the leak
    stops growing where it was when the step fired."""
    kind = m.key.kind
    if kind not in _VRAM_KINDS:
        return {}
    if d.state != "Fresh" or d.vram is None or any(used is None for _, used, _ in d.devices):
        return None
    on = [(u, used or 0, usable) for u, used, usable in d.devices if (used or 0) > 0 or u == m.key.device]
    if kind == "DeviceVRAM":
        on = [h for h in on if h[0] == m.key.device]
    default = _default_levels(m, d, on, held or {})
    if hard_limit is None:
        return default
    return {u: hard_limit.bytes_for(usable) or default[u] for u, _, usable in on}


def _default_levels(
    m: Measure, d: PodData, on: list[tuple[str, int, int | None]], held: Mapping[str, int]
) -> dict[str, int]:
    kind = m.key.kind
    if kind == "DeviceVRAM":
        return {u: m.limit for u, _, _ in on}
    if kind == "Leak":
        return {u: held.get(u, used) for u, used, _ in on}
    own = m.limit if kind == "PodVRAM" else max(0, (d.vram or 0) - max(0, (m.observed or 0) - m.limit))
    total = sum(used for _, used, _ in on) or 1
    return {u: own * used // total for u, used, _ in on}


def refusal(uuid: str, node: Node | None) -> str | None:
    """Why no memory limit can be written for device ``uuid`` on ``node``; None when one can."""
    if not is_gpu_uuid(uuid):
        return f"{uuid} is no GPU UUID: a MIG device (which cannot hold memory limits) or unknown"
    if node is None:
        return None
    if node.enforce_caps is False:
        return "the node agent does not apply memory limits (enforceCaps off)"
    why = node.limits_unsupported.get(uuid)
    return None if why is None else f"{uuid} does not support per-cgroup memory limits ({why})"


def writable(levels: Mapping[str, int], node: Node | None) -> tuple[dict[str, int], list[str]]:
    """``levels`` split into those that can be written and why the others cannot."""
    ok: dict[str, int] = {}
    refused: list[str] = []
    for uuid, level in sorted(levels.items()):
        why = refusal(uuid, node)
        if why is None:
            ok[uuid] = level
        else:
            refused.append(why)
    return ok, refused


def hard_limit(level: int, used: int | None, current: int | None) -> int:
    """The hard limit to hold (bytes): ``level``, or the pod's ``used`` bytes when
    higher, rounded up to ``GRANULE``, never above the ``current`` hard limit
    (it only follows the use down), within the annotation's bounds."""
    up = -(-(used or 0) // GRANULE) * GRANULE
    start = up if current is None else min(current, up)
    return min(MAX_LIMIT_BYTES, max(MIN_HARD_LIMIT_BYTES, level, start))


# --- guarantees: soft limits at the share -------------------------------------------------


def soft_limits_asked(spec: GPUMemoryBudgetSpec, policy_soft: bool) -> bool:
    """Whether a budget asks for soft limits at the shares: its
    ``enforcement.softLimits`` is ``Share``, or unset while the policy asks
    for them (``policy_soft``: ``EffectivePolicy.soft_limits``)."""
    own = spec.enforcement.soft_limits
    return own == "Share" or (own is None and policy_soft)


def shares(d: PodData, lim: BudgetLimits) -> dict[str, int]:
    """Pod ``d``'s share per device it uses (bytes by UUID): the budget's limit on
    that device, else its per-pod VRAM limit for a pod on one device."""
    out: dict[str, int] = {}
    for uuid, _, usable in d.devices:
        share = lim.device_limit(uuid, usable)
        if share is None and lim.pod_vram is not None and len(d.devices) == 1:
            share = lim.pod_vram
        if share is not None:
            out[uuid] = share
    return out


# --- the annotation -------------------------------------------------------------------------


def held_hard(pod: PodFacts) -> dict[str, int]:
    """The hard limits the pod's annotation holds, bytes by UUID (none when it does not parse)."""
    current, _ = current_limits(pod)
    return {u: lim.hard_limit for u, lim in current.items() if lim.hard_limit is not None}


def current_limits(pod: PodFacts) -> tuple[dict[str, DeviceMemoryLimit], str | None]:
    """The limits in the pod's annotation, and a problem when it does not parse
    (then read as none, and rewritten)."""
    try:
        return memory_limits_of(pod.annotations) or {}, None
    except MemoryLimitsError as err:
        return {}, f"pod {pod.namespace}/{pod.name}: {err}"


def desired_limits(
    current: Mapping[str, DeviceMemoryLimit], want: LimitsWant, d: PodData | None, node: Node | None
) -> dict[str, DeviceMemoryLimit]:
    """The limits pod ``d`` should hold (see the module doc), from the current
    annotation and what the budgets want (not held)."""
    used = {u: v for u, v, _ in d.devices} if d is not None else {}
    out: dict[str, DeviceMemoryLimit] = {}
    for uuid in sorted({*want.hard, *want.soft}):
        if refusal(uuid, node) is not None:
            continue
        hard = None
        if uuid in want.hard:
            old = current.get(uuid)
            hard = hard_limit(want.hard[uuid], used.get(uuid), old.hard_limit if old else None)
        soft = min(want.soft.get(uuid, 0), MAX_LIMIT_BYTES if hard is None else hard)
        if hard is not None or soft:
            out[uuid] = DeviceMemoryLimit(soft_limit=soft, hard_limit=hard)
    return out


def annotation(limits: Mapping[str, DeviceMemoryLimit]) -> str | None:
    """The annotation's value (None: remove it). Raises ``MemoryLimitsError``
    when a bound is broken (``format_memory_limits``)."""
    return format_memory_limits(limits) if limits else None


def reported(pod: PodFacts, node: Node | None) -> dict[str, PodMemoryLimit]:
    """What the pod's node agent reports of its memory limits, by device."""
    usage = node.by_uid.get(pod.uid) if node is not None else None
    return {e.uuid: e for e in (usage.memory_limits or ())} if usage is not None else {}


def not_held(limits: Mapping[str, DeviceMemoryLimit], pod: PodFacts, node: Node | None) -> tuple[str, ...]:
    """The devices with a hard limit that the agent reports it could not apply
    (Failed, Unsupported or Disabled; Pending is on its way)."""
    entries = reported(pod, node)
    return tuple(
        u
        for u, lim in sorted(limits.items())
        if lim.hard_limit is not None and u in entries and entries[u].state in ("Failed", "Unsupported", "Disabled")
    )


def pods_with_limits(pods: Iterable[PodFacts]) -> list[PodFacts]:
    """The pods whose annotations carry memory limits."""
    return [p for p in pods if ANNOTATION_MEMORY_LIMITS in p.annotations]
