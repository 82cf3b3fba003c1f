"""End records: what a node's agent last saw when a GPU process or a container ended.

The agent keeps each end in a bounded ring and publishes it in its
``NodeGPUUsage`` status (``status.ends``) until the operator has acknowledged
it: the operator writes the id of the last record it has published (Events,
metrics) into the annotation ``ACK_ANNOTATION`` of the same ``NodeGPUUsage``;
the agent reads it back from its next status write. The records at or below it
are done; the agent keeps the most recent of them in the status while there is
room, for ``vramguard oom`` to list. A record is thus published at least once: an
operator restart between publishing and acknowledging repeats the Event (the
API server counts repeats of one Event), and an agent restart re-reads the
records from its own report before writing (``docs/oom.md``).

Ids grow: microseconds since the epoch at detection, kept above the last id.
The records carry measurements only; the verdict is the operator's
(``vramguard_api.oom.classify``), which adds the pod's exit status, limits and
shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from .meta import APIModel
from .units import MAX_BYTES

ACK_ANNOTATION = "vramguard.io/ends-acknowledged"
MAX_END_RECORDS = 64
MAX_END_NEIGHBOURS = 16
MAX_END_PIDS = 16

EndKind = Literal["ProcessExit", "ContainerEnd", "CgroupOOMKill"]


class EndNeighbour(APIModel):
    """Another pod on the device when the end was noticed."""

    uid: str = Field(max_length=64, description="Pod UID (or a static pod's config hash).")
    namespace: str | None = Field(default=None, max_length=63, description="Pod namespace.")
    name: str | None = Field(default=None, max_length=253, description="Pod name.")
    used_bytes: int | None = Field(default=None, alias="usedBytes", ge=0, le=MAX_BYTES,
                                   description="Its VRAM on the device, bytes.")


class EndDevice(APIModel):
    """One device the ended pod or process used, as last sampled."""

    uuid: str = Field(max_length=128, description="Device UUID.")
    pod_bytes: int | None = Field(default=None, alias="podBytes", ge=0, le=MAX_BYTES,
                                  description="The pod's VRAM on the device, bytes.")
    process_bytes: int | None = Field(default=None, alias="processBytes", ge=0, le=MAX_BYTES,
                                      description="The ended processes' VRAM on the device, bytes.")
    step_bytes: int | None = Field(default=None, alias="stepBytes", ge=0, le=MAX_BYTES,
                                   description="The pod's largest rise between two samples on the device, bytes.")
    free_bytes: int | None = Field(default=None, alias="freeBytes", ge=0, le=MAX_BYTES,
                                   description="The device's free memory, bytes.")
    usable_bytes: int | None = Field(default=None, alias="usableBytes", ge=0, le=MAX_BYTES,
                                     description="The device's usable memory (total - reserved), bytes.")
    neighbours: list[EndNeighbour] = Field(default_factory=list, max_length=MAX_END_NEIGHBOURS,
                                           description="Other pods on the device, largest first.")


class EndRecord(APIModel):
    """One end: a GPU process that left NVML's list (``ProcessExit``), a
    container that is gone (``ContainerEnd``), or a cgroup OOM kill in a
    container that kept running (``CgroupOOMKill``)."""

    id: int = Field(ge=0, description="Grows; microseconds since the epoch at detection.")
    time: datetime = Field(description="When the agent noticed the end (the sample after it).")
    kind: EndKind = Field(description="ProcessExit, ContainerEnd or CgroupOOMKill.")
    pod_uid: str = Field(alias="podUID", max_length=64, description="Pod UID (or a static pod's config hash).")
    namespace: str | None = Field(default=None, max_length=63, description="Pod namespace, from the API.")
    name: str | None = Field(default=None, max_length=253, description="Pod name, from the API.")
    container_id: str | None = Field(default=None, alias="containerID", max_length=128,
                                     description="Runtime container id (64 hex).")
    container_name: str | None = Field(default=None, alias="containerName", max_length=253,
                                       description="Container name, from the API.")
    pids: list[int] = Field(default_factory=list, max_length=MAX_END_PIDS, description="Host PIDs that ended.")
    devices: list[EndDevice] = Field(default_factory=list, max_length=64, description="Its devices, as last sampled.")
    ram_working_set_bytes: int | None = Field(default=None, alias="ramWorkingSetBytes", ge=0, le=MAX_BYTES,
                                              description="The container's (else the pod's) RAM working set.")
    oom_kills_before: int | None = Field(default=None, alias="oomKillsBefore", ge=0,
                                         description="The pod cgroup's oom_kill counter last seen before the end.")
    oom_kills_after: int | None = Field(default=None, alias="oomKillsAfter", ge=0,
                                        description="The same counter after it (None: the pod's cgroup is gone).")

    @property
    def oom_kills_delta(self) -> int:
        """How much the pod's OOM-kill counter rose across the end (0 when unknown)."""
        if self.oom_kills_before is None or self.oom_kills_after is None:
            return 0
        return max(0, self.oom_kills_after - self.oom_kills_before)


def acknowledged_id(obj: Mapping[str, Any] | None) -> int:
    """The id in a ``NodeGPUUsage``'s ``ACK_ANNOTATION`` (0 when absent or not a
    non-negative integer: nothing acknowledged, so nothing is dropped)."""
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(ACK_ANNOTATION, ""))
    return int(value) if value.isdigit() else 0


def ends_of(obj: Mapping[str, Any] | None) -> list[EndRecord]:
    """The end records in a ``NodeGPUUsage`` object's status; a record the model
    refuses is skipped (one bad item leaves the rest intact)."""
    records = []
    for raw in ((obj or {}).get("status") or {}).get("ends") or []:
        try:
            records.append(EndRecord.model_validate(raw))
        except ValueError:
            continue
    return records
