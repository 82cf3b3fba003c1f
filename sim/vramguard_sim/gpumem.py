"""GPU framebuffer memory as a driver hands it out: one model shared by the
agent's simulated backend and the operator's fleet simulation.

A ``Device`` is one GPU, one MIG device or one vGPU: ``total_bytes`` of
framebuffer, of which ``reserved_bytes`` belong to the driver, firmware or
hypervisor (NVML's ``nvmlMemory_v2.reserved``) and ``overhead_bytes`` are used
by no process (contexts, the MIG instance's own use). What is left is shared by
the processes on the device:

- ``usable_bytes = total_bytes - reserved_bytes``;
- ``used_bytes = overhead_bytes + sum(process holdings)`` (NVML v2 ``used``);
- ``free_bytes = usable_bytes - used_bytes`` (NVML ``free``).

What the driver does, and this model reproduces:

- an allocation that fits in ``free_bytes`` succeeds at once;
- an allocation that does not fit fails (``cudaErrorMemoryAllocation``); the
  model takes the usual outcome, the process dying with an out-of-memory error
  ("CUDA out of memory"): it exits and everything it held is freed. The failed
  allocation is reported as an ``OOMKill``;
- memory is freed when a process frees it or exits, and is then free for any
  process on the device; nothing is ever moved between processes.

There is no fairness: the driver does not know shares, and whoever allocates
when the memory runs out dies, whether it is the process that grew or a
neighbour that stayed within its share. (Which is why the fleet simulation
counts "innocent" OOM kills.)

Per-cgroup memory limits (NVML ``nvmlDeviceSetMemoryLimits_v1``, MPS v3
memory partitioning): processes carry an ``owner`` (their pod, or its
cgroup), the unit those limits apply to, and ``Device.limits`` holds each
owner's ``(soft, hard)`` bytes (``hard`` None: none; ``soft`` 0: none). Every
allocation, by ``allocate`` or ``resize``, is granted or refused in
``Device._grow``:

- **hard limit**: an allocation that would take the owner's holdings (all its
  processes on the device) above it fails, for that process only, even when
  the device has free memory (reason ``REASON_HARD_LIMIT``); the neighbours
  keep theirs;
- **soft limit**: when an allocation does not fit, the driver first evicts
  the clients whose owner is above its soft limit, furthest above first (the
  largest process of that owner; reason ``REASON_SOFT_LIMIT``), until it fits;
  an owner at or under its soft limit is never chosen this way, and neither is
  an owner without a soft limit (none is no statement; so without soft limits
  the device behaves as before). When the requester's own owner is the
  furthest above, or nobody is above, the requester fails as before.

What "evict" means for a client is not documented beyond "the first to be
evicted": the model takes the harshest reading, the process dies with an
out-of-memory error (as on a failed allocation). ``allocate`` and ``resize``
return every kill they caused, victims included.

Pure Python, no NVML: the agent's fake ``pynvml`` reads these holdings, the
fleet simulation calls ``Device.resize`` millions of times (hence ``__slots__``
and plain integers).
"""

from __future__ import annotations

from dataclasses import dataclass

REASON_DEVICE_FULL = "device-full"
"""The allocation did not fit in the device's free memory."""
REASON_HARD_LIMIT = "hard-limit"
"""The allocation would have taken its owner above its hard limit."""
REASON_SOFT_LIMIT = "soft-limit"
"""Evicted, above its owner's soft limit, to make room for another allocation."""


@dataclass(frozen=True, slots=True)
class OOMKill:
    """A process killed by an allocation that failed.

    ``held_bytes``: what the process held just before (all freed with it);
    ``requested_bytes``: the allocation that failed (0 for a process evicted
    for another's allocation); ``free_bytes``: the device's free memory when it
    failed; ``reason``: why (``REASON_DEVICE_FULL``, ``REASON_HARD_LIMIT``,
    ``REASON_SOFT_LIMIT``).
    """

    device: str
    pid: int
    owner: str | None
    held_bytes: int
    requested_bytes: int
    free_bytes: int
    reason: str = REASON_DEVICE_FULL

    @property
    def wanted_bytes(self) -> int:
        """What the process would have held had the allocation succeeded."""
        return self.held_bytes + self.requested_bytes


class GPUProcess:
    """A process on one device: its pid, its owner (cgroup path or pod uid:
    the unit of per-cgroup limits) and the bytes it holds there."""

    __slots__ = ("pid", "owner", "used_bytes")

    def __init__(self, pid: int, owner: str | None = None) -> None:
        self.pid = pid
        self.owner = owner
        self.used_bytes = 0

    def __repr__(self) -> str:
        return f"GPUProcess(pid={self.pid}, owner={self.owner!r}, used_bytes={self.used_bytes})"


def _check_bytes(value: int, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what}: want a whole number of bytes >= 0, got {value!r}")


class Device:
    """One device's framebuffer shared by its processes (see the module doc).

    Raises ``ValueError`` naming the argument for a negative or non-integer
    size, reserved plus overhead above the total, a pid started twice, or a
    call for a pid that is not on the device.
    """

    __slots__ = ("uuid", "total_bytes", "reserved_bytes", "overhead_bytes", "processes", "_held", "limits")

    def __init__(self, uuid: str, total_bytes: int, reserved_bytes: int = 0, overhead_bytes: int = 0) -> None:
        for what, value in (("total_bytes", total_bytes), ("reserved_bytes", reserved_bytes),
                            ("overhead_bytes", overhead_bytes)):
            _check_bytes(value, f"device {uuid}: {what}")
        if reserved_bytes + overhead_bytes > total_bytes:
            raise ValueError(
                f"device {uuid}: reserved_bytes {reserved_bytes} + overhead_bytes {overhead_bytes} "
                f"exceed total_bytes {total_bytes}"
            )
        self.uuid = uuid
        self.total_bytes = total_bytes
        self.reserved_bytes = reserved_bytes
        self.overhead_bytes = overhead_bytes
        self.processes: dict[int, GPUProcess] = {}
        self._held = 0  # sum of the processes' holdings, kept as they change
        # owner -> (soft, hard): per-cgroup limits; empty (the usual case) costs one test per allocation
        self.limits: dict[str, tuple[int, int | None]] = {}

    # --- figures (bytes) -----------------------------------------------------

    @property
    def usable_bytes(self) -> int:
        """Total minus reserved: what contexts and processes can use."""
        return self.total_bytes - self.reserved_bytes

    @property
    def process_bytes(self) -> int:
        """Sum of what the processes hold."""
        return self._held

    @property
    def used_bytes(self) -> int:
        """Overhead plus the processes' holdings (NVML v2 ``used``)."""
        return self.overhead_bytes + self._held

    @property
    def free_bytes(self) -> int:
        """Usable minus used: the largest allocation that succeeds now."""
        return self.total_bytes - self.reserved_bytes - self.overhead_bytes - self._held

    def holding(self, pid: int) -> int:
        """Bytes process ``pid`` holds (0 when it is not on the device)."""
        proc = self.processes.get(pid)
        return 0 if proc is None else proc.used_bytes

    def owner_bytes(self, owner: str) -> int:
        """Bytes all processes of ``owner`` hold on the device."""
        return sum(p.used_bytes for p in self.processes.values() if p.owner == owner)

    # --- limits ----------------------------------------------------------------

    def set_limits(self, owner: str, soft_bytes: int = 0, hard_bytes: int | None = None) -> None:
        """Set ``owner``'s soft and hard limits (bytes; 0 and None: none, which
        clears them). Raises ``ValueError`` for a negative value or a soft limit
        above the hard one (NVML's INVALID_ARGUMENT)."""
        _check_bytes(soft_bytes, f"device {self.uuid}: soft limit of {owner}")
        if hard_bytes is not None:
            _check_bytes(hard_bytes, f"device {self.uuid}: hard limit of {owner}")
            if soft_bytes > hard_bytes:
                raise ValueError(f"device {self.uuid}: soft limit {soft_bytes} of {owner} above its hard limit {hard_bytes}")
        if soft_bytes == 0 and hard_bytes is None:
            self.limits.pop(owner, None)
        else:
            self.limits[owner] = (soft_bytes, hard_bytes)

    # --- processes -----------------------------------------------------------

    def start(self, pid: int, owner: str | None = None) -> GPUProcess:
        """A process opens a context on the device, holding nothing yet."""
        if pid in self.processes:
            raise ValueError(f"device {self.uuid}: pid {pid} is already running there")
        proc = self.processes[pid] = GPUProcess(pid, owner)
        return proc

    def exit(self, pid: int) -> int:
        """The process exits: everything it held is freed. Returns the bytes freed
        (0 for a pid not on the device: exiting twice is harmless)."""
        proc = self.processes.pop(pid, None)
        if proc is None:
            return 0
        self._held -= proc.used_bytes
        return proc.used_bytes

    def _process(self, pid: int) -> GPUProcess:
        proc = self.processes.get(pid)
        if proc is None:
            raise ValueError(f"device {self.uuid}: pid {pid} is not running there")
        return proc

    # --- allocations -----------------------------------------------------------

    def allocate(self, pid: int, nbytes: int) -> tuple[OOMKill, ...]:
        """Process ``pid`` allocates ``nbytes`` more. Returns the processes killed:
        empty when it fits; else the requester, killed (exited, its memory freed)."""
        _check_bytes(nbytes, f"device {self.uuid}: allocation of pid {pid}")
        return self._grow(self._process(pid), nbytes)

    def _grow(self, proc: GPUProcess, nbytes: int) -> tuple[OOMKill, ...]:
        # The one place an allocation is granted or refused (see the module doc).
        free = self.total_bytes - self.reserved_bytes - self.overhead_bytes - self._held
        victims: tuple[OOMKill, ...] = ()
        if self.limits:
            owner = proc.owner
            hard = None if owner is None else self.limits.get(owner, (0, None))[1]
            if owner is not None and hard is not None and self.owner_bytes(owner) + nbytes > hard:
                return (self._kill(proc, nbytes, free, REASON_HARD_LIMIT),)
            if nbytes > free:
                victims = self._evict_above_soft(proc, nbytes)
                free = self.total_bytes - self.reserved_bytes - self.overhead_bytes - self._held
        if nbytes <= free:
            proc.used_bytes += nbytes
            self._held += nbytes
            return victims
        return (*victims, self._kill(proc, nbytes, free, REASON_DEVICE_FULL))

    def _evict_above_soft(self, proc: GPUProcess, nbytes: int) -> tuple[OOMKill, ...]:
        """Kill the largest process of the owner furthest above its soft limit,
        again while ``nbytes`` does not fit, stopping at the requester's own owner."""
        kills = []
        while nbytes > self.free_bytes:
            excess: dict[str, int] = {}
            for p in self.processes.values():
                o = p.owner
                soft = 0 if o is None else self.limits.get(o, (0, None))[0]
                if o is not None and soft > 0:
                    excess[o] = excess.get(o, -soft) + p.used_bytes
            above = [(over, owner) for owner, over in excess.items() if over > 0]
            if not above:
                break
            _, owner = max(above, key=lambda e: (e[0], e[1]))
            if owner == proc.owner:
                break  # the requester's owner is furthest above: its allocation fails
            victim = max((p for p in self.processes.values() if p.owner == owner), key=lambda p: (p.used_bytes, p.pid))
            kills.append(self._kill(victim, 0, self.free_bytes, REASON_SOFT_LIMIT))
        return tuple(kills)

    def release(self, pid: int, nbytes: int) -> None:
        """Process ``pid`` frees ``nbytes`` of what it holds (never more)."""
        _check_bytes(nbytes, f"device {self.uuid}: free of pid {pid}")
        proc = self._process(pid)
        if nbytes > proc.used_bytes:
            raise ValueError(f"device {self.uuid}: pid {pid} frees {nbytes} bytes but holds {proc.used_bytes}")
        proc.used_bytes -= nbytes
        self._held -= nbytes

    def resize(self, pid: int, wanted_bytes: int) -> tuple[OOMKill, ...]:
        """Process ``pid`` moves to holding ``wanted_bytes``: it frees the excess,
        or allocates the difference (which can fail: see ``allocate``)."""
        proc = self.processes.get(pid)
        if proc is None:
            raise ValueError(f"device {self.uuid}: pid {pid} is not running there")
        delta = wanted_bytes - proc.used_bytes
        if delta <= 0:
            if wanted_bytes < 0:
                raise ValueError(f"device {self.uuid}: pid {pid} wants {wanted_bytes} bytes")
            proc.used_bytes = wanted_bytes
            self._held += delta
            return ()
        return self._grow(proc, delta)

    def _kill(self, proc: GPUProcess, requested: int, free: int, reason: str) -> OOMKill:
        held = proc.used_bytes
        self.exit(proc.pid)
        return OOMKill(self.uuid, proc.pid, proc.owner, held, requested, free, reason)

    def __repr__(self) -> str:
        return (
            f"Device({self.uuid!r}, usable={self.usable_bytes}, used={self.used_bytes}, "
            f"processes={len(self.processes)})"
        )
