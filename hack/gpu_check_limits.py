"""Real-GPU check of per-cgroup memory limits (``hack/gpu-check.sh --memory-limits``).

As root on a GPU node with cgroup v2, through raw pynvml (not the agent's code):

1. creates a cgroup ``/sys/fs/cgroup/vramguard-gpu-check-<pid>``;
2. reads its limits on the device (expected: none, soft 0 and hard MAX);
3. sets a hard limit of ``--limit-mib`` and a soft limit of half of it, reads
   them back;
4. with ``--enforce-check``, runs a holder inside the cgroup that allocates
   below the hard limit (must succeed) and one that allocates above it (must
   fail with out-of-memory);
5. clears the limits (soft 0, hard ``NVML_DEVICE_MEMORY_LIMIT_MAX``), reads the
   clear back, removes the cgroup (also when a step failed);
6. compares with the agent's report: ``devices[].memoryLimits`` is Supported
   exactly when NVML answered here.

Where the host cannot hold limits (not root, no cgroup v2, MIG, nvidia-ml-py
older than 13.615, a driver older than r615, NVML's NOT_SUPPORTED or
NO_PERMISSION) it says UNSUPPORTED, with the step and NVML's answer: that is a
fact about the host, not a failed check; only the agent's agreement is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
CGROUP_ROOT = Path("/sys/fs/cgroup")
Check = tuple[str, bool]


class Unsupported(Exception):
    """The host cannot hold per-cgroup memory limits; the message says which step found it."""


def _nvml() -> Any:
    import pynvml

    for name in ("nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1"):
        if not hasattr(pynvml, name):
            raise Unsupported(f"nvidia-ml-py has no {name} (13.615 or newer has)")
    return pynvml


def preconditions(device: int) -> None:
    """Raise ``Unsupported`` when this host rules limits out before NVML is asked."""
    if os.geteuid() != 0:
        raise Unsupported("not root: NVML sets memory limits for root (with CAP_SYS_ADMIN) only")
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        raise Unsupported(f"no cgroup v2 at {CGROUP_ROOT} (memory limits need the unified hierarchy)")
    pynvml = _nvml()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device)
    try:
        if pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            raise Unsupported(f"GPU {device} is in MIG mode: NVML supports limits on non-MIG devices only")
    except pynvml.NVMLError_NotSupported:
        pass  # not MIG-capable


def _call(step: str, fn: Callable[[], Any]) -> Any:
    pynvml = _nvml()
    try:
        return fn()
    except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission) as err:
        raise Unsupported(f"{step}: {type(err).__name__}: {err}") from err


def get_limits(device: int, namespace: str) -> tuple[int, int, int]:
    """(soft, hard, currentUsed) bytes that the driver holds for ``namespace``."""
    pynvml = _nvml()
    limits = pynvml.c_nvmlGetMemoryLimits_v1_t()
    limits.nameSpace = namespace
    handle = pynvml.nvmlDeviceGetHandleByIndex(device)
    _call("nvmlDeviceGetMemoryLimits_v1", lambda: pynvml.nvmlDeviceGetMemoryLimits_v1(handle, limits))
    return int(limits.softLimit), int(limits.hardLimit), int(limits.currentUsed)


def set_limits(device: int, namespace: str, soft: int, hard: int) -> None:
    """Set the limits (bytes; hard ``NVML_DEVICE_MEMORY_LIMIT_MAX`` and soft 0 clear them)."""
    pynvml = _nvml()
    limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
    limits.nameSpace, limits.softLimit, limits.hardLimit = namespace, soft, hard
    handle = pynvml.nvmlDeviceGetHandleByIndex(device)
    _call("nvmlDeviceSetMemoryLimits_v1", lambda: pynvml.nvmlDeviceSetMemoryLimits_v1(handle, limits))


def hold_in(cgroup: Path, script: str, method: str, device: int, mib: int) -> bool:
    """Whether a holder started inside ``cgroup`` could allocate ``mib`` MiB (it said READY)."""

    def enter() -> None:  # in the child, before exec: CUDA starts inside the cgroup
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    child = subprocess.Popen(
        [sys.executable, script, "--hold", method, "--device", str(device), "--mib", str(mib)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=enter,
    )  # fmt: skip
    assert child.stdout is not None and child.stdin is not None
    ready = child.stdout.readline().startswith("READY")
    child.stdin.close()
    child.wait(timeout=120)
    return ready


def run(args: Any, script: str, method: str, agent_device: dict[str, Any]) -> tuple[list[Check], str]:
    """The check's results and a one-line verdict (SUPPORTED or UNSUPPORTED: why)."""
    agent_says = agent_device.get("memoryLimits")
    cgroup = CGROUP_ROOT / f"vramguard-gpu-check-{os.getpid()}"
    try:
        preconditions(args.device)
        cgroup.mkdir()
        try:
            checks = _exercise(args, cgroup, script, method)
        finally:
            _remove(cgroup, args.device, str(cgroup), _nvml().NVML_DEVICE_MEMORY_LIMIT_MAX)
    except Unsupported as why:
        return [(f"the agent reports Unsupported too (it says {agent_says})", agent_says == "Unsupported")], (
            f"UNSUPPORTED: {why}"
        )
    return [*checks, (f"the agent reports Supported (it says {agent_says})", agent_says == "Supported")], "SUPPORTED"


def _exercise(args: Any, cgroup: Path, script: str, method: str) -> list[Check]:
    """Steps 2 to 5 of the module docstring on ``cgroup``."""
    no_limit, namespace, device = _nvml().NVML_DEVICE_MEMORY_LIMIT_MAX, str(cgroup), args.device
    hard = args.limit_mib * MIB
    checks = [("a new cgroup reads no limits", get_limits(device, namespace)[:2] == (0, no_limit))]
    set_limits(device, namespace, hard // 2, hard)
    held = get_limits(device, namespace)[:2]
    checks.append((f"set soft {hard // 2 // MIB} / hard {hard // MIB} MiB reads back", held == (hard // 2, hard)))
    if args.enforce_check:
        below, above = max(64, args.limit_mib // 4), args.limit_mib + 1024
        allocated = hold_in(cgroup, script, method, device, below)
        checks.append((f"{below} MiB below the hard limit: allocated", allocated))
        refused = not hold_in(cgroup, script, method, device, above)
        checks.append((f"{above} MiB above the hard limit: refused", refused))
    set_limits(device, namespace, 0, no_limit)
    cleared = get_limits(device, namespace)[:2] == (0, no_limit)
    checks.append(("clear (soft 0, hard MAX) reads back as no limit", cleared))
    return checks


def _remove(cgroup: Path, device: int, namespace: str, no_limit: int) -> None:
    """Clear and remove the check's cgroup, whatever happened (removal clears limits too)."""
    if not cgroup.exists():
        return
    try:
        set_limits(device, namespace, 0, no_limit)
    except Exception as err:  # noqa: BLE001 - best effort: rmdir clears the limits anyway
        print(f"  note: clearing {namespace} at the end failed: {err}")
    try:
        cgroup.rmdir()
    except OSError as err:
        print(f"  note: could not remove {cgroup}: {err}")
