"""Pure decisions about pods' driver-enforced memory limits (``caps`` does the NVML calls).

``wanted_limits`` reads what pods' ``vramguard.io/memory-limits`` annotations
want, ``decide`` says which limits to set or clear so that the driver holds
exactly that, and ``LimitEntry``/``PodLimits`` are what the report shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vramguard_api import memlimits as ML
from vramguard_api.units import MAX_BYTES
from vramguard_api.usage import MemoryLimitState, PodMemoryLimit

from .gpu import MemoryLimitsSupport
from .nvml_limits import HeldLimits
from .pods import PodMeta

Key = tuple[str, str]  # (pod cgroup uid, device UUID)


@dataclass(frozen=True, slots=True)
class LimitEntry:
    """A pod's limits on one device for the report (``PodMemoryLimit`` in the API, whose
    attribute names it shares: the metrics read either)."""

    uuid: str
    state: MemoryLimitState
    reason: str
    message: str | None = None
    held: HeldLimits | None = None

    @property
    def hard_limit_bytes(self) -> int | None:
        """The hard limit the driver holds, bytes; None for none (NVML's MAX, or any
        value above the API's 2^53: no device has that much) or unknown."""
        return _bytes(self.held.hard) if self.held is not None else None

    @property
    def soft_limit_bytes(self) -> int | None:
        """The soft limit the driver holds, bytes; None for none (0, or above 2^53) or unknown."""
        return (_bytes(self.held.soft) or None) if self.held is not None else None

    @property
    def current_used_bytes(self) -> int | None:
        """The cgroup's memory on the device as the driver counts it, bytes (None above 2^53)."""
        return _bytes(self.held.current_used) if self.held is not None else None

    def to_api(self) -> PodMemoryLimit:
        """The API model (the properties above have its attribute names)."""
        return PodMemoryLimit(
            uuid=self.uuid,
            state=self.state,
            reason=self.reason,
            message=self.message[:1024] if self.message else None,
            hardLimitBytes=self.hard_limit_bytes,
            softLimitBytes=self.soft_limit_bytes,
            currentUsedBytes=self.current_used_bytes,
        )


@dataclass(slots=True)
class PodLimits:
    """A pod's entries, and why its annotation was refused (nothing of it applied)."""

    entries: list[LimitEntry] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One NVML change: ``set`` ``wanted`` on, or ``clear``, a pod's cgroup on a device."""

    action: str  # "set" or "clear"
    key: Key
    wanted: ML.DeviceMemoryLimit | None = None


def decide(
    wanted: Mapping[Key, ML.DeviceMemoryLimit],
    held: Mapping[Key, HeldLimits],
    supported: Iterable[str],
    cgroups: Mapping[str, str],
    unknown: Iterable[str] = (),
) -> list[Step]:
    """The changes that make the driver hold what is wanted, in key order.

    ``supported`` are the UUIDs of devices that hold limits; ``cgroups`` maps a
    pod's cgroup uid to its nameSpace (absent: no cgroup on the node);
    ``unknown`` are pods whose wants are unknown (their annotation was refused).
    A wanted limit not held is set; a held limit not wanted is cleared; nothing
    happens on an unsupported device, for a pod without a cgroup, or for a pod
    whose wants are unknown (what the driver holds for it stays).
    """
    ok, frozen = set(supported), set(unknown)
    steps: list[Step] = []
    for key in sorted(wanted.keys() | held.keys()):
        uid, uuid = key
        if uuid not in ok or uid not in cgroups or uid in frozen:
            continue
        want, have = wanted.get(key), held.get(key)
        if want is not None and (have is None or not have.holds(want)):
            steps.append(Step("set", key, want))
        elif want is None and have is not None and not have.is_clear:
            steps.append(Step("clear", key))
    return steps


@dataclass(frozen=True, slots=True)
class Facts:
    """What is known of one pod's limits on one device, to report them.

    ``problem`` is the (reason, message) of the last failed call; ``refused``
    says the pod's annotation was refused (its wants are unknown).
    """

    want: ML.DeviceMemoryLimit | None
    held: HeldLimits | None
    support: MemoryLimitsSupport | None
    device: bool
    cgroup: bool
    problem: tuple[str, str] | None = None
    refused: bool = False


def entry(uuid: str, f: Facts) -> LimitEntry:
    """The report's entry for one pod and device: state and reason, first match wins."""
    if not f.device:
        return LimitEntry(uuid, "Pending", ML.REASON_DEVICE_NOT_FOUND, f"no healthy GPU {uuid} on this node")
    if f.support is None or not f.support.supported:
        why = f"{f.support.reason}: {f.support.message}" if f.support else "not probed yet"
        return LimitEntry(uuid, "Unsupported", ML.REASON_DEVICE_UNSUPPORTED, why)
    if not f.cgroup:
        return LimitEntry(uuid, "Pending", ML.REASON_CGROUP_NOT_FOUND, "the pod's cgroup is not on this node (yet)")
    if f.want is not None and f.held is not None and f.held.holds(f.want):
        return LimitEntry(uuid, "Applied", ML.REASON_APPLIED, describe(f.want), f.held)
    if f.refused:
        message = "the pod's annotation was refused: the limits the driver holds are kept"
        return LimitEntry(uuid, "Pending", ML.REASON_ANNOTATION_REFUSED, message, f.held)
    if f.problem is not None:
        return LimitEntry(uuid, "Failed", f.problem[0], f.problem[1], f.held)
    if f.want is None:
        return LimitEntry(uuid, "Pending", ML.REASON_CLEARING, "no longer wanted: being cleared", f.held)
    return LimitEntry(uuid, "Pending", ML.REASON_TO_APPLY, f"to apply: {describe(f.want)}", f.held)


def wanted_limits(metas: Mapping[str, PodMeta]) -> tuple[dict[Key, ML.DeviceMemoryLimit], dict[str, str]]:
    """Wanted limits by (pod cgroup uid, device), and each refused annotation's error."""
    wanted: dict[Key, ML.DeviceMemoryLimit] = {}
    errors: dict[str, str] = {}
    for uid, meta in metas.items():
        if meta.memory_limits is None:
            continue
        try:
            parsed = ML.parse_memory_limits(meta.memory_limits)
        except ML.MemoryLimitsError as err:
            errors[uid] = str(err)[:1024]
            continue
        wanted.update({(uid, uuid): limit for uuid, limit in parsed.items()})
    return wanted, errors


def _bytes(value: int | None) -> int | None:
    """A byte count the report can hold (0..2^53, docs/bounds.md); None beyond it."""
    return value if value is not None and 0 <= value <= MAX_BYTES else None


def uids(keys: Iterable[Key]) -> set[str]:
    return {uid for uid, _ in keys}


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.2f}Gi"


def describe(want: ML.DeviceMemoryLimit) -> str:
    parts = [f"hard {_gib(want.hard_limit)}"] if want.hard_limit is not None else []
    return ", ".join([*parts, *([f"soft {_gib(want.soft_limit)}"] if want.soft_limit else [])])


def not_held(want: ML.DeviceMemoryLimit, held: HeldLimits) -> str:
    hard = "none" if held.hard == ML.NVML_DEVICE_MEMORY_LIMIT_MAX else _gib(held.hard)
    text = f"set {describe(want)}, but the driver holds hard {hard}, soft {_gib(held.soft)}"
    if want.hard_limit is not None and held.current_used is not None and want.hard_limit < held.current_used:
        # Linux's dmem controller refuses a max below current use (page_counter_set_max: EBUSY).
        text += f"; the pod uses {_gib(held.current_used)}, above the hard limit: retried until its use falls below"
    return text
