"""Implicit budgets: the limits of GPU pods that no GPUMemoryBudget selects,
and of pods whose scheduler or device plugin booked their memory, in a form
the engine evaluates like any other budget.

For each such pod (scheduled, not finished, in a namespace that is not exempt)
one GPUMemoryBudget is synthesized in memory, never written to the API:

- name ``default:<pod name>`` (``:`` cannot occur in an object name, so it
  never collides with a real budget), uid ``implicit:<pod uid>``;
- selector ``vramguard.io/implicit-pod: <pod uid>``: the label is added to
  that pod's ``PodFacts`` only (``label_pods``), never to the Pod object;
- limits: ``perDevice.vram`` from ``shares.per_device_limit`` (what another
  system granted the pod, else the policy default or the node's share,
  lowered by ceilings), a limit per device UUID where a grant names the
  device (a DRA claim, a sharer's allocation annotation: ``device_limits``,
  passed to the engine as ``EngineInput.device_limits``) and ``perPod`` from
  the policy defaults;
- enforcement: ``Annotate`` only (a platform default never throttles or
  evicts on its own), in the namespace's effective mode.

A pod that a real budget selects keeps it, and gets an implicit budget only
when something granted it memory: ``allocation:<pod name>``, with the grants'
limits alone (no policy defaults). Both are evaluated, so the stricter limit
acts first: what the scheduler booked holds even under a looser budget.

The engine's decisions and pod annotations for an implicit budget are applied
like any other; its Events go on the pod only and its status is not written
(``is_implicit``). The effective limits and their sources are written to the
pod annotation ``vramguard.io/limits`` (``limits_annotation``), which
``vramguard top`` shows.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vramguard_api.bounds import clamp_limit_bytes
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.steps import Action
from vramguard_api.units import format_bytes
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.policy.grants import EffectiveLimit, Grants
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.request import PodGPURequest
from vramguard_operator.policy.shares import device_limits, per_device_limit, sourced_limit

IMPLICIT_LABEL = "vramguard.io/implicit-pod"
IMPLICIT_NAME_PREFIX = "default:"
ALLOCATION_NAME_PREFIX = "allocation:"
IMPLICIT_UID_PREFIX = "implicit:"
ANNOTATION_LIMITS = "vramguard.io/limits"
"""Effective limits of a pod with an implicit budget, and where each came from:
compact JSON ``{"perDevice": {"limit": "19.8Gi", "bytes": 21265121280,
"source": "node/time-slicing:4", "detail": "..."}, "perDevice[GPU-...]": {...},
"perPod.vram": {...}}``."""


def device_key(uuid: str) -> str:
    """The limit path of one device's limit: ``perDevice[<uuid>]``."""
    return f"perDevice[{uuid}]"


@dataclass(frozen=True, slots=True)
class ImplicitBudget:
    """A synthesized budget for one pod, its limits and their sources (by limit
    path: ``perDevice``, ``perDevice[<uuid>]``, ``perPod.vram``, ``perPod.ram``)."""

    namespace: str
    pod_name: str
    pod_uid: str
    budget: GPUMemoryBudget
    limits: Mapping[str, EffectiveLimit] = field(default_factory=dict)

    @property
    def sources(self) -> dict[str, str]:
        """Source per limit path."""
        return {k: v.source for k, v in self.limits.items()}

    @property
    def device_limits(self) -> dict[str, int]:
        """Bytes per device UUID, for the limits a grant sets on named devices."""
        prefix = device_key("")[:-1]
        return {k[len(prefix) : -1]: clamp_limit_bytes(v.bytes) for k, v in self.limits.items() if k.startswith(prefix)}


MakeImplicit = Callable[
    [Mapping[str, Any], NodeFacts | None, MergedPolicy, Grants | None, bool, bool], "ImplicitBudget | None"
]
"""``implicit_budget``'s signature: (pod, node, merged, grants, selected, claims_gpu)."""


def is_implicit(uid: str | None) -> bool:
    """Whether a budget (by its uid) is an implicit one."""
    return bool(uid) and str(uid).startswith(IMPLICIT_UID_PREFIX)


def pod_limits(
    req: PodGPURequest, node: NodeFacts | None, merged: MergedPolicy, grants: Grants | None = None
) -> dict[str, EffectiveLimit]:
    """The effective limits of a GPU pod with an implicit budget, by limit path.
    No device limit exceeds the per-pod VRAM limit (a pod cannot hold more on
    one device than in total)."""
    granted = grants or Grants()
    out: dict[str, EffectiveLimit] = {}
    pod_vram = sourced_limit(merged.default_pod_vram, "perPod.vram", merged.ceiling_pod_vram)
    pod_ram = sourced_limit(merged.default_pod_ram, "perPod.ram", merged.ceiling_pod_ram)
    device = per_device_limit(req, node, merged, granted)
    devices: dict[str, EffectiveLimit | None] = {"perDevice": device}
    devices |= {device_key(u): v for u, v in device_limits(device, node, merged, granted).items()}
    for key, value in devices.items():
        if value is not None and pod_vram is not None and value.bytes > pod_vram.bytes:
            value = EffectiveLimit(pod_vram.bytes, pod_vram.source, f"perPod.vram; lowered from {value.describe()}")
        if value is not None:
            out[key] = value
    for key, value in (("perPod.vram", pod_vram), ("perPod.ram", pod_ram)):
        if value is not None:
            out[key] = value
    return out


def grants_only(merged: MergedPolicy) -> MergedPolicy:
    """``merged`` without its defaults (ceilings, mode and exemption kept): the
    policy as it applies to a pod that a real budget selects."""
    return replace(
        merged,
        default_pod_vram=None,
        default_pod_ram=None,
        default_device_vram=None,
        default_device_fraction=None,
        share_from_node=None,
    )


def implicit_budget(
    pod: Mapping[str, Any],
    node: NodeFacts | None,
    merged: MergedPolicy,
    grants: Grants | None = None,
    selected: bool = False,
    claims_gpu: bool = False,
) -> ImplicitBudget | None:
    """The implicit budget of one pod (a JSON-like Pod dict), or None when the
    pod uses no GPU, its namespace is exempt, or nothing limits it. ``grants``:
    what DRA claims and sharers granted it; ``selected``: a real budget selects
    it (then only what was granted counts: ``allocation:<pod>``);
    ``claims_gpu``: it holds a GPU through a DRA claim (a GPU pod even when
    the claim books no memory)."""
    meta = pod.get("metadata") or {}
    ns, name, uid = meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or ""
    if merged.exempt or not (ns and name and uid):
        return None
    req = PodGPURequest.from_api(pod)
    if not (req.is_gpu_pod or grants or claims_gpu):
        return None
    limits = pod_limits(req, node, grants_only(merged) if selected else merged, grants)
    if not limits:
        return None
    prefix = ALLOCATION_NAME_PREFIX if selected else IMPLICIT_NAME_PREFIX
    budget = synthesized_budget(prefix + name, ns, IMPLICIT_UID_PREFIX + uid, {IMPLICIT_LABEL: uid}, limits, merged)
    return ImplicitBudget(ns, name, uid, budget, limits)


def synthesized_budget(
    name: str,
    namespace: str,
    uid: str,
    labels: Mapping[str, str],
    limits: Mapping[str, EffectiveLimit],
    merged: MergedPolicy,
) -> GPUMemoryBudget:
    """An in-memory GPUMemoryBudget selecting ``labels`` with the ``perDevice``,
    ``perPod.*`` and ``total.*`` entries of ``limits`` (bytes), laddered
    ``Annotate`` only, in the namespace's effective mode. The same arguments
    give the same object (cached: validating it costs more than the engine's
    evaluation of the pod; callers never change it, ``plan.prepare`` copies it
    to add a status)."""
    device = limits["perDevice"].bytes if "perDevice" in limits else None
    levels = tuple(sorted((k, v.bytes) for k, v in limits.items() if k.startswith(("perPod.", "total."))))
    return _synthesized(name, namespace, uid, tuple(sorted(labels.items())), device, levels, merged.effective_mode)


@functools.lru_cache(maxsize=8192)
def _synthesized(
    name: str,
    namespace: str,
    uid: str,
    labels: tuple[tuple[str, str], ...],
    device: int | None,
    levels: tuple[tuple[str, int], ...],
    mode: str,
) -> GPUMemoryBudget:
    spec_limits: dict[str, Any] = {}
    # A declared grant is the pod author's to write (nvidia.com/gpumem: 1e12): kept
    # within the API's bounds so that the budget always validates.
    if device is not None:
        spec_limits["perDevice"] = {"vram": str(clamp_limit_bytes(device))}
    for level in ("perPod", "total"):
        values = {k.split(".")[1]: str(clamp_limit_bytes(v)) for k, v in levels if k.startswith(level + ".")}
        if values:
            spec_limits[level] = values
    body = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "limits": spec_limits or {"perDevice": {"fraction": 1.0}},
            "enforcement": {"mode": mode, "escalation": [{"action": Action.ANNOTATE, "after": "0s"}]},
        },
    }
    budget = GPUMemoryBudget.model_validate(body)
    if spec_limits:
        return budget
    # Every limit is on a named device (EngineInput.device_limits): the API wants
    # at least one limit in the spec, but a whole-device perDevice would warn on
    # the pod's other devices. In memory only, never written, so the empty
    # limits object the API would refuse is built without its validator.
    empty = type(budget.spec.limits).model_construct()
    return budget.model_copy(update={"spec": budget.spec.model_copy(update={"limits": empty})})


def selected_uids(
    pods: Iterable[Mapping[str, Any]], budgets: Iterable[GPUMemoryBudget]
) -> set[str]:
    """UIDs of the pods that at least one real budget of their namespace selects
    (a budget with a malformed selector selects nothing)."""
    matchers: dict[str, list[Any]] = {}
    for b in budgets:
        try:
            matcher = compile_selector(b.spec.selector)
        except ValueError:
            continue
        matchers.setdefault(b.metadata.namespace or "", []).append(matcher)
    out = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if any(m(labels) for m in matchers.get(meta.get("namespace") or "", ())):
            out.add(meta.get("uid") or "")
    return out


def build_implicit(
    pods: Sequence[Mapping[str, Any]],
    budgets: Sequence[GPUMemoryBudget],
    nodes: Mapping[str, NodeFacts],
    merged: Mapping[str, MergedPolicy],
    grants: Mapping[str, Grants] | None = None,
    claimed: Mapping[str, frozenset[str]] | None = None,
    make: MakeImplicit | None = None,
) -> list[ImplicitBudget]:
    """Implicit budgets for every scheduled, unfinished GPU pod that no budget
    selects, and ``allocation:`` budgets for the selected ones that were granted
    memory. ``merged``: the merged policy per namespace (a namespace missing
    from it gets no defaults: ``MergedPolicy(namespace)``); ``grants``: by pod
    uid; ``claimed``: the GPU UUIDs each pod holds through DRA claims, by uid.
    ``make``: what builds one pod's implicit budget (``implicit_budget``, or
    a cache of it: ``rules.RuleCache.implicit``)."""
    make = make or implicit_budget
    taken = selected_uids(pods, budgets)
    out = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            continue
        uid, ns = meta.get("uid") or "", meta.get("namespace") or ""
        node, policy = nodes.get(spec["nodeName"]), merged.get(ns, MergedPolicy(ns))
        held = bool((claimed or {}).get(uid))
        found = make(pod, node, policy, (grants or {}).get(uid), uid in taken, held)
        if found is not None:
            out.append(found)
    return out


def label_pods(
    pods: Sequence[Any],
    implicit: Iterable[ImplicitBudget],
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[Any, ...]:
    """``PodFacts`` (engine types) with the implicit selector label added to the
    pods that have an implicit budget, and the ``extra`` labels by pod uid (a
    shared claim's: ``claim_budgets``); the others are returned as they are."""
    labels: dict[str, dict[str, str]] = {uid: dict(v) for uid, v in (extra or {}).items()}
    for i in implicit:
        labels.setdefault(i.pod_uid, {})[IMPLICIT_LABEL] = i.pod_uid
    return tuple(replace(p, labels={**p.labels, **labels[p.uid]}) if p.uid in labels else p for p in pods)


def limits_annotation(implicit: ImplicitBudget) -> str:
    """The ``vramguard.io/limits`` value for a pod's implicit budget."""
    body = {
        k: {"limit": format_bytes(v.bytes), "bytes": v.bytes, "source": v.source, "detail": v.detail}
        for k, v in sorted(implicit.limits.items())
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def limits_patches(
    pods: Iterable[Mapping[str, Any]], implicit: Iterable[ImplicitBudget]
) -> dict[tuple[str, str], dict[str, str | None]]:
    """Annotation merge patches, by (namespace, pod name), that bring each pod's
    ``vramguard.io/limits`` up to date: set where it differs, removed (None)
    where the pod no longer has an implicit budget. Pods already right are left out."""
    wanted = {i.pod_uid: limits_annotation(i) for i in implicit}
    out: dict[tuple[str, str], dict[str, str | None]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        have = (meta.get("annotations") or {}).get(ANNOTATION_LIMITS)
        want = wanted.get(meta.get("uid") or "")
        if have != want:
            out[(meta.get("namespace") or "", meta.get("name") or "")] = {ANNOTATION_LIMITS: want}
    return out


def read_limits(annotations: Mapping[str, str] | None) -> dict[str, dict[str, Any]]:
    """Parse a pod's ``vramguard.io/limits`` annotation (for ``vramguard top``);
    empty when absent or malformed."""
    text = (annotations or {}).get(ANNOTATION_LIMITS)
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
