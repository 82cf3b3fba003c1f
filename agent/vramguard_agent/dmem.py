"""VRAM per cgroup from the kernel's ``dmem`` controller: a second VRAM source.

On cgroup v2 with Linux 6.14+ and an NVIDIA driver r615+, the driver charges each
allocation of device memory to the allocating process's cgroup. The formats
(Documentation/admin-guide/cgroup-v2.rst, "DMEM") are one ``<region> <value>``
line per region:

- ``dmem.capacity`` (root cgroup only): each region's size, bytes; NVIDIA's
  regions are named ``nvidia/<PCI address>/vidmem``;
- ``dmem.current`` (every cgroup but the root): bytes charged now;
- ``dmem.min`` and ``dmem.max``: protection and hard limit, bytes, or ``max``
  (no limit; here None).

It covers what NVML cannot attribute: an MPS client's memory is allocated by the
MPS server, which NVML lists instead of the client, but the kernel charges the
client's cgroup. A pod's VRAM comes from NVML when NVML attributes a process to
it, else from ``dmem.current`` when the kernel has it (``vram_source``).
Regions of other drivers (``drm/...``: amdgpu, xe) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from vramguard_api.usage import DmemRegion, VRAMSource

NVIDIA_PREFIX = "nvidia/"


def parse_dmem(text: str) -> dict[str, int | None]:
    """Region → bytes (None for ``max``) from a dmem file; malformed lines are skipped."""
    values: dict[str, int | None] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        region, value = parts
        if value == "max":
            values[region] = None
        elif value.isdigit():
            values[region] = int(value)
    return values


def nvidia_regions(capacity_text: str) -> list[str]:
    """NVIDIA's regions listed in ``dmem.capacity``, in its order."""
    return [r for r in parse_dmem(capacity_text) if r.startswith(NVIDIA_PREFIX)]


def vram_source(
    nvml_bytes: int | None, nvml_attributed: bool, regions: Iterable[DmemRegion] | None
) -> tuple[int | None, VRAMSource | None]:
    """A pod's VRAM (bytes) and where it came from.

    NVML when it attributes a process to the pod (``nvml_attributed``); else the sum
    of ``dmem.current`` over NVIDIA's regions when every one is known; else NVML's
    figure as it is (0 for a GPU pod without a process, None when unknown)."""
    if nvml_attributed:
        return nvml_bytes, "NVML"
    currents = [r.current_bytes for r in regions or ()]
    if currents and all(c is not None for c in currents):
        return sum(c for c in currents if c is not None), "Dmem"
    return nvml_bytes, ("NVML" if nvml_bytes is not None else None)


class DmemReader:
    """Reads pods' dmem files under ``cgroup_root`` (cgroup v2's root) every sample.

    ``read(uids, pod_dir)`` returns cgroup uid → NVIDIA regions; empty when the
    kernel has no dmem controller or no NVIDIA region (the file is re-read each
    time: the driver registers its regions when it loads)."""

    def __init__(self, cgroup_root: str | Path = "/sys/fs/cgroup") -> None:
        self.root = Path(cgroup_root)

    def read(self, uids: Iterable[str], pod_dir: Callable[[str], Path | None]) -> dict[str, list[DmemRegion]]:
        """NVIDIA's regions of each pod whose cgroup directory ``pod_dir`` finds."""
        capacity = _read_text(self.root / "dmem.capacity")
        regions = nvidia_regions(capacity) if capacity is not None else []
        if not regions:
            return {}
        result: dict[str, list[DmemRegion]] = {}
        for uid in uids:
            directory = pod_dir(uid)
            if directory is None:
                continue
            files = {name: _read_text(directory / f"dmem.{name}") for name in ("current", "min", "max")}
            if files["current"] is None:
                continue  # the pod's parent has not enabled dmem in cgroup.subtree_control
            values = {name: parse_dmem(text) if text is not None else {} for name, text in files.items()}
            result[uid] = [
                DmemRegion(
                    region=r,
                    currentBytes=values["current"].get(r),
                    minBytes=values["min"].get(r),
                    maxBytes=values["max"].get(r),
                )
                for r in regions
            ]
        return result


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
