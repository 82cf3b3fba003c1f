"""Dynamic Resource Allocation (``resource.k8s.io/v1``): the memory the
scheduler booked for a pod on each GPU, as per-device ``Grants``.

A pod names its ResourceClaims in ``spec.resourceClaims`` (directly, or
through a template whose generated claim is in ``status.resourceClaimStatuses``;
a claim the scheduler made for DRA-backed extended resources is in
``status.extendedResourceClaimStatus``). Each allocation result of a claim
(``status.allocation.devices.results[]``: ``request``, ``driver``, ``pool``,
``device``, ``shareID``, ``consumedCapacity``) names a device published in a
ResourceSlice (``spec.driver``, ``spec.pool.name``, ``spec.devices[].name``),
whose GPU UUID is a device attribute (``uuid`` as NVIDIA's DRA driver
``gpu.nvidia.com`` and HAMi's ``hami-core-gpu.project-hami.io`` publish it:
kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go,
mig.go; Project-HAMi/k8s-dra-driver cmd/hami-kubelet-plugin/hami_core.go).

- Consumed ``memory`` (consumable capacity, on devices with
  ``allowMultipleAllocations``; the API fills ``consumedCapacity`` only for
  those) is the pod's limit on that UUID, source ``dra/<claim>``; several
  results of one claim on one device add up.
- No consumed memory (a whole device, or a driver's share without a memory
  request, which books none) sets no limit: the device is the bound. On a
  device that allows multiple allocations this is a ``MalformedAllocation``
  problem (the pod shares the device but booked no memory on it).
- The NVIDIA DRA driver's MPS pinned device memory limits in the claim's
  ``GpuConfig``/``MigDeviceConfig`` (``dra_config.py``) are a limit on each
  device they apply to, per pod (each pod is one MPS client), source
  ``dra/<claim>``; with consumed memory too, the smaller.
- A MIG device is published with its own (MIG) UUID and memory; allocated
  whole, that memory (its ``memory`` capacity, else the size in its
  ``profile`` attribute's name) is its limit, never its parent GPU's.
- A claim reserved for several consumers (``status.reservedFor[]``) books its
  memory for all of them: each pod's limit is the claim's total, and the
  caller adds a budget on their sum (``SharedClaim``).
- A result whose device is in no ResourceSlice (the driver withdrew it) sets
  no limit and is reported; so is a malformed consumed quantity, which drops
  the whole claim (never half-applied).

Only the newest generation of each pool's slices counts (the API's rule for
a pool being republished). Pure: objects are JSON-like dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import InvalidOperation
from typing import Any

from vramguard_api.units import format_bytes, quantity_decimal
from vramguard_operator.policy.dra_config import Allocated, PinnedLimit, pinned_limits
from vramguard_operator.policy.grants import (
    EVENT_ALLOCATED_DEVICE_MISSING,
    EVENT_MALFORMED_ALLOCATION,
    EffectiveLimit,
    Grant,
    Grants,
    PodProblem,
)
from vramguard_operator.policy.node import MIG_NAME_GB

DEFAULT_UUID_ATTRIBUTE = "uuid"
DEFAULT_MEMORY_CAPACITY = "memory"


@dataclass(frozen=True, slots=True)
class DRAConfig:
    """Which device attribute holds a GPU's UUID and which capacity is its
    memory (both qualified by the driver's name when unqualified, as the API
    resolves them)."""

    uuid_attribute: str = DEFAULT_UUID_ATTRIBUTE
    memory_capacity: str = DEFAULT_MEMORY_CAPACITY


@dataclass(frozen=True, slots=True)
class SlicedDevice:
    """A device of a ResourceSlice: its GPU UUID (None: not a GPU), its memory
    capacity in bytes (None when not published), its node, and whether it
    allows multiple allocations (``allowMultipleAllocations``: shared, booked
    through ``consumedCapacity``)."""

    uuid: str | None
    memory: int | None
    node: str | None
    shared: bool = False
    kind: str | None = None  # the driver's ``type`` attribute: gpu, mig
    profile: str | None = None  # a MIG device's ``profile`` attribute (``1g.10gb``)

    @property
    def is_mig(self) -> bool:
        """Whether the device is a MIG device (its ``type``, else its UUID)."""
        return self.kind == "mig" or (self.uuid or "").startswith("MIG-")

    def own_memory(self) -> tuple[int, str] | None:
        """A MIG device's own memory and where it was read: the slice's memory
        capacity, else the nominal size in its profile's name (``1g.10gb``:
        10·10⁹ bytes); None for a GPU or when neither is published."""
        if not self.is_mig:
            return None
        if self.memory:
            return self.memory, "ResourceSlice capacity"
        m = MIG_NAME_GB.search(self.profile or "")
        return (int(m.group(1)) * 10**9, f"profile {self.profile}") if m else None


@dataclass(frozen=True, slots=True)
class SharedClaim:
    """A claim reserved for several consumers: ``bytes`` of memory booked in
    total over ``pod_uids`` (the pods among its consumers), on ``devices``."""

    namespace: str
    name: str
    uid: str
    bytes: int
    pod_uids: tuple[str, ...]
    devices: tuple[str, ...]
    consumers: int


@dataclass(frozen=True, slots=True)
class ClaimGrants:
    """What a set of pods' claims grant: ``grants`` by pod uid, the claims
    shared by several consumers, and the GPU devices each pod holds through
    its claims (by pod uid), whole or shared."""

    grants: Mapping[str, Grants] = field(default_factory=dict)
    shared: tuple[SharedClaim, ...] = ()
    devices: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _attribute(attrs: Mapping[str, Any], driver: str, name: str) -> Any:
    """An attribute's value: ``name`` as written, else qualified by the driver."""
    value = attrs.get(name)
    if value is None and "/" not in name:
        value = attrs.get(f"{driver}/{name}")
    if isinstance(value, Mapping):
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                return value[kind]
    return None


def _bytes(raw: Any) -> int | None:
    try:
        value = quantity_decimal(raw)
    except (ValueError, TypeError, InvalidOperation):
        return None
    return int(value) if value >= 0 else None


def device_index(slices: Iterable[Mapping[str, Any]], config: DRAConfig = DRAConfig()) -> dict[tuple[str, str, str], SlicedDevice]:
    """(driver, pool, device name) -> ``SlicedDevice`` over ResourceSlices (dicts),
    keeping only each pool's newest generation."""
    newest: dict[tuple[str, str], int] = {}
    specs = [s.get("spec") or {} for s in slices]
    for spec in specs:
        pool = spec.get("pool") or {}
        key = (spec.get("driver") or "", pool.get("name") or "")
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    out: dict[tuple[str, str, str], SlicedDevice] = {}
    for spec in specs:
        driver, pool = spec.get("driver") or "", spec.get("pool") or {}
        if int(pool.get("generation") or 0) != newest[(driver, pool.get("name") or "")]:
            continue
        for dev in spec.get("devices") or ():
            uuid = _attribute(dev.get("attributes") or {}, driver, config.uuid_attribute)
            kind = _attribute(dev.get("attributes") or {}, driver, "type")
            profile = _attribute(dev.get("attributes") or {}, driver, "profile")
            cap = (dev.get("capacity") or {}).get(config.memory_capacity) or {}
            out[(driver, pool.get("name") or "", dev.get("name") or "")] = SlicedDevice(
                uuid if isinstance(uuid, str) and uuid else None,
                _bytes(cap.get("value")),
                spec.get("nodeName"),
                dev.get("allowMultipleAllocations") is True,
                kind if isinstance(kind, str) else None,
                profile if isinstance(profile, str) else None,
            )
    return out


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the ResourceClaims a pod uses, in its namespace."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()}
    names = []
    for rc in spec.get("resourceClaims") or ():
        name = rc.get("resourceClaimName") or generated.get(rc.get("name"))
        if name:
            names.append(name)
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        names.append(extended)
    return names


@dataclass
class _Claim:
    """One allocated claim, resolved against the slices."""

    memory: dict[str, int] = field(default_factory=dict)  # uuid -> consumed bytes
    where: dict[str, str] = field(default_factory=dict)  # uuid -> "gpu-0 (driver, pool x)"
    whole: set[str] = field(default_factory=set)  # uuids allocated without consumed memory
    pinned: dict[str, PinnedLimit] = field(default_factory=dict)  # uuid -> MPS pinned limit (dra_config)
    own: dict[str, tuple[int, str]] = field(default_factory=dict)  # whole MIG uuid -> its memory, basis
    problems: list[PodProblem] = field(default_factory=list)


def _resolve(claim: Mapping[str, Any], devices: Mapping[tuple[str, str, str], SlicedDevice], config: DRAConfig) -> _Claim:
    meta = claim.get("metadata") or {}
    label = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    out = _Claim()
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    gpus: list[Allocated] = []
    for r in results:
        driver, pool, name = r.get("driver") or "", r.get("pool") or "", r.get("device") or ""
        consumed = (r.get("consumedCapacity") or {}).get(config.memory_capacity)
        memory = None if consumed is None else _bytes(consumed)
        if consumed is not None and memory is None:
            text = f"{label}: consumedCapacity.{config.memory_capacity}={consumed!r} on device {name} is not a quantity; no limit from this claim"
            return _Claim(problems=[PodProblem(EVENT_MALFORMED_ALLOCATION, text)])
        dev = devices.get((driver, pool, name))
        if dev is None:
            if memory:
                text = (
                    f"{label}: device {name} (driver {driver}, pool {pool}, request {r.get('request')}) "
                    f"is in no ResourceSlice; its {format_bytes(memory)} sets no limit"
                )
                out.problems.append(PodProblem(EVENT_ALLOCATED_DEVICE_MISSING, text))
            continue
        if dev.uuid is None:
            continue  # not a GPU (no UUID attribute)
        gpus.append(Allocated(r.get("request") or "", driver, name, dev.uuid, dev.kind))
        out.where.setdefault(dev.uuid, f"{name} ({driver}, pool {pool})")
        if not memory:
            if dev.shared and consumed is None:
                out.problems.append(PodProblem(EVENT_MALFORMED_ALLOCATION, _unbooked(label, name, r, config)))
            out.whole.add(dev.uuid)
            size = dev.own_memory()
            if size is not None:
                out.own[dev.uuid] = size
            continue
        out.memory[dev.uuid] = out.memory.get(dev.uuid, 0) + memory
    out.pinned, unread = pinned_limits(claim, gpus)
    out.problems += [PodProblem(EVENT_MALFORMED_ALLOCATION, f"{label}: {p}; no MPS limit from this config") for p in unread]
    return out


def _unbooked(label: str, name: str, result: Mapping[str, Any], config: DRAConfig) -> str:
    return (
        f"{label}: result for request {result.get('request')} on device {name}, which allows multiple "
        f"allocations, has no consumedCapacity.{config.memory_capacity}: wanted the memory the claim books "
        "there; the device is taken as the pod's whole bound"
    )


def claim_grants(
    pods: Iterable[Mapping[str, Any]],
    claims: Mapping[tuple[str, str], Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    config: DRAConfig = DRAConfig(),
) -> ClaimGrants:
    """The grants of each pod's allocated claims (``claims``: by (namespace, name)).
    A claim not yet created or allocated grants nothing and is no problem."""
    devices = device_index(slices, config)
    resolved: dict[tuple[str, str], _Claim] = {}
    grants: dict[str, Grants] = {}
    held: dict[str, frozenset[str]] = {}
    users: dict[tuple[str, str], list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        ns, uid = meta.get("namespace") or "", meta.get("uid") or ""
        parts: list[Grant] = []
        problems: list[PodProblem] = []
        mine: set[str] = set()
        for name in pod_claim_names(pod):
            claim = claims.get((ns, name))
            if claim is None:
                continue
            if (ns, name) not in resolved:
                resolved[(ns, name)] = _resolve(claim, devices, config)
            r = resolved[(ns, name)]
            users.setdefault((ns, name), []).append(uid)
            problems += r.problems
            mine |= set(r.memory) | r.whole
            if r.memory or r.pinned or r.own:
                parts.append(Grant(devices=_limits(name, r, _consumers(claim))))
        held[uid] = frozenset(mine)
        if parts or problems:
            grants[uid] = Grants(tuple(parts), tuple(problems))
    shared = _shared(claims, resolved, users)
    return ClaimGrants(grants, shared, held)


def _consumers(claim: Mapping[str, Any]) -> int:
    return len((claim.get("status") or {}).get("reservedFor") or ())


def _limits(name: str, r: _Claim, consumers: int) -> dict[str, EffectiveLimit]:
    """Per device: the memory the claim consumed there, or a whole MIG device's
    own memory, or its MPS pinned limit (each pod is one MPS client: the limit
    is per pod, shared claim or not), the smaller when several are set."""
    out = {}
    for uuid, memory in r.memory.items():
        detail = f"{format_bytes(memory)} consumed on {r.where[uuid]}"
        if consumers > 1:
            detail += f"; shared by {consumers} consumers: their total"
        out[uuid] = EffectiveLimit(memory, f"dra/{name}", detail)
    for uuid, (size, basis) in r.own.items():
        if uuid not in out:
            out[uuid] = EffectiveLimit(size, f"dra/{name}", f"whole MIG device {r.where[uuid]}: {format_bytes(size)} ({basis})")
    for uuid, pinned in r.pinned.items():
        if uuid not in out or pinned.bytes < out[uuid].bytes:
            out[uuid] = EffectiveLimit(pinned.bytes, f"dra/{name}", f"{pinned.detail} on {r.where[uuid]}")
    return out


def _shared(
    claims: Mapping[tuple[str, str], Mapping[str, Any]],
    resolved: Mapping[tuple[str, str], _Claim],
    users: Mapping[tuple[str, str], list[str]],
) -> tuple[SharedClaim, ...]:
    out = []
    for key, r in sorted(resolved.items()):
        claim = claims[key]
        consumers = _consumers(claim)
        if consumers < 2 or not r.memory:
            continue
        uid = (claim.get("metadata") or {}).get("uid") or ""
        pods = tuple(sorted(set(users.get(key, ()))))
        out.append(SharedClaim(key[0], key[1], uid, sum(r.memory.values()), pods, tuple(sorted(r.memory)), consumers))
    return tuple(out)
