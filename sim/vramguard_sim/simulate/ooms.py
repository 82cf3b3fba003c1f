"""The fleet simulation's OOM kills through the one classifier (``vramguard_api.oom``),
so that its "innocent OOM kills" mean what the live cluster's do (``docs/oom.md``).

A simulated kill carries what the driver saw: the process's holdings, the
allocation that failed, the device's free memory, the pod's share and why the
allocation failed (``gpumem``: the device was full, the pod's hard limit, or an
eviction above its soft limit). That is the evidence an agent's end record and
the pod's exit give live: a device-full kill is a non-zero exit with less free
memory than the step it asked for (``GPUOutOfMemory``); a cap's is ``CapKill``.
"""

from __future__ import annotations

from vramguard_api.oom import DeviceEvidence, Evidence, Verdict, classify
from vramguard_sim.gpumem import REASON_HARD_LIMIT, REASON_SOFT_LIMIT
from vramguard_sim.simulate.fleet import OOMRecord

_CAPS = {REASON_HARD_LIMIT: "HardLimit", REASON_SOFT_LIMIT: "SoftLimit"}


def driver_evidence(device: str, held_bytes: int, requested_bytes: int, free_bytes: int, share_bytes: int | None,
                    reason: str) -> Evidence:
    """The classifier's evidence for a process the simulated driver killed
    (``gpumem.OOMKill``'s figures, bytes; ``share_bytes`` None: no share
    known; ``reason``: the driver's). Used by the fleet simulation and by the
    demo's run without vramguard (hack/demo/oom.py)."""
    dev = DeviceEvidence(uuid=device, free_bytes=free_bytes, held_bytes=held_bytes, requested_bytes=requested_bytes,
                         share_bytes=share_bytes, step_bytes=requested_bytes)
    return Evidence(exit_code=1, reason="Error", cap_reason=_CAPS.get(reason), device=dev)  # type: ignore[arg-type]


def evidence(record: OOMRecord) -> Evidence:
    """The classifier's evidence for one simulated OOM kill (bytes as the driver saw them)."""
    return driver_evidence(record.device, record.held_bytes, record.requested_bytes, record.free_bytes,
                           record.share_bytes, record.reason)


def verdict(record: OOMRecord) -> Verdict:
    """The verdict on one simulated OOM kill."""
    return classify(evidence(record))
