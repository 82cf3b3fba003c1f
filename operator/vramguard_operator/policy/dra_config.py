"""The NVIDIA DRA driver's opaque device configuration of a claim: MPS pinned
device memory limits, which the driver gives each MPS client (each pod) as
its memory limit on a device. Pure: claims are JSON-like dicts.

Formats, all from github.com/NVIDIA/k8s-dra-driver-gpu (now
kubernetes-sigs/dra-driver-nvidia-gpu):

- ``status.allocation.devices.config[]`` (the class's and the claim's configs,
  copied at allocation; the claim spec's ``devices.config[]`` before it is
  allocated): ``{source, requests: [name...], opaque: {driver, parameters}}``
  (the Kubernetes ``DeviceAllocationConfiguration``).
- ``parameters``: ``apiVersion: resource.nvidia.com/v1beta1`` and ``kind``
  ``GpuConfig`` or ``MigDeviceConfig``, each with ``sharing: {strategy,
  mpsConfig}`` (api/nvidia.com/resource/v1beta1: ``GpuSharing``,
  ``MigDeviceSharing`` and ``MpsConfig`` in sharing.go).
  ``strategy: MPS`` reads ``mpsConfig.defaultPinnedDeviceMemoryLimit`` (a
  quantity, for every device of the config) and
  ``mpsConfig.defaultPerDevicePinnedMemoryLimit`` (device UUID, or index among
  the config's devices in allocation order -> quantity; it overrides the
  default: ``MpsPerDevicePinnedMemoryLimit.Normalize``). Each limit is whole
  MiB, rounded down, and must be at least 1 MiB (``limit.Megabyte``).
- Which config applies to an allocation result: the last of the driver's
  configs that names the result's request, else the last with no requests of
  the device's kind (``GpuConfig`` for a ``gpu``, ``MigDeviceConfig`` for a
  ``mig`` device): cmd/gpu-kubelet-plugin/device_state.go
  (``getConfigResultsMap``).

``strategy: TimeSlicing`` sets no memory limit (time-slicing shares time, not
memory) and is not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import InvalidOperation
from typing import Any

from vramguard_api.units import format_bytes, quantity_decimal

NVIDIA_DRIVER = "gpu.nvidia.com"
CONFIG_KINDS = {"GpuConfig": "gpu", "MigDeviceConfig": "mig"}
"""The driver's config kinds with a sharing strategy, and the device type each applies to."""
MiB = 1024**2


@dataclass(frozen=True, slots=True)
class Allocated:
    """One allocation result of a claim on a GPU: its request, driver, device
    name, the device's UUID and type (``gpu``, ``mig``; None: unknown)."""

    request: str
    driver: str
    device: str
    uuid: str
    kind: str | None


@dataclass(frozen=True, slots=True)
class PinnedLimit:
    """An MPS pinned device memory limit on one device: ``bytes`` (whole MiB)
    and the config it came from, in words (``detail``)."""

    bytes: int
    detail: str


def _configs(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    found = (allocation.get("devices") or {}).get("config")
    if found is None:
        found = ((claim.get("spec") or {}).get("devices") or {}).get("config")
    return [c for c in found or () if isinstance(c, Mapping)]


def _applies(config: Mapping[str, Any], result: Allocated) -> bool | None:
    """True: names the result's request; None: a default for its kind; False: not its."""
    opaque = config.get("opaque") or {}
    if opaque.get("driver") != result.driver:
        return False
    requests = config.get("requests") or []
    if result.request in requests or result.request.split("/")[0] in requests:
        return True
    kind = CONFIG_KINDS.get(str((opaque.get("parameters") or {}).get("kind")))
    if not requests and (result.kind is None or kind == result.kind):
        return None
    return False


def _config_of(configs: Sequence[Mapping[str, Any]], result: Allocated) -> int | None:
    """The index of the config the driver applies to ``result`` (None: none)."""
    default = None
    for i in range(len(configs) - 1, -1, -1):
        found = _applies(configs[i], result)
        if found is True:
            return i
        if found is None and default is None:
            default = i
    return default


def _mib(raw: Any) -> int | None:
    try:
        value = int(quantity_decimal(raw)) // MiB
    except (ValueError, TypeError, InvalidOperation):
        return None
    return value if value >= 1 else None


def pinned_limits(
    claim: Mapping[str, Any], results: Sequence[Allocated]
) -> tuple[dict[str, PinnedLimit], list[str]]:
    """The MPS pinned device memory limit on each device UUID of ``results``
    (the claim's GPU results, in allocation order) from the claim's configs,
    and the problems: one line per config that cannot be read (its limits
    are all dropped: never half-applied), naming the field, the value and
    what is wanted."""
    configs = _configs(claim)
    groups: dict[int, list[str]] = {}
    for r in results:
        i = _config_of(configs, r)
        if i is not None:
            groups.setdefault(i, []).append(r.uuid)
    out: dict[str, PinnedLimit] = {}
    problems: list[str] = []
    for i, uuids in sorted(groups.items()):
        found = _mps_limits(configs[i], i, uuids)
        if isinstance(found, str):
            problems.append(found)
        else:
            out |= found
    return out, problems


def _mps_limits(config: Mapping[str, Any], index: int, uuids: list[str]) -> dict[str, PinnedLimit] | str:
    params = (config.get("opaque") or {}).get("parameters") or {}
    kind = params.get("kind")
    sharing = params.get("sharing") or {}
    if kind not in CONFIG_KINDS or sharing.get("strategy") != "MPS":
        return {}
    mps = sharing.get("mpsConfig") or {}
    where = f"devices.config[{index}] ({kind}) sharing.mpsConfig"
    limits: dict[str, PinnedLimit] = {}
    default = mps.get("defaultPinnedDeviceMemoryLimit")
    if default is not None:
        mib = _mib(default)
        if mib is None:
            return f"{where}.defaultPinnedDeviceMemoryLimit={default!r}: wanted a quantity of at least 1Mi"
        limits = {u: PinnedLimit(mib * MiB, f"MPS pinned limit {format_bytes(mib * MiB)} ({where}.defaultPinnedDeviceMemoryLimit)") for u in uuids}
    per_device = mps.get("defaultPerDevicePinnedMemoryLimit") or {}
    if not isinstance(per_device, Mapping):
        return f"{where}.defaultPerDevicePinnedMemoryLimit={per_device!r}: wanted a map of device UUID or index to quantity"
    for key, raw in per_device.items():
        uuid = key if key in uuids else (uuids[int(key)] if str(key).isdigit() and int(key) < len(uuids) else None)
        mib = _mib(raw)
        if uuid is None or mib is None:
            return (
                f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]={raw!r}: wanted one of the config's "
                f"devices (UUID or index below {len(uuids)}) and a quantity of at least 1Mi"
            )
        limits[uuid] = PinnedLimit(mib * MiB, f"MPS pinned limit {format_bytes(mib * MiB)} ({where}.defaultPerDevicePinnedMemoryLimit[{key}])")
    return limits
