"""Host RAM of pods and containers from the cgroup filesystem.

The RAM working set is the kubelet's and cAdvisor's definition: usage minus
inactive file-backed memory, floored at 0 —
cgroup v2: ``memory.current`` minus ``inactive_file`` of ``memory.stat``;
cgroup v1: ``memory.usage_in_bytes`` minus ``total_inactive_file``.
Swap in use (pods only): ``memory.swap.current`` (v2) or ``memory.memsw.usage_in_bytes``
less ``memory.usage_in_bytes`` (v1, with swap accounting on); memory pressure (pods only,
v2): ``memory.pressure``, parsed as ``hostmem.parse_pressure`` (Documentation/admin-guide/cgroup-v2.rst).
OOM kills: ``oom_kill`` of ``memory.events`` (v2; hierarchical, so a pod's count
includes its containers') or of ``memory.oom_control`` (v1, kernel >= 4.13;
local to each cgroup, so a pod's count is its own plus its containers').

Pod and container cgroups are found by scanning the memory hierarchy for the
kubelet's directory names (the same names ``cgroups.parse_cgroup_path``
recognises), which also covers kind's nesting and paths that a cgroup namespace
hides.

A pod's files are re-read every ``refresh_s`` seconds (default 30 s, the
report's heartbeat), not on every sample: they are most of a sample's cost on a
busy node (three small files per cgroup). Pods' refreshes are spread over the
interval, so each sample reads about the same share of them; a pod read for the
first time, or with a container not read yet, is read at once.
"""

from __future__ import annotations

import os
import re
import time
import zlib
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from vramguard_api.usage import MemoryPressure

from .cgroups import parse_cgroup_path
from .hostmem import parse_pressure

CgroupVersion = Literal[1, 2]
MAX_SCAN_DEPTH = 8
RESCAN_MIN_INTERVAL_S = 5.0
DEFAULT_REFRESH_S = 30.0


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    """One cgroup's RAM working set, OOM-kill count, swap in use (bytes) and memory
    pressure; None where unreadable or not read (swap and pressure: pods only)."""

    working_set_bytes: int | None
    oom_kills: int | None
    swap_bytes: int | None = None
    pressure: MemoryPressure | None = None


@dataclass(slots=True)
class PodMemory:
    """A pod's cgroup and its containers' cgroups (keyed by 64-hex container id)."""

    pod: CgroupMemory
    containers: dict[str, CgroupMemory] = field(default_factory=dict)


@dataclass(slots=True)
class PodCgroup:
    """Where a pod's cgroup and its containers' cgroups are (directory paths)."""

    path: str
    containers: dict[str, str] = field(default_factory=dict)


def working_set(usage_bytes: int, inactive_file_bytes: int | None) -> int:
    """The kubelet's working set: usage minus inactive file, floored at 0 (bytes)."""
    return max(0, usage_bytes - (inactive_file_bytes or 0))


def detect_version(cgroup_root: Path) -> CgroupVersion | None:
    """2 for a unified hierarchy, 1 when a v1 memory hierarchy is mounted (also on
    hybrid hosts, whose unified hierarchy has no memory controller), else None."""
    if (cgroup_root / "memory").is_dir():
        return 1
    if (cgroup_root / "cgroup.controllers").exists():
        return 2
    return None


class CgroupMemoryReader:
    """Reads pods' and containers' RAM under ``cgroup_root`` (default /sys/fs/cgroup).

    ``read(pods)`` returns a ``PodMemory`` for each pod whose cgroup was found.
    The hierarchy is rescanned when a wanted pod or container is missing from the
    index, at most every ``RESCAN_MIN_INTERVAL_S`` seconds (``clock`` in seconds).
    A pod's reading is kept for ``refresh_s`` seconds (0: read every time).
    """

    def __init__(
        self,
        cgroup_root: str | Path = "/sys/fs/cgroup",
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = DEFAULT_REFRESH_S,
    ) -> None:
        if refresh_s < 0:
            raise ValueError(f"RAM refresh interval must be >= 0 seconds, got {refresh_s}")
        self.root = Path(cgroup_root)
        self.refresh_s = refresh_s
        self._clock = clock
        self._version: CgroupVersion | None = None
        self._index: dict[str, PodCgroup] = {}
        self._last_scan: float | None = None
        self._oom: dict[str, int | None] = {}
        self._readings: dict[str, tuple[float, PodMemory]] = {}

    @property
    def version(self) -> CgroupVersion | None:
        """The cgroup version under the root, detected on first use."""
        if self._version is None:
            self._version = detect_version(self.root)
        return self._version

    def _hierarchy(self) -> Path:
        return self.root / "memory" if self.version == 1 else self.root

    def read(self, pods: Mapping[str, Set[str]], now: float | None = None) -> dict[str, PodMemory]:
        """RAM of the pods in ``pods`` (pod uid → container ids expected in it).

        Pods without a cgroup are left out; containers without one are absent
        from ``PodMemory.containers``. ``now`` (seconds; default the clock) ages
        the kept readings: a reading is returned again until it comes due,
        ``refresh_s`` after the last one (a clock that steps back re-reads at once).
        """
        if self.version is None or not pods:
            self._readings = {}
            return {}
        index = self._index
        missing = any(uid not in index or not ids <= index[uid].containers.keys() for uid, ids in pods.items())
        clock = self._clock()
        if self._last_scan is None or (missing and clock - self._last_scan >= RESCAN_MIN_INTERVAL_S):
            self._index = self.scan()
            self._last_scan = clock
            self._oom = {}
        when = now if now is not None else clock
        readings: dict[str, tuple[float, PodMemory]] = {}
        for uid in pods:
            cgroup = self._index.get(uid)
            if cgroup is not None:
                readings[uid] = self._reading(uid, cgroup, when)
        self._readings = readings  # pods no longer wanted are forgotten
        return {uid: memory for uid, (_, memory) in readings.items()}

    def _reading(self, uid: str, cgroup: PodCgroup, when: float) -> tuple[float, PodMemory]:
        """The pod's kept (next due time, reading), or a new one when it is due."""
        kept = self._readings.get(uid)
        if kept is not None:
            due, memory = kept
            # A due time more than an interval ahead means the clock stepped back: read now.
            if when < due <= when + self.refresh_s and memory.containers.keys() == cgroup.containers.keys():
                return kept
            # Fixed rate: a tick that wakes a little late does not push the next refresh a sample later.
            due += self.refresh_s
            if not when < due <= when + self.refresh_s:
                due = when + self.refresh_s
        else:
            # A first reading comes due after a per-pod share of the interval: pods found together refresh apart.
            due = when + self.refresh_s * (1 - (zlib.crc32(uid.encode()) % 1000) / 1000)
        return due, self._read_pod(cgroup)

    def pod_cgroup_path(self, uid: str) -> str | None:
        """A pod's cgroup directory relative to the hierarchy's root (``/kubepods.slice/...``),
        None when it has none. From the last scan, checked on disk: a deleted pod's
        cgroup goes away before the next scan."""
        cgroup = self._index.get(uid)
        if cgroup is None or not os.path.isdir(cgroup.path):
            return None
        return "/" + os.path.relpath(cgroup.path, self._hierarchy()).replace(os.sep, "/")

    def scan(self) -> dict[str, PodCgroup]:
        """Index every kubelet pod cgroup under the memory hierarchy, by pod uid."""
        index: dict[str, PodCgroup] = {}
        stack: list[tuple[str, str, int]] = [(str(self._hierarchy()), "", 0)]
        while stack:
            directory, relative, depth = stack.pop()
            for entry in _subdirectories(directory):
                path = f"{relative}/{entry.name}"
                found = parse_cgroup_path(path)
                if found is None:
                    if depth < MAX_SCAN_DEPTH:
                        stack.append((entry.path, path, depth + 1))
                elif found.container_id is None:
                    index[found.pod_uid] = self._pod_cgroup(entry.path, path)
        return index

    @staticmethod
    def _pod_cgroup(directory: str, relative: str) -> PodCgroup:
        pod = PodCgroup(path=directory)
        for entry in _subdirectories(directory):
            found = parse_cgroup_path(f"{relative}/{entry.name}")
            if found is not None and found.container_id is not None:
                pod.containers[found.container_id] = entry.path
        return pod

    def _read_pod(self, cgroup: PodCgroup) -> PodMemory:
        pod = self.read_cgroup(cgroup.path, swap_and_pressure=True)
        # On v2 a pod's oom_kill counts its containers' too: while it stands still,
        # the containers' counts are those read last time (one file less per container).
        unchanged = self.version == 2 and pod.oom_kills is not None and self._oom.get(cgroup.path) == pod.oom_kills
        containers = {}
        for cid, path in cgroup.containers.items():
            known = self._oom.get(path) if unchanged else None
            containers[cid] = self.read_cgroup(path, oom_kills=known)
            self._oom[path] = containers[cid].oom_kills
        self._oom[cgroup.path] = pod.oom_kills
        if self.version == 1 and pod.oom_kills is not None:
            # v1 counts OOM kills in the cgroup that hit its limit only.
            pod = CgroupMemory(
                pod.working_set_bytes,
                pod.oom_kills + sum(c.oom_kills or 0 for c in containers.values()),
                pod.swap_bytes,
                pod.pressure,
            )
        return PodMemory(pod=pod, containers=containers)

    def read_cgroup(
        self, directory: str | Path, oom_kills: int | None = None, swap_and_pressure: bool = False
    ) -> CgroupMemory:
        """Working set and OOM kills of one cgroup directory; None for what is unreadable.

        ``oom_kills``, when given, is used instead of reading the events file;
        ``swap_and_pressure`` reads swap in use and memory pressure too.
        """
        v2 = self.version == 2
        usage = _read_int(f"{directory}/{'memory.current' if v2 else 'memory.usage_in_bytes'}")
        stat = _read(f"{directory}/memory.stat")
        ws = None
        if usage is not None and stat is not None:
            ws = working_set(usage, _keyed(stat, _INACTIVE_V2 if v2 else _INACTIVE_V1))
        if oom_kills is None:
            events = _read(f"{directory}/{'memory.events' if v2 else 'memory.oom_control'}")
            oom_kills = None if events is None else _keyed(events, _OOM_KILL)
        if not swap_and_pressure:
            return CgroupMemory(working_set_bytes=ws, oom_kills=oom_kills)
        return CgroupMemory(ws, oom_kills, self._swap(directory, usage), self._pressure(directory))

    def _swap(self, directory: str | Path, usage: int | None) -> int | None:
        """Swap in use, bytes: v1's memsw counts memory plus swap, so memory is taken off."""
        if self.version == 2:
            return _read_int(f"{directory}/memory.swap.current")
        memsw = _read_int(f"{directory}/memory.memsw.usage_in_bytes")
        return None if memsw is None or usage is None else max(0, memsw - usage)

    def _pressure(self, directory: str | Path) -> MemoryPressure | None:
        data = _read(f"{directory}/memory.pressure") if self.version == 2 else None
        return None if data is None else parse_pressure(data.decode(errors="replace"))


# "key value" lines of memory.stat, memory.events and memory.oom_control.
_INACTIVE_V2 = re.compile(rb"(?m)^inactive_file (\d+)$")
_INACTIVE_V1 = re.compile(rb"(?m)^total_inactive_file (\d+)$")
_OOM_KILL = re.compile(rb"(?m)^oom_kill (\d+)$")


def _keyed(data: bytes, pattern: re.Pattern[bytes]) -> int | None:
    match = pattern.search(data)
    return int(match.group(1)) if match else None


def _subdirectories(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return [e for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []  # vanished while scanning


def _read(path: str) -> bytes | None:
    """A small pseudo-file's bytes (os.read: a sample reads hundreds of them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_int(path: str) -> int | None:
    data = _read(path)
    try:
        return None if data is None else int(data)
    except ValueError:
        return None
