"""Evidence of a container's end -> what killed it, how sure, and whose fault.

One classifier for the agent's end records, the operator's Events and metrics,
the fleet simulation and ``vramguard analyze`` (``docs/oom.md``). Verdicts:

- ``GPUOutOfMemory``: a framework's out-of-memory message (``messages.py``) or,
  without a message, a non-zero exit while the device had less free memory
  than the process's recent allocation steps (confidence ``Low``);
- ``HostOutOfMemory``: the kubelet's ``OOMKilled`` reason, the cgroup's
  ``oom_kill`` counter rising, a kernel OOM-killer line, or a host-RAM message:
  RAM, not VRAM;
- ``CapKill``: the driver's per-cgroup hard memory limit refused the
  allocation, or a soft-limit eviction by the driver;
- ``NotMemory``: anything else (a normal exit included).

Blame, for ``GPUOutOfMemory`` and ``CapKill``: ``Innocent`` when the pod was
within its per-device limit and its share (what it held plus what it asked
for), with the neighbours above their shares named; ``Own`` when it was above
either; ``Unknown`` when no share is known.

Evidence rules are a table (``_RULES``): the first rule that returns a verdict wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from vramguard_api.oom.messages import Confidence, MessageMatch, match_message
from vramguard_api.units import format_bytes as _b

Kind = Literal["GPUOutOfMemory", "HostOutOfMemory", "CapKill", "NotMemory"]
Blame = Literal["Innocent", "Own", "Unknown"]
CapReason = Literal["HardLimit", "SoftLimit"]

KINDS: tuple[Kind, ...] = ("GPUOutOfMemory", "HostOutOfMemory", "CapKill", "NotMemory")
MEMORY_KINDS: frozenset[Kind] = frozenset({"GPUOutOfMemory", "HostOutOfMemory", "CapKill"})


@dataclass(frozen=True, slots=True)
class Neighbour:
    """Another pod on the same device: ``name`` (namespace/name or uid),
    ``held_bytes`` and ``share_bytes`` (None: no share known)."""

    name: str
    held_bytes: int
    share_bytes: int | None

    @property
    def over_bytes(self) -> int:
        """How far above its share (0 when within or unknown)."""
        return 0 if self.share_bytes is None else max(0, self.held_bytes - self.share_bytes)


@dataclass(frozen=True, slots=True)
class DeviceEvidence:
    """What the agent last saw on the pod's device: ``uuid``; ``free_bytes`` and
    ``usable_bytes`` of the device; ``held_bytes`` (the pod's), ``requested_bytes``
    (the failed allocation, when known), ``share_bytes`` and ``limit_bytes`` (the
    pod's per-device share and limit; None: unknown/unset), ``step_bytes`` (its
    largest recent allocation step), ``neighbours``."""

    uuid: str
    free_bytes: int | None = None
    usable_bytes: int | None = None
    held_bytes: int = 0
    requested_bytes: int | None = None
    share_bytes: int | None = None
    limit_bytes: int | None = None
    step_bytes: int | None = None
    neighbours: tuple[Neighbour, ...] = ()


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything known about one end. ``exit_code`` and ``reason`` are the
    kubelet's (``containerStatuses[].lastState.terminated``); ``message`` the
    termination message or last log lines; ``oom_kills_delta`` how much the
    container's cgroup ``oom_kill`` counter rose; ``kernel_oom`` a kernel
    OOM-killer line named the process; ``cap_reason`` the driver's cap acted;
    RAM figures in bytes."""

    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    oom_kills_delta: int = 0
    kernel_oom: bool = False
    cap_reason: CapReason | None = None
    ram_working_set_bytes: int | None = None
    ram_limit_bytes: int | None = None
    device: DeviceEvidence | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """``kind``, ``confidence``, ``blame`` (None for host/not-memory verdicts),
    ``neighbours_above_share`` (for an innocent GPU OOM), ``message`` (the row
    of ``MESSAGE_PATTERNS`` that matched, if any) and ``because`` (one line per
    piece of evidence used, for Events and ``vramguard analyze``)."""

    kind: Kind
    confidence: Confidence
    blame: Blame | None = None
    neighbours_above_share: tuple[Neighbour, ...] = ()
    message: MessageMatch | None = None
    because: tuple[str, ...] = field(default=())

    @property
    def innocent(self) -> bool:
        """A GPU OOM or cap kill of a pod within its share and limits."""
        return self.blame == "Innocent"


def classify(evidence: Evidence) -> Verdict:
    """The verdict for ``evidence`` (pure; never raises on missing fields)."""
    found = match_message(evidence.message)
    for rule in _RULES:
        verdict = rule(evidence, found)
        if verdict is not None:
            return verdict
    return Verdict("NotMemory", "Medium", message=found, because=(_exit_text(evidence),))


def _host(e: Evidence, found: MessageMatch | None) -> Verdict | None:
    because = []
    if e.reason == "OOMKilled":
        because.append("the kubelet says OOMKilled")
    if e.oom_kills_delta > 0:
        because.append(f"the cgroup's oom_kill counter rose by {e.oom_kills_delta}")
    if e.kernel_oom:
        because.append("the kernel's OOM killer named the process")
    if not because:
        return None
    if e.ram_limit_bytes is not None and e.ram_working_set_bytes is not None:
        because.append(f"RAM working set {_b(e.ram_working_set_bytes)} against a limit of {_b(e.ram_limit_bytes)}")
    because.append("host RAM, not VRAM")
    return Verdict("HostOutOfMemory", "High", message=found, because=tuple(because))


def _cap(e: Evidence, found: MessageMatch | None) -> Verdict | None:
    if e.cap_reason is None:
        return None
    why = "the driver's hard memory limit refused an allocation" if e.cap_reason == "HardLimit" else (
        "the driver evicted it above its soft memory limit")
    return _blamed("CapKill", "High", e, found, (why,))


def _message(e: Evidence, found: MessageMatch | None) -> Verdict | None:
    if found is None:
        return None
    row = found.pattern
    said = f"{row.framework} said {found.text!r}"
    if row.memory == "HostRAM":
        return Verdict("HostOutOfMemory", row.confidence, message=found, because=(said, "host RAM, not VRAM"))
    if row.memory == "OnChip":
        return Verdict("NotMemory", row.confidence, message=found, because=(said, "on-chip memory, not VRAM"))
    return _blamed("GPUOutOfMemory", row.confidence, e, found, (said,))


def _device_full(e: Evidence, found: MessageMatch | None) -> Verdict | None:
    d = e.device
    if not e.exit_code or d is None or d.free_bytes is None or not d.step_bytes or d.free_bytes >= d.step_bytes:
        return None
    why = f"exit code {e.exit_code} with {_b(d.free_bytes)} free, less than its recent step of {_b(d.step_bytes)}"
    return _blamed("GPUOutOfMemory", "Low", e, found, (why,))


_Rule = Callable[[Evidence, "MessageMatch | None"], "Verdict | None"]
# Order matters: the kernel's kill is certain; a cap's verdict names the limit;
# a message names the memory; a full device without a message is a guess.
_RULES: tuple[_Rule, ...] = (_host, _cap, _message, _device_full)


def _blamed(kind: Kind, confidence: Confidence, e: Evidence, found: MessageMatch | None,
            because: tuple[str, ...]) -> Verdict:
    d = e.device
    if d is None or (d.share_bytes is None and d.limit_bytes is None):
        return Verdict(kind, confidence, "Unknown", message=found, because=(*because, "no share known"))
    wanted = d.held_bytes + (d.requested_bytes or (found.requested_bytes if found else None) or 0)
    bounds = [(n, b) for n, b in (("share", d.share_bytes), ("limit", d.limit_bytes)) if b is not None]
    over = [f"it wanted {_b(wanted)}, above its {n} of {_b(b)}" for n, b in bounds if wanted > b]
    if over:
        return Verdict(kind, confidence, "Own", message=found, because=(*because, *over))
    above = tuple(sorted((n for n in d.neighbours if n.over_bytes > 0), key=lambda n: -n.over_bytes))
    within = f"it wanted {_b(wanted)}, within its " + " and ".join(f"{n} of {_b(b)}" for n, b in bounds)
    named = tuple(f"{n.name} held {_b(n.held_bytes)}, {_b(n.over_bytes)} above its share" for n in above)
    return Verdict(kind, confidence, "Innocent", above, found, (*because, within, *named))


def _exit_text(e: Evidence) -> str:
    if e.exit_code is None and e.reason is None:
        return "no exit status and no memory evidence"
    return f"exit code {e.exit_code} ({e.reason or 'no reason'}) with no memory evidence"
