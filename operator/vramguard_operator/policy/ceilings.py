"""A budget against its policies' ceilings: the checks the validating webhook
makes, and the effective limits of a budget that already exists.

A budget created before a policy (or while the webhook was down) can be above a
ceiling; the engine then evaluates it with the ceiling instead (the limit is
lowered, never raised), and the budget's ``status.limitSources`` names the
policy. A ceiling on a level the budget leaves unset is added to it: a ceiling
is a limit teams cannot exceed, whether or not their budget mentions it.

Limits are compared in bytes. A per-device limit given as bytes and a ceiling
given as a fraction (or the other way round) can only be compared on a device;
admission then warns instead of rejecting, and the budget's own value stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.limits import DeviceLimit, MemoryLimit
from vramguard_api.units import format_bytes, quantity_to_bytes
from vramguard_operator.policy.merge import MergedPolicy, Sourced

SOURCE_BUDGET = "budget"


@dataclass(frozen=True, slots=True)
class FieldError:
    """A problem with one field: its path in the object (``spec.limits.perPod.vram``),
    the offending value as written, and a message naming the rule broken."""

    path: str
    value: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True, slots=True)
class CeilingCheck:
    """Result of checking a budget's limits against the ceilings: ``errors``
    reject it; ``warnings`` are returned to the client and the budget is
    admitted."""

    errors: tuple[FieldError, ...] = ()
    warnings: tuple[str, ...] = ()


def _ceiling_text(path: str, sourced: Sourced[int] | Sourced[float], value: str) -> str:
    return f"ceiling {path} {value} of GPUMemoryPolicy {sourced.policy}"


def check_ceilings(budget: GPUMemoryBudget, merged: MergedPolicy) -> CeilingCheck:
    """Compare every limit of ``budget`` with the ceiling of the same path.

    A limit above its ceiling is an error at ``spec.limits.<path>`` whose message
    names the ceiling, its value and the policy, e.g. ``100Gi is above the
    ceiling perPod.vram 80Gi of GPUMemoryPolicy team-ceilings``.
    """
    lim = budget.spec.limits
    errors: list[FieldError] = []
    warnings: list[str] = []
    for path, mem, ceiling_vram, ceiling_ram in (
        ("perPod", lim.per_pod, merged.ceiling_pod_vram, merged.ceiling_pod_ram),
        ("total", lim.total, merged.ceiling_total_vram, merged.ceiling_total_ram),
    ):
        for kind, ceiling in (("vram", ceiling_vram), ("ram", ceiling_ram)):
            value = None if mem is None else getattr(mem, kind)
            if ceiling is None:
                continue
            if value is None:
                warnings.append(
                    f"spec.limits.{path}.{kind} is unset: the "
                    f"{_ceiling_text(f'{path}.{kind}', ceiling, format_bytes(ceiling.value))} applies"
                )
                continue
            err = _above(f"{path}.{kind}", value, _bytes(mem, kind), ceiling)
            if err is not None:
                errors.append(err)
    dev_errors, dev_warnings = _check_device(lim.per_device, merged)
    return CeilingCheck(tuple(errors + dev_errors), tuple(warnings + dev_warnings))


def _bytes(mem: MemoryLimit | None, kind: str) -> int:
    assert mem is not None
    value = mem.vram_bytes() if kind == "vram" else mem.ram_bytes()
    assert value is not None
    return value


def _above(path: str, written: str, value: int, ceiling: Sourced[int]) -> FieldError | None:
    if value <= ceiling.value:
        return None
    text = _ceiling_text(path, ceiling, format_bytes(ceiling.value))
    return FieldError(f"spec.limits.{path}", written, f"{written} is above the {text}")


def _check_device(
    dev: DeviceLimit | None, merged: MergedPolicy
) -> tuple[list[FieldError], list[str]]:
    c_vram, c_frac = merged.ceiling_device_vram, merged.ceiling_device_fraction
    if c_vram is None and c_frac is None:
        return [], []
    if dev is None:
        shown = [
            _ceiling_text("perDevice", c, v)
            for c, v in (
                (c_vram, format_bytes(c_vram.value) if c_vram else ""),
                (c_frac, f"{c_frac.value:g}" if c_frac else ""),
            )
            if c is not None
        ]
        return [], [f"spec.limits.perDevice is unset: the {' and the '.join(shown)} applies"]
    errors, warnings = [], []
    if dev.vram is not None:
        value = dev.bytes_for(None) or 0
        if c_vram is not None:
            err = _above("perDevice.vram", dev.vram, value, c_vram)
            errors += [err] if err else []
        if c_frac is not None:
            warnings.append(
                f"spec.limits.perDevice.vram {dev.vram} cannot be compared with the "
                f"{_ceiling_text('perDevice.fraction', c_frac, f'{c_frac.value:g}')} "
                "without a device; the ceiling is not enforced on this budget"
            )
    if dev.fraction is not None:
        if c_frac is not None and dev.fraction > c_frac.value:
            text = _ceiling_text("perDevice.fraction", c_frac, f"{c_frac.value:g}")
            errors.append(
                FieldError(
                    "spec.limits.perDevice.fraction",
                    f"{dev.fraction:g}",
                    f"{dev.fraction:g} is above the {text}",
                )
            )
        if c_vram is not None:
            warnings.append(
                f"spec.limits.perDevice.fraction {dev.fraction:g} cannot be compared with the "
                f"{_ceiling_text('perDevice.vram', c_vram, format_bytes(c_vram.value))} "
                "without a device; the ceiling is not enforced on this budget"
            )
    return errors, warnings


# --- effective limits ------------------------------------------------------------


def effective_budget(
    budget: GPUMemoryBudget, merged: MergedPolicy
) -> tuple[GPUMemoryBudget, dict[str, str]]:
    """The budget as the engine should evaluate it, and where each limit came from.

    Each limit is lowered to its ceiling when the ceiling is smaller, or set to
    the ceiling when the budget leaves it unset; ``total`` first, then ``perPod``
    (at most ``total``), then ``perDevice`` (at most ``perPod.vram``), so the
    result always passes the budget's own consistency rules. Sources are keyed
    by limit path (``perPod.vram``, ``perDevice``, ``total.ram``) with values
    ``budget`` or ``policy/<name>/ceiling``. The input is not modified.
    """
    lim = budget.spec.limits
    sources: dict[str, str] = {}
    total = {
        k: _lower(_get(lim.total, k), c, f"total.{k}", sources)
        for k, c in (("vram", merged.ceiling_total_vram), ("ram", merged.ceiling_total_ram))
    }
    pod = {
        k: _lower(_get(lim.per_pod, k), c, f"perPod.{k}", sources)
        for k, c in (("vram", merged.ceiling_pod_vram), ("ram", merged.ceiling_pod_ram))
    }
    for k in ("vram", "ram"):
        pod[k] = _within(pod[k], total[k], f"perPod.{k}", f"total.{k}", sources)
    device = _device(lim.per_device, merged, pod["vram"], sources)
    limits = {
        "perPod": _mem(pod, lim.per_pod),
        "total": _mem(total, lim.total),
        "perDevice": device,
    }
    spec = budget.spec.model_dump(by_alias=True, exclude_none=True)
    spec["limits"] = {k: v for k, v in limits.items() if v is not None}
    new_spec = type(budget.spec).model_validate(spec)
    return budget.model_copy(update={"spec": new_spec}), sources


def _get(mem: MemoryLimit | None, kind: str) -> int | None:
    if mem is None:
        return None
    return mem.vram_bytes() if kind == "vram" else mem.ram_bytes()


def _lower(
    value: int | None, ceiling: Sourced[int] | None, path: str, sources: dict[str, str]
) -> int | None:
    if ceiling is not None and (value is None or ceiling.value < value):
        sources[path] = f"{ceiling.source}/ceiling"
        return ceiling.value
    if value is not None:
        sources[path] = SOURCE_BUDGET
    return value


def _within(
    value: int | None, upper: int | None, path: str, upper_path: str, sources: dict[str, str]
) -> int | None:
    if value is None or upper is None or value <= upper:
        return value
    sources[path] = sources[upper_path]
    return upper


def _mem(values: dict[str, int | None], original: MemoryLimit | None) -> dict[str, str] | None:
    """Byte values as quantities; an unchanged value keeps the quantity as written."""
    out = {}
    for k, v in values.items():
        if v is not None:
            written = None if original is None else getattr(original, k)
            out[k] = written if written is not None and _get(original, k) == v else str(v)
    return out or None


def _device(
    dev: DeviceLimit | None, merged: MergedPolicy, pod_vram: int | None, sources: dict[str, str]
) -> dict[str, str | float] | None:
    c_vram, c_frac = merged.ceiling_device_vram, merged.ceiling_device_fraction
    out: dict[str, str | float] | None = None
    if dev is not None and dev.vram is not None:
        value = dev.bytes_for(None) or 0
        out, source = {"vram": dev.vram}, SOURCE_BUDGET
        if c_vram is not None and c_vram.value < value:
            out, source = {"vram": str(c_vram.value)}, f"{c_vram.source}/ceiling"
    elif dev is not None and dev.fraction is not None:
        frac, source = dev.fraction, SOURCE_BUDGET
        if c_frac is not None and c_frac.value < frac:
            frac, source = c_frac.value, f"{c_frac.source}/ceiling"
        out = {"fraction": frac}
    elif c_vram is not None:
        out, source = {"vram": str(c_vram.value)}, f"{c_vram.source}/ceiling"
    elif c_frac is not None:
        out, source = {"fraction": c_frac.value}, f"{c_frac.source}/ceiling"
    if out is None:
        return None
    if "vram" in out and pod_vram is not None and quantity_to_bytes(str(out["vram"])) > pod_vram:
        out["vram"], source = str(pod_vram), sources["perPod.vram"]
    sources["perDevice"] = source
    return out
