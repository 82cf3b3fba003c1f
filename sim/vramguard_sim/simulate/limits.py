"""Driver-enforced memory limits in the fleet simulation (the "with caps" run):
what the node agents (``--enforce-caps``) and the driver do with the
``vramguard.io/memory-limits`` annotations the engine writes.

Devices that can hold limits: every GPU of the time-sliced and MPS nodes
(assumed: the driver applies a cgroup's limits to all its CUDA processes, MPS
client or not; docs/agent.md lists this among the assumptions). Not MIG
devices (NVML refuses MIG handles) and not vGPU guests (assumed unsupported),
which the reports say, so the engine writes no limits there.

Applying a pod's annotation (``apply``) is what its agent does at the next
sample: each limit on the pod's device is set for the pod (the device's
owner), except a hard limit below what the pod holds, which Linux's dmem
controller does not apply (the old one stays, the agent reports NotHeld and
retries at each evaluation of the pod); a refused annotation changes nothing;
no annotation clears the pod's limits. The device then enforces them
(``vramguard_sim.gpumem``).
"""

from __future__ import annotations

from typing import Any

from vramguard_api.memlimits import MemoryLimitsError, memory_limits_of
from vramguard_sim.simulate.fleet import SimPod
from vramguard_sim.simulate.nodes import GPU

SUPPORTED = {"memoryLimits": "Supported", "memoryLimitsReason": "ProbeSucceeded"}
VGPU_UNSUPPORTED = {
    "memoryLimits": "Unsupported",
    "memoryLimitsReason": "NotSupported",
    "memoryLimitsMessage": "nvmlDeviceGetMemoryLimits_v1: Not Supported (a vGPU guest; assumed)",
}
MIG_UNSUPPORTED = {
    "memoryLimits": "Unsupported",
    "memoryLimitsReason": "MIGDevice",
    "memoryLimitsMessage": "MIG handles are not supported",
}


def device_support(gpu: GPU) -> dict[str, Any]:
    """The memory-limit fields of a device's report entry in the "with caps" run."""
    if gpu.mig_slot is not None:
        return MIG_UNSUPPORTED
    return VGPU_UNSUPPORTED if gpu.node.kind.vgpu else SUPPORTED


def apply(pod: SimPod) -> None:
    """Apply the pod's ``vramguard.io/memory-limits`` to its device (module doc)."""
    gpu = pod.gpu
    if gpu is None:
        return
    dev = gpu.device
    try:
        wanted = memory_limits_of(pod.facts.annotations) or {}
    except MemoryLimitsError:
        return  # refused whole: what the driver holds is kept
    lim = wanted.get(dev.uuid)
    if lim is None:
        dev.set_limits(pod.uid)
        return
    hard = lim.hard_limit
    if hard is not None and hard < dev.owner_bytes(pod.uid):
        hard = dev.limits.get(pod.uid, (0, None))[1]  # dmem keeps the old max
    soft = lim.soft_limit if hard is None else min(lim.soft_limit, hard)
    dev.set_limits(pod.uid, soft, hard)


def forget(pod: SimPod) -> None:
    """The pod is gone: its cgroup, and the limits on it, with it."""
    if pod.gpu is not None:
        pod.gpu.device.set_limits(pod.uid)
