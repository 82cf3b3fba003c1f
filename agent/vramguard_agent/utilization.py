"""GPU utilisation: per device from ``nvmlDeviceGetUtilizationRates``, per process
from ``nvmlDeviceGetProcessUtilization``, and per pod from its processes.

``nvmlDeviceGetUtilizationRates`` gives ``gpu`` (percent of the last sample period,
1/6 s to 1 s by product, in which a kernel ran; dcgm-exporter's
``DCGM_FI_DEV_GPU_UTIL``) and ``memory`` (percent of it in which device memory was
read or written; ``DCGM_FI_DEV_MEM_COPY_UTIL``).

``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`` returns the
driver's samples newer than ``lastSeenTimeStamp`` (CPU time, microseconds), each
a ``c_nvmlProcessUtilizationSample_t`` (pid, timeStamp, smUtil, memUtil, encUtil,
decUtil; percent); ``NVML_ERROR_NOT_FOUND`` when there is none newer, and
``NVML_ERROR_NOT_SUPPORTED`` on MIG devices and vGPU guests (NVML API reference,
"Device Queries"). A process's utilisation over a sample interval is the mean of
its samples since the previous read; a pod's on a device is the sum of its
processes', at most 100.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from .cgroups import Attribution, NotInPod
from .gpu import GPUSample


def mean_sm_util(samples: Iterable[Any], since_us: int) -> tuple[dict[int, int], int]:
    """Each pid's mean ``smUtil`` (percent) over the samples newer than ``since_us``,
    and the newest ``timeStamp`` seen (``since_us`` when none is newer)."""
    sums: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    newest = since_us
    for s in samples:
        if s.timeStamp <= since_us:
            continue  # the driver may hand back the boundary sample again
        acc = sums[int(s.pid)]
        acc[0] += int(s.smUtil)
        acc[1] += 1
        newest = max(newest, int(s.timeStamp))
    return {pid: round(total / count) for pid, (total, count) in sums.items()}, newest


def pod_sm_utilization(
    gpu: GPUSample | None, attributions: Mapping[int, Attribution | NotInPod]
) -> dict[str, dict[str, int]]:
    """Cgroup uid → device UUID → SM utilisation of its processes (percent, at most 100).

    Devices without per-process figures are left out: unknown, not idle."""
    result: dict[str, dict[str, int]] = defaultdict(dict)
    for device in gpu.devices if gpu else ():
        if device.process_utilization is None:
            continue
        for pid, util in device.process_utilization.items():
            owner = attributions.get(pid)
            if isinstance(owner, Attribution):
                held = result[owner.pod_uid].get(device.uuid, 0)
                result[owner.pod_uid][device.uuid] = min(100, held + util)
        # A pod with processes on the device but no sample there is idle on it.
        for p in device.processes or ():
            owner = attributions.get(p.pid)
            if isinstance(owner, Attribution):
                result[owner.pod_uid].setdefault(device.uuid, 0)
    return dict(result)
