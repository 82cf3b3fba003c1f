"""What the operator reads about the simulated fleet: node reports, as the
node agents would write them.

A report is built for the pods being evaluated (``docs/simulation.md``,
"Evaluating only what changed"): the devices they use, with their memory as
NVML reports it, and each of those pods' VRAM (what its process holds), RAM working
set and, for pods a leak-detecting budget selects, trend features from its
history (``vramguard_api.history.HistoryStore``, the agent's own). Every process on the
simulated devices belongs to a pod, and the devices are healthy, so the
report is complete: a pod without a process holds no VRAM.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from vramguard_api.trend import TrendFeatures
from vramguard_api.usage import NodeGPUUsage
from vramguard_sim.simulate.fleet import CONTAINER, SimPod
from vramguard_sim.simulate.limits import device_support
from vramguard_sim.simulate.nodes import SimNode

AGENT_VERSION = "simulated"


def pod_usage(pod: SimPod, trend: TrendFeatures | None) -> dict[str, Any]:
    """A pod's entry in its node's report (API form)."""
    held = pod.held()
    ram = pod.spec.ram_bytes
    entry: dict[str, Any] = {
        "uid": pod.uid,
        "namespace": pod.namespace,
        "name": pod.name,
        "qosClass": "guaranteed",
        "vramBytes": held,
        "ramWorkingSetBytes": ram,
        "containers": [
            {"name": CONTAINER, "containerID": f"{pod.pid:064x}", "vramBytes": held, "ramWorkingSetBytes": ram}
        ],
    }
    if held and pod.gpu is not None:
        entry["devices"] = [{"uuid": pod.gpu.uuid, "usedBytes": held}]
    if trend is not None:
        entry["trend"] = trend.to_api()
    return entry


def node_report(
    node: SimNode,
    pods: Iterable[SimPod],
    now: datetime,
    trends: Mapping[str, TrendFeatures],
    tick_s: float,
    caps: bool = False,
    every_device: bool = False,
) -> NodeGPUUsage:
    """The node's report at ``now`` covering ``pods`` (each on this node) and
    the devices they use (``every_device``: all the node's devices); with
    ``caps`` the agent applies memory limits (``enforceCaps``) and says which
    devices support them (``limits``)."""
    pods = list(pods)
    gpus = list(node.gpus) if every_device else list({id(p.gpu): p.gpu for p in pods if p.gpu is not None}.values())
    devices = node.device_entries(gpus)
    if caps:
        for entry, gpu in zip(devices, gpus, strict=True):
            entry.update(device_support(gpu))
    return NodeGPUUsage.model_validate(
        {
            "metadata": {"name": node.name},
            "spec": {"nodeName": node.name},
            "status": {
                "sampleTime": now,
                "agent": {"version": AGENT_VERSION, "backend": "sim", "sampleIntervalSeconds": tick_s,
                          "enforceCaps": caps},
                "devices": devices,
                "pods": [pod_usage(p, trends.get(p.uid)) for p in pods],
            },
        }
    )
