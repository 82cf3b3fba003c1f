"""Simulation scenarios: nodes, GPUs, pods and their memory over time, faults.

A scenario is a YAML file (see examples/scenarios/ and docs/agent.md):

    nodes:
    - name: gpu-h100-ts
      gpus: [{model: NVIDIA H100 80GB HBM3, count: 8, memory: 81559Mi, reserved: 579Mi}]
      pods:
      - namespace: ml-serving
        name: llm-chat-0
        containers:
        - name: server
          ram: 12Gi
          processes:
          - {gpu: 0, memory: {linear: {start: 18Gi, perHour: 1Gi}}}
      faults:
      - {type: gpu-lost, gpu: 7, from: 30m, until: 32m}

Memory is a *profile*: a quantity (constant) or one of ``constant``,
``linear`` (start + perHour * t, optionally capped at max), ``ramp`` (from → to
over a duration starting ``after``), ``sawtooth`` (low → high each period),
``steps`` (a value from each ``at`` on) and ``sum`` (of profiles). Times are
Go-style durations from the start of the simulation.

A profile is what a process *wants*; the simulated device decides what it
*gets* (``simgpu``): an allocation that does not fit in the device's free
memory fails and the process dies with an out-of-memory error; its container
restarts as the pod's ``restartPolicy`` says, and a restarted process plays its
profile from the beginning.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vramguard_api.cliargs import one_line
from vramguard_api.explain import validation_error
from vramguard_api.kubelet import RestartPolicy
from vramguard_api.units import parse_duration, quantity_to_bytes

FaultType = Literal[
    "gpu-lost",
    "nvml-unavailable",
    "not-available",
    "hide-processes",
    "mig-listing-not-supported",
    "mig-parent-no-permission",
    "no-v3",
    "no-memory-v2",
]
VIRTUALIZATION = {"None": 0, "Passthrough": 1, "VGPU": 2, "HostVGPU": 3, "HostVSGA": 4}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _bytes(value: Any, field: str) -> int:
    return quantity_to_bytes(value if isinstance(value, int) else str(value), field=field)


def _seconds(value: Any, field: str) -> float:
    if isinstance(value, int | float):
        return float(value)
    return parse_duration(str(value), field=field)


Bytes = Annotated[int, Field(ge=0)]


class Profile(_Model):
    """Memory (bytes) as a function of simulation time (seconds)."""

    kind: str
    params: dict[str, Any] = Field(default_factory=dict)
    parts: list[Profile] = Field(default_factory=list)

    @classmethod
    def parse(cls, value: Any, field: str = "memory") -> Profile:
        """Build a profile from its YAML form; raises ``ValueError`` naming ``field``."""
        if isinstance(value, Profile):
            return value
        if isinstance(value, int | str):
            return cls(kind="constant", params={"value": _bytes(value, field)})
        if not isinstance(value, dict) or len(value) != 1:
            raise ValueError(f"{field}: want a quantity or a mapping with one profile kind, got {value!r}")
        ((kind, spec),) = value.items()
        parser = _PARSERS.get(kind)
        if parser is None:
            raise ValueError(f"{field}: unknown profile {kind!r} (want one of {', '.join(_PARSERS)})")
        return parser(spec, f"{field}.{kind}")

    def at(self, t: float) -> int:
        """The value at time ``t`` seconds, bytes (never negative)."""
        return max(0, int(_EVAL[self.kind](self, t)))


def _constant(spec: Any, field: str) -> Profile:
    return Profile(kind="constant", params={"value": _bytes(spec, field)})


def _linear(spec: dict[str, Any], field: str) -> Profile:
    cap = spec.get("max")
    return Profile(
        kind="linear",
        params={
            "start": _bytes(spec.get("start", 0), f"{field}.start"),
            "per_s": _bytes(spec["perHour"], f"{field}.perHour") / 3600.0,
            "max": None if cap is None else _bytes(cap, f"{field}.max"),
        },
    )


def _ramp(spec: dict[str, Any], field: str) -> Profile:
    return Profile(
        kind="ramp",
        params={
            "from": _bytes(spec.get("from", 0), f"{field}.from"),
            "to": _bytes(spec["to"], f"{field}.to"),
            "over": max(1e-9, _seconds(spec["over"], f"{field}.over")),
            "after": _seconds(spec.get("after", 0), f"{field}.after"),
        },
    )


def _sawtooth(spec: dict[str, Any], field: str) -> Profile:
    return Profile(
        kind="sawtooth",
        params={
            "low": _bytes(spec["low"], f"{field}.low"),
            "high": _bytes(spec["high"], f"{field}.high"),
            "period": max(1e-9, _seconds(spec["period"], f"{field}.period")),
        },
    )


def _steps(spec: list[dict[str, Any]], field: str) -> Profile:
    points = sorted((_seconds(s["at"], f"{field}.at"), _bytes(s["value"], f"{field}.value")) for s in spec)
    return Profile(kind="steps", params={"points": points})


def _sum(spec: list[Any], field: str) -> Profile:
    return Profile(kind="sum", parts=[Profile.parse(p, f"{field}[{i}]") for i, p in enumerate(spec)])


_PARSERS = {
    "constant": _constant,
    "linear": _linear,
    "ramp": _ramp,
    "sawtooth": _sawtooth,
    "steps": _steps,
    "sum": _sum,
}


def _eval_linear(p: Profile, t: float) -> float:
    value = p.params["start"] + p.params["per_s"] * t
    return value if p.params["max"] is None else min(value, p.params["max"])


def _eval_ramp(p: Profile, t: float) -> float:
    progress = min(1.0, max(0.0, (t - p.params["after"]) / p.params["over"]))
    return p.params["from"] + (p.params["to"] - p.params["from"]) * progress


def _eval_sawtooth(p: Profile, t: float) -> float:
    phase = math.fmod(max(0.0, t), p.params["period"]) / p.params["period"]
    return p.params["low"] + (p.params["high"] - p.params["low"]) * phase


def _eval_steps(p: Profile, t: float) -> float:
    value = 0
    for at, v in p.params["points"]:
        if t >= at:
            value = v
    return value


_EVAL = {
    "constant": lambda p, t: p.params["value"],
    "linear": _eval_linear,
    "ramp": _eval_ramp,
    "sawtooth": _eval_sawtooth,
    "steps": _eval_steps,
    "sum": lambda p, t: sum(part.at(t) for part in p.parts),
}


def _profile_field(value: Any, info: Any) -> Profile:
    return Profile.parse(value, info.field_name)


class Window(_Model):
    """A time window ``[from, until)`` in seconds from the start."""

    start: float = Field(default=0.0, alias="from")
    until: float = math.inf

    @field_validator("start", "until", mode="before")
    @classmethod
    def _duration(cls, value: Any, info: Any) -> float:
        return _seconds(value, info.field_name)

    def active(self, t: float) -> bool:
        """True while ``start <= t < until``."""
        return self.start <= t < self.until


class SimProcess(Window):
    """A GPU process of a container (or of the host): memory on one GPU or MIG device."""

    gpu: int = Field(ge=0)
    mig: int | None = Field(default=None, ge=0, description="Index in the GPU's mig list.")
    memory: Profile
    kind: Literal["compute", "graphics", "mps"] = "compute"
    pid: int | None = Field(default=None, gt=0)

    _profile = field_validator("memory", mode="before")(_profile_field)


class SimContainer(_Model):
    """A container: RAM working set, page cache, OOM kills and GPU processes."""

    name: str
    ram: Profile = Field(default_factory=lambda: Profile.parse(0))
    page_cache: Profile = Field(default_factory=lambda: Profile.parse(0), alias="pageCache")
    oom_kills: int = Field(default=0, ge=0, alias="oomKills")
    processes: list[SimProcess] = Field(default_factory=list)

    _profiles = field_validator("ram", "page_cache", mode="before")(_profile_field)


class SimPod(_Model):
    """A pod on the node, referred to by namespace/name (its uid comes from the API
    server when the agent can see the pod there, else it is derived).

    ``restartPolicy`` says what happens to a container whose GPU process is
    killed by an out-of-memory error (``simgpu``): restarted after the
    kubelet's back-off (``Always``, the pod default, and ``OnFailure``) or left
    exited (``Never``)."""

    namespace: str
    name: str
    uid: str | None = None
    qos: Literal["guaranteed", "burstable", "besteffort"] = "burstable"
    static: bool = False
    restart_policy: RestartPolicy = Field(default="Always", alias="restartPolicy")
    containers: list[SimContainer]


class SimMig(_Model):
    """A MIG device (GPU instance + compute instance)."""

    profile: str
    memory: Bytes
    gpu_instance_id: int | None = Field(default=None, alias="gpuInstanceId")
    compute_instance_id: int = Field(default=0, alias="computeInstanceId")
    overhead: Bytes = 0

    _bytes_fields = field_validator("memory", "overhead", mode="before")(lambda v, info: _bytes(v, info.field_name))


class SimGPU(_Model):
    """One or ``count`` identical GPUs."""

    model: str
    count: int = Field(default=1, ge=1, le=64)
    memory: Bytes
    reserved: Bytes = 0
    overhead: Bytes = 0
    virtualization: Literal["None", "Passthrough", "VGPU", "HostVGPU", "HostVSGA"] = "None"
    mig_capable: bool = Field(default=False, alias="migCapable")
    mig: list[SimMig] | None = None
    uuids: list[str] | None = Field(
        default=None, description="UUIDs of the ``count`` GPUs (default: derived from node and index)."
    )

    _bytes_fields = field_validator("memory", "reserved", "overhead", mode="before")(
        lambda v, info: _bytes(v, info.field_name)
    )

    @model_validator(mode="after")
    def _uuid_count(self) -> SimGPU:
        if self.uuids is not None and len(self.uuids) != self.count:
            raise ValueError(f"uuids: {len(self.uuids)} given for count {self.count}")
        return self


class SimHostProcess(SimProcess):
    """A GPU process outside every pod, with its cgroup path."""

    cgroup: str = Field(pattern=r"^/")


class SimFault(Window):
    """An injected fault during a window; ``gpu`` limits it to one GPU."""

    type: FaultType
    gpu: int | None = Field(default=None, ge=0)
    mig: int | None = Field(default=None, ge=0)


class SimCgroup(_Model):
    """How the node's kubelet and runtime name cgroups."""

    version: Literal[1, 2] = 2
    driver: Literal["systemd", "cgroupfs"] = "systemd"
    runtime: Literal["containerd", "cri-o", "docker"] = "containerd"


class SimNode(_Model):
    """One simulated node."""

    name: str
    driver_version: str = Field(default="550.90.07", alias="driverVersion")
    nvml_privileged: bool = Field(default=True, alias="nvmlPrivileged")
    cgroup: SimCgroup = Field(default_factory=SimCgroup)
    gpus: list[SimGPU]
    pods: list[SimPod] = Field(default_factory=list)
    host_processes: list[SimHostProcess] = Field(default_factory=list, alias="hostProcesses")
    faults: list[SimFault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> SimNode:
        gpus = self.gpu_list()
        processes = [p for pod in self.pods for c in pod.containers for p in c.processes] + list(self.host_processes)
        for i, p in enumerate(processes):
            if p.gpu >= len(gpus):
                raise ValueError(f"nodes[{self.name}] process {i}: gpu {p.gpu} does not exist ({len(gpus)} GPUs)")
            mig = gpus[p.gpu].mig
            if (p.mig is None) != (mig is None) or (p.mig is not None and mig is not None and p.mig >= len(mig)):
                raise ValueError(
                    f"nodes[{self.name}] process {i}: mig {p.mig} does not match GPU {p.gpu}'s MIG devices"
                )
        return self

    def gpu_list(self) -> list[SimGPU]:
        """GPUs expanded by ``count``, in index order."""
        return [g for g in self.gpus for _ in range(g.count)]

    def gpu_uuids(self) -> list[str | None]:
        """The UUID given for each GPU in index order (None where derived)."""
        return [g.uuids[k] if g.uuids else None for g in self.gpus for k in range(g.count)]

    def faults_at(self, t: float) -> list[SimFault]:
        """Faults active at time ``t``."""
        return [f for f in self.faults if f.active(t)]


class Scenario(_Model):
    """A simulation: one or more nodes."""

    nodes: list[SimNode] = Field(min_length=1)

    def node(self, name: str) -> SimNode:
        """The node called ``name``; raises ``KeyError`` listing the known names."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"scenario has no node {name!r} (nodes: {', '.join(n.name for n in self.nodes)})")


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario YAML file; raises ``ValueError`` (one line naming the file,
    the field, the value and what is wanted) or ``OSError`` when it cannot be read."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"--scenario {path}: cannot read it: {err.strerror or err}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"scenario {path}: not YAML: {one_line(str(err))}") from None
    try:
        return Scenario.model_validate(doc)
    except ValidationError as err:
        raise ValueError(f"scenario {path}: {validation_error(err, Scenario)}") from None
