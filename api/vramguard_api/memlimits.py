"""Driver-enforced GPU memory limits: the contract between the operator and the node agent.

NVIDIA's driver (r615+, MPS v3 memory partitioning, cgroup v2, not MIG) holds a
**hard** and a **soft** limit per cgroup and device, set through NVML's
``nvmlDeviceSetMemoryLimits_v1`` (bytes; ``softLimit=0`` and
``hardLimit=NVML_DEVICE_MEMORY_LIMIT_MAX`` mean none). The operator decides the
limits a pod should have and writes them on the pod, in the annotation
``vramguard.io/memory-limits``; the pod's node agent applies them to the pod's
cgroup and reports what the driver holds in ``NodeGPUUsage``.

The annotation is compact JSON, one entry per GPU UUID, in bytes, with NVML's
field names::

    vramguard.io/memory-limits: '{"GPU-8f0e…":{"hardLimit":21474836480},"GPU-1a2b…":{"softLimit":10737418240}}'

- ``hardLimit``: allocations that would take the pod above it fail with
  out-of-memory (absent: no hard limit);
- ``softLimit``: the pod may go above it, but under real memory pressure a pod
  above its soft limit is the first the driver evicts (absent: 0, none).

Each entry sets at least one limit; ``MIN_HARD_LIMIT_BYTES`` (256 MiB) ``<=
hardLimit <= MAX_LIMIT_BYTES`` (8Pi, as every byte count of the API),
``0 <= softLimit <= hardLimit``; at most ``MAX_DEVICES``
entries; keys are GPU UUIDs (``GPU-…``: MIG devices cannot carry limits). An
annotation that breaks any rule is refused whole (``MemoryLimitsError`` names
the annotation, the device and the value): nothing of it is applied.

Both sides use this module: ``format_memory_limits`` writes the annotation,
``parse_memory_limits`` reads it. The ``REASON_*`` constants are the reasons the
agent reports for a device's support and for each pod's limit state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .units import MAX_BYTES
from .usage import MAX_DEVICES

MEMORY_LIMITS_ANNOTATION = "vramguard.io/memory-limits"

# nvidia-ml-py's NVML_DEVICE_MEMORY_LIMIT_MAX (nvml.h): "no hard limit". Repeated
# here because vramguard_api does not import pynvml; a unit test checks they agree.
NVML_DEVICE_MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
MIB = 1024 * 1024
# A hard limit below a CUDA context (a few hundred MiB) makes every CUDA start in
# the pod fail: refuse it as a mistake rather than apply it.
MIN_HARD_LIMIT_BYTES = 256 * MIB
# 8Pi, the API's largest byte count (docs/bounds.md): far above any GPU, and held
# exactly by every client.
MAX_LIMIT_BYTES = MAX_BYTES
MAX_ANNOTATION_LENGTH = 8192
_GPU_UUID = re.compile(r"^GPU-[0-9A-Fa-f-]{1,124}$")

# Why a device does or does not support per-cgroup memory limits (GPUDevice.memoryLimitsReason).
REASON_PROBE_SUCCEEDED = "ProbeSucceeded"  # nvmlDeviceGetMemoryLimits_v1 answered
REASON_LIBRARY_TOO_OLD = "LibraryTooOld"  # nvidia-ml-py without the functions (< 13.615)
REASON_MIG_DEVICE = "MIGDevice"  # MIG handles are not supported
REASON_MIG_ENABLED = "MIGEnabled"  # a GPU in MIG mode runs MIG devices only
REASON_CGROUP_V2_REQUIRED = "CgroupV2Required"  # no unified hierarchy at the cgroup root
REASON_DRIVER_TOO_OLD = "DriverTooOld"  # NVML_ERROR_FUNCTION_NOT_FOUND from a driver older than r615
REASON_FUNCTION_NOT_FOUND = "FunctionNotFound"  # NVML_ERROR_FUNCTION_NOT_FOUND, driver version unknown
REASON_NOT_SUPPORTED = "NotSupported"  # NVML_ERROR_NOT_SUPPORTED
REASON_NO_PERMISSION = "NoPermission"  # NVML_ERROR_NO_PERMISSION (setting limits needs root)
REASON_PROBE_FAILED = "ProbeFailed"  # any other NVML error
# Reasons decided without asking NVML (nothing was called).
STATIC_REASONS = frozenset({REASON_LIBRARY_TOO_OLD, REASON_MIG_DEVICE, REASON_MIG_ENABLED, REASON_CGROUP_V2_REQUIRED})

# Why a pod's limits on a device are in their state (PodMemoryLimit.reason).
REASON_APPLIED = "Applied"  # the driver holds the wanted limits
REASON_ENFORCEMENT_DISABLED = "EnforcementDisabled"  # the agent runs without --enforce-caps
REASON_DEVICE_UNSUPPORTED = "DeviceUnsupported"  # see the device's memoryLimitsReason
REASON_DEVICE_NOT_FOUND = "DeviceNotFound"  # no such GPU on the node
REASON_CGROUP_NOT_FOUND = "CgroupNotFound"  # the pod's cgroup is not (yet) on the node
REASON_SET_FAILED = "SetFailed"  # nvmlDeviceSetMemoryLimits_v1 failed
REASON_GET_FAILED = "GetFailed"  # nvmlDeviceGetMemoryLimits_v1 failed: what the driver holds is unknown
REASON_NOT_HELD = "NotHeld"  # set succeeded, but the driver reads back other limits
REASON_CLEARING = "Clearing"  # limits no longer wanted, being cleared
REASON_TO_APPLY = "ToApply"  # wanted, not applied yet
REASON_ANNOTATION_REFUSED = "AnnotationRefused"  # the annotation is invalid: what is held is kept


def is_gpu_uuid(key: str) -> bool:
    """Whether ``key`` can carry memory limits: a GPU's UUID (``GPU-`` and hex
    digits and dashes, as NVML names GPUs), not a MIG device's."""
    return bool(_GPU_UUID.match(key))


class MemoryLimitsError(ValueError):
    """A memory-limits annotation that breaks the format or a bound (the message names both)."""


@dataclass(frozen=True, slots=True)
class DeviceMemoryLimit:
    """A pod's wanted limits on one device, bytes. ``hard_limit`` None: no hard limit."""

    soft_limit: int = 0
    hard_limit: int | None = None

    @property
    def nvml_hard_limit(self) -> int:
        """The hard limit as NVML takes it: ``NVML_DEVICE_MEMORY_LIMIT_MAX`` for none."""
        return NVML_DEVICE_MEMORY_LIMIT_MAX if self.hard_limit is None else self.hard_limit

    def to_json(self) -> dict[str, int]:
        """The annotation's entry (only what is set)."""
        entry = {"hardLimit": self.hard_limit} if self.hard_limit is not None else {}
        return {**entry, **({"softLimit": self.soft_limit} if self.soft_limit else {})}


def parse_memory_limits(text: str) -> dict[str, DeviceMemoryLimit]:
    """Parse the ``vramguard.io/memory-limits`` value: GPU UUID -> ``DeviceMemoryLimit``.

    Raises ``MemoryLimitsError`` naming the annotation, the device and the value
    for malformed JSON, a key that is not a GPU UUID, an unknown field, a value
    that is not a whole number of bytes, or a bound broken (module docstring).
    """
    if len(text) > MAX_ANNOTATION_LENGTH:
        raise MemoryLimitsError(
            f"{MEMORY_LIMITS_ANNOTATION}: {len(text)} characters, more than {MAX_ANNOTATION_LENGTH}"
        )
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as err:
        raise MemoryLimitsError(f"{MEMORY_LIMITS_ANNOTATION}: not JSON ({err}): {text[:200]!r}") from None
    if not isinstance(raw, dict):
        raise MemoryLimitsError(f"{MEMORY_LIMITS_ANNOTATION}: want an object of GPU UUID -> limits, got {text[:200]!r}")
    if len(raw) > MAX_DEVICES:
        raise MemoryLimitsError(f"{MEMORY_LIMITS_ANNOTATION}: {len(raw)} devices, more than {MAX_DEVICES}")
    return {uuid: _entry(uuid, value) for uuid, value in raw.items()}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"key(s) {', '.join(repeated)} given twice")
    return dict(pairs)


def _entry(uuid: str, value: Any) -> DeviceMemoryLimit:
    where = f"{MEMORY_LIMITS_ANNOTATION}[{uuid!r}]"
    if not is_gpu_uuid(uuid):
        raise MemoryLimitsError(f"{where}: the key is not a GPU UUID (GPU-…; MIG devices cannot carry limits)")
    if not isinstance(value, dict) or not value:
        raise MemoryLimitsError(f"{where}: want an object with hardLimit and/or softLimit, got {value!r}")
    unknown = sorted(set(value) - {"hardLimit", "softLimit"})
    if unknown:
        raise MemoryLimitsError(f"{where}: unknown field(s) {', '.join(unknown)} (known: hardLimit, softLimit)")
    hard, soft = value.get("hardLimit"), value.get("softLimit", 0)
    for name, number in (("hardLimit", hard), ("softLimit", soft)):
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)):
            raise MemoryLimitsError(f"{where}.{name}: want a whole number of bytes, got {number!r}")
    if hard is not None and not MIN_HARD_LIMIT_BYTES <= hard <= MAX_LIMIT_BYTES:
        raise MemoryLimitsError(
            f"{where}.hardLimit: {hard} bytes is outside [{MIN_HARD_LIMIT_BYTES}, {MAX_LIMIT_BYTES}] "
            f"(below {MIN_HARD_LIMIT_BYTES // MIB} MiB no CUDA context fits)"
        )
    if not 0 <= soft <= (MAX_LIMIT_BYTES if hard is None else hard):
        bound = f"hardLimit {hard}" if hard is not None else MAX_LIMIT_BYTES
        raise MemoryLimitsError(f"{where}.softLimit: {soft} bytes is outside [0, {bound}]")
    if hard is None and soft == 0:
        raise MemoryLimitsError(f"{where}: sets no limit (softLimit 0, no hardLimit); leave the device out instead")
    return DeviceMemoryLimit(soft_limit=soft, hard_limit=hard)


def format_memory_limits(limits: Mapping[str, DeviceMemoryLimit]) -> str:
    """The annotation's value: compact JSON sorted by UUID (the same limits always
    give the same text, so an unchanged annotation is never rewritten).

    Raises ``MemoryLimitsError`` when the result would not parse back (a bound
    broken), so that the operator never writes what the agent refuses.
    """
    text = json.dumps({u: limits[u].to_json() for u in sorted(limits)}, separators=(",", ":"))
    if parse_memory_limits(text) != dict(limits):
        raise MemoryLimitsError(f"{MEMORY_LIMITS_ANNOTATION}: {text[:200]} does not round-trip")
    return text


def memory_limits_of(annotations: Mapping[str, str] | None) -> dict[str, DeviceMemoryLimit] | None:
    """A pod's wanted limits from its annotations; None when it has no such annotation.

    Raises ``MemoryLimitsError`` as ``parse_memory_limits``.
    """
    text = (annotations or {}).get(MEMORY_LIMITS_ANNOTATION)
    return None if text is None else parse_memory_limits(text)
