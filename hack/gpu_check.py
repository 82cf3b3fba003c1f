"""Real-GPU check of the agent's NVML backend (run by hack/gpu-check.sh).

A child process holds a known amount of device memory, through the first of
torch, cupy, pycuda, numba that is installed, else through ctypes calls to
libcudart (cudaMalloc) or libcuda (cuMemAlloc). ``vramguard-agent once
--backend nvml`` runs before and while it holds it, and the figures are
printed side by side with raw NVML's, then checked:

- the holder's pid is in the agent's report, on the device it allocated on;
- the agent's figure for it equals raw NVML's and is at least the requested size,
  the excess (CUDA context, allocator pools) below ``--max-overhead-mib``;
- the device's used memory grew by about the holder's usage;
- no ProcessesMissing condition, the device is Healthy.

With ``--memory-limits`` it then sets, reads and clears a per-cgroup memory
limit on the device (``gpu_check_limits``), or says why the host cannot.

Exit status: 0 all checks pass, 1 a check failed, 2 no GPU / NVML / CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_holders import HOLDERS, available_holder, hold

MIB = 1024 * 1024


# --- the check (parent) --------------------------------------------------------------


def agent_once(agent: list[str], node: str) -> dict[str, Any]:
    out = subprocess.run(
        [*agent, "once", "--backend", "nvml", "--node", node], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise RuntimeError(f"vramguard-agent once failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def raw_nvml(pid: int) -> dict[str, int | None]:
    """Raw NVML per-device usage of ``pid`` (UUID → bytes), independent of the agent."""
    import pynvml

    pynvml.nvmlInit()
    try:
        found: dict[str, int | None] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handles = [pynvml.nvmlDeviceGetHandleByIndex(index)]
            try:
                if pynvml.nvmlDeviceGetMigMode(handles[0])[0] == 1:
                    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handles[0])):
                        try:
                            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handles[0], slot))
                        except pynvml.NVMLError:
                            continue
            except pynvml.NVMLError:
                pass
            for handle in handles:
                try:
                    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                except pynvml.NVMLError:
                    continue
                for p in processes:
                    if p.pid == pid:
                        found[pynvml.nvmlDeviceGetUUID(handle)] = p.usedGpuMemory
        return found
    finally:
        pynvml.nvmlShutdown()


def pid_usage(status: dict[str, Any], pid: int) -> list[dict[str, Any]]:
    """The agent's unattributed entries for ``pid`` (a process on a bare host)."""
    return [u for u in status.get("unattributed", []) if u["pid"] == pid]


def pod_device_usage(status: dict[str, Any], pod_uid: str) -> dict[str, int]:
    """A pod's VRAM per device in a report (the check run inside a pod)."""
    for pod in status.get("pods", []):
        if pod["uid"] == pod_uid:
            return {d["uuid"]: d.get("usedBytes") or 0 for d in pod.get("devices", [])}
    return {}


def device_used(status: dict[str, Any]) -> dict[str, int]:
    return {d["uuid"]: (d.get("memory") or {}).get("usedBytes", 0) for d in status.get("devices", [])}


def mib(value: float | None) -> str:
    return "       -" if value is None else f"{value / MIB:8.1f}"


def check(args: argparse.Namespace) -> int:
    agent = [shutil.which("vramguard-agent", path=str(Path(sys.executable).parent)) or ""]
    if not agent[0]:
        agent = [sys.executable, "-m", "vramguard_agent"]
    node = args.node or socket.gethostname()
    try:
        before = agent_once(agent, node)
    except Exception as err:  # noqa: BLE001 - report and stop
        print(f"cannot run the agent with the NVML backend: {err}")
        return 2
    healthy = {c["type"]: c for c in before.get("conditions", [])}.get("AgentHealthy", {})
    if not before.get("devices"):
        print(f"no GPU seen by the agent: {healthy.get('reason')}: {healthy.get('message')}")
        return 2
    method = args.holder if args.holder != "auto" else available_holder()
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA's device index = NVML's
    child = subprocess.Popen(
        [sys.executable, __file__, "--hold", method, "--device", str(args.device), "--mib", str(args.mib)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert child.stdout is not None and child.stdin is not None
    line = child.stdout.readline().split()
    if not line or line[0] != "READY":
        print(
            f"the {method} holder could not allocate {args.mib} MiB: {child.stderr.read()[-3000:] if child.stderr else ''}"
        )
        child.kill()
        return 2
    pid = int(line[1])
    try:
        time.sleep(args.settle)
        during = agent_once(agent, node)
        raw = raw_nvml(pid)
        attribution = subprocess.run([*agent, "attribute", str(pid)], capture_output=True, text=True, timeout=60)
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    return report(args, method, pid, before, during, raw, attribution.stdout.strip() or attribution.stderr.strip())


@dataclass(frozen=True)
class Figures:
    """What the check compares, bytes: the holder's usage (agent, raw NVML) and its device's."""

    requested: int
    listed: bool  # the holder is in the agent's report (unattributed, or its pod grew)
    device: str | None  # the holder's device UUID
    measured: int | None  # the agent's figure for the holder
    raw_bytes: int | None  # raw NVML's figure for the holder
    used_before: int
    used_during: int
    pod_uid: str | None  # set when the check runs inside a pod
    info: dict[str, Any]  # the device in the agent's report during the hold
    conditions: dict[str, Any]  # the report's conditions by type


def figures(
    args: argparse.Namespace,
    pid: int,
    before: dict[str, Any],
    during: dict[str, Any],
    raw: dict[str, int | None],
    attribution: str,
) -> Figures:
    """The figures of one run, from the agent's reports before and during the hold."""
    listed = pid_usage(during, pid)
    device = listed[0]["device"] if listed else next(iter(raw), None)
    measured = listed[0].get("usedBytes") if listed else None
    try:
        pod_uid = json.loads(attribution).get("pod_uid")
    except ValueError:
        pod_uid = None
    if pod_uid and device:
        # Inside a pod the report sums by pod: the holder is the pod's growth on the device.
        grown = pod_device_usage(during, pod_uid).get(device, 0) - pod_device_usage(before, pod_uid).get(device, 0)
        listed, measured = [{"device": device}], grown
    return Figures(
        requested=args.mib * MIB,
        listed=bool(listed),
        device=device,
        measured=measured,
        raw_bytes=raw.get(device) if device else None,
        used_before=device_used(before).get(device or "", 0),
        used_during=device_used(during).get(device or "", 0),
        pod_uid=pod_uid,
        info=next((d for d in during.get("devices", []) if d["uuid"] == device), {}),
        conditions={c["type"]: c for c in during.get("conditions", [])},
    )


def print_figures(args: argparse.Namespace, method: str, pid: int, during: dict[str, Any], f: Figures, attribution: str) -> None:
    """Print the expected and measured figures side by side, MiB."""
    memory = f.info.get("memory") or {}
    agent = during.get("agent") or {}
    rows = [
        ("", "     MiB"),
        ("expected: requested allocation", mib(f.requested)),
        ("measured: agent, the holder's usage", mib(f.measured)),
        ("measured: raw NVML, the holder's usage", mib(f.raw_bytes)),
        ("overhead (CUDA context, pools)", mib(None if f.measured is None else f.measured - f.requested)),
        ("device used before", mib(f.used_before)),
        ("device used during", mib(f.used_during)),
        ("device used delta", mib(f.used_during - f.used_before)),
        ("device total", mib(memory.get("totalBytes"))),
        ("device reserved", mib(memory.get("reservedBytes"))),
        ("device usable (total - reserved)", mib(memory.get("usableBytes"))),
    ]
    print(
        f"\nvramguard GPU check on {socket.gethostname()}: {f.info.get('modelName', '?')}, driver "
        f"{agent.get('driverVersion')}, agent {agent.get('version')}"
        f"\nholder: {method}, pid {pid}, {args.mib} MiB requested on CUDA device {args.device} -> {f.device}"
        + "".join(f"\n  {label:<42}{value}" for label, value in rows)
        + f"\n  attribution of pid {pid}: {attribution}"
    )


def checks(args: argparse.Namespace, pid: int, f: Figures) -> list[tuple[str, bool]]:
    """Each check's name and whether it passed (see the module docstring)."""
    measured, requested, grown = f.measured, f.requested, f.used_during - f.used_before
    return [
        (f"holder pid {pid} in the agent's report ({'in its pod' if f.pod_uid else 'unattributed'})", f.listed),
        ("agent figure equals raw NVML", measured is not None and measured == f.raw_bytes),
        ("measured >= requested", measured is not None and measured >= requested),
        (
            f"overhead below {args.max_overhead_mib} MiB",
            measured is not None and measured - requested < args.max_overhead_mib * MIB,
        ),
        (
            "device used grew by the holder's usage (within 10% or 256 MiB)",
            measured is not None and abs(grown - measured) <= max(256 * MIB, 0.1 * measured),
        ),
        ("device Healthy", f.info.get("health") == "Healthy"),
        ("ProcessesMissing is False", f.conditions.get("ProcessesMissing", {}).get("status") == "False"),
    ]


def report(
    args: argparse.Namespace,
    method: str,
    pid: int,
    before: dict[str, Any],
    during: dict[str, Any],
    raw: dict[str, int | None],
    attribution: str,
) -> int:
    """Print the figures and the checks; 0 when every check passed, else 1."""
    f = figures(args, pid, before, during, raw, attribution)
    print_figures(args, method, pid, during, f, attribution)
    results = checks(args, pid, f)
    print("\nchecks:")
    for name, ok in results:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    if not f.listed:
        print(
            "  note: NVML reports host PIDs; inside a container without hostPID the holder's pid differs "
            "from NVML's (compare the device used delta above)."
        )
    if args.memory_limits:
        results += memory_limits(args, method, f.info)
    passed = all(ok for _, ok in results)
    print(f"\nRESULT: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


def memory_limits(args: argparse.Namespace, method: str, agent_device: dict[str, Any]) -> list[tuple[str, bool]]:
    """Set, read and clear a per-cgroup memory limit (gpu_check_limits); print the checks."""
    sys.path.insert(0, str(Path(__file__).parent))
    import gpu_check_limits

    results, verdict = gpu_check_limits.run(args, __file__, method, agent_device)
    print(f"\nmemory limits on GPU {args.device}: {verdict}")
    print(f"  agent: {agent_device.get('memoryLimits')} ({agent_device.get('memoryLimitsReason')}: "
          f"{agent_device.get('memoryLimitsMessage')})")
    for name, ok in results:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="device memory to hold, MiB (default 1024)")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index, PCI bus order (default 0)")
    parser.add_argument("--holder", choices=["auto", *HOLDERS], default="auto", help="how to allocate")
    parser.add_argument("--node", default=None, help="node name for the report (default: hostname)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait after allocating")
    parser.add_argument("--max-overhead-mib", type=int, default=2048, help="accepted context + pool overhead")
    parser.add_argument("--memory-limits", action="store_true",
                        help="also set, read and clear a per-cgroup memory limit (root, cgroup v2, driver r615+)")
    parser.add_argument("--limit-mib", type=int, default=2048, help="the hard limit to set, MiB (default 2048)")
    parser.add_argument("--enforce-check", action=argparse.BooleanOptionalAction, default=True,
                        help="allocate below and above the hard limit inside the cgroup (default on)")
    parser.add_argument("--hold", choices=HOLDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold:
        hold(args.hold, args.device, args.mib * MIB)
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
