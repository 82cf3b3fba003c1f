"""Implicit budgets: the limits of GPU pods that no GPUMemoryBudget selects,
in a form the engine evaluates like any other budget.

For each such pod (scheduled, not finished, in a namespace that is not exempt)
one GPUMemoryBudget is synthesized in memory, never written to the API:

- name ``default:<pod name>`` (``:`` cannot occur in an object name, so it
  never collides with a real budget), uid ``implicit:<pod uid>``;
- selector ``vramguard.io/implicit-pod: <pod uid>``: the label is added to
  that pod's ``PodFacts`` only (``label_pods``), never to the Pod object;
- limits: ``perDevice.vram`` from ``shares.per_device_limit`` (a budget the
  pod declares for another GPU-sharing system, else the policy default or the
  node's share, lowered by ceilings) and ``perPod`` from the policy defaults;
- enforcement: ``Annotate`` only (a platform default never throttles or
  evicts on its own), in the namespace's effective mode.

The engine's decisions and pod annotations for an implicit budget are applied
like any other; its Events go on the pod only and its status is not written
(``is_implicit``). The effective limits and their sources are written to the
pod annotation ``vramguard.io/limits`` (``limits_annotation``), which
``vramguard top`` shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vramguard_api.bounds import clamp_limit_bytes
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.units import format_bytes
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.request import PodGPURequest
from vramguard_operator.policy.shares import EffectiveLimit, per_device_limit, sourced_limit

IMPLICIT_LABEL = "vramguard.io/implicit-pod"
IMPLICIT_NAME_PREFIX = "default:"
IMPLICIT_UID_PREFIX = "implicit:"
ANNOTATION_LIMITS = "vramguard.io/limits"
"""Effective limits of a pod that no budget selects, and where each came from:
compact JSON ``{"perDevice": {"limit": "19.8Gi", "bytes": 21265121280,
"source": "node/time-slicing:4", "detail": "..."}, "perPod.vram": {...}}``."""


@dataclass(frozen=True, slots=True)
class ImplicitBudget:
    """A synthesized budget for one pod, its limits and their sources."""

    namespace: str
    pod_name: str
    pod_uid: str
    budget: GPUMemoryBudget
    limits: Mapping[str, EffectiveLimit] = field(default_factory=dict)

    @property
    def sources(self) -> dict[str, str]:
        """Source per limit path (``perDevice``, ``perPod.vram``, ``perPod.ram``)."""
        return {k: v.source for k, v in self.limits.items()}


def is_implicit(uid: str | None) -> bool:
    """Whether a budget (by its uid) is an implicit one."""
    return bool(uid) and str(uid).startswith(IMPLICIT_UID_PREFIX)


def pod_limits(
    req: PodGPURequest, node: NodeFacts | None, merged: MergedPolicy
) -> dict[str, EffectiveLimit]:
    """The effective limits of an unselected GPU pod, by limit path. The
    per-device limit never exceeds the per-pod VRAM limit (a pod cannot hold
    more on one device than in total)."""
    out: dict[str, EffectiveLimit] = {}
    pod_vram = sourced_limit(merged.default_pod_vram, "perPod.vram", merged.ceiling_pod_vram)
    pod_ram = sourced_limit(merged.default_pod_ram, "perPod.ram", merged.ceiling_pod_ram)
    device = per_device_limit(req, node, merged)
    if device is not None and pod_vram is not None and device.bytes > pod_vram.bytes:
        device = EffectiveLimit(pod_vram.bytes, pod_vram.source, f"perPod.vram; lowered from {device.describe()}")
    for key, value in (("perDevice", device), ("perPod.vram", pod_vram), ("perPod.ram", pod_ram)):
        if value is not None:
            out[key] = value
    return out


def implicit_budget(
    pod: Mapping[str, Any], node: NodeFacts | None, merged: MergedPolicy
) -> ImplicitBudget | None:
    """The implicit budget of one pod (a JSON-like Pod dict), or None when the
    pod uses no GPU, its namespace is exempt, or nothing limits it."""
    meta = pod.get("metadata") or {}
    ns, name, uid = meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or ""
    if merged.exempt or not (ns and name and uid):
        return None
    req = PodGPURequest.from_api(pod)
    if not req.is_gpu_pod:
        return None
    limits = pod_limits(req, node, merged)
    if not limits:
        return None
    spec_limits: dict[str, Any] = {}
    # A declared grant is the pod author's to write (nvidia.com/gpumem: 1e12): kept
    # within the API's bounds so that the budget always validates.
    if "perDevice" in limits:
        spec_limits["perDevice"] = {"vram": str(clamp_limit_bytes(limits["perDevice"].bytes))}
    per_pod = {k.split(".")[1]: str(clamp_limit_bytes(v.bytes)) for k, v in limits.items() if k.startswith("perPod.")}
    if per_pod:
        spec_limits["perPod"] = per_pod
    budget = GPUMemoryBudget.model_validate(
        {
            "metadata": {
                "name": IMPLICIT_NAME_PREFIX + name,
                "namespace": ns,
                "uid": IMPLICIT_UID_PREFIX + uid,
                "generation": 1,
            },
            "spec": {
                "selector": {"matchLabels": {IMPLICIT_LABEL: uid}},
                "limits": spec_limits,
                "enforcement": {
                    "mode": merged.effective_mode,
                    "escalation": [{"action": "Annotate", "after": "0s"}],
                },
            },
        }
    )
    return ImplicitBudget(ns, name, uid, budget, limits)


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
) -> list[ImplicitBudget]:
    """Implicit budgets for every scheduled, unfinished GPU pod that no budget
    selects. ``merged``: the merged policy per namespace (a namespace missing
    from it gets no defaults: ``MergedPolicy(namespace)``)."""
    taken = selected_uids(pods, budgets)
    out = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        if meta.get("uid") in taken or not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            continue
        ns = meta.get("namespace") or ""
        found = implicit_budget(pod, nodes.get(spec["nodeName"]), merged.get(ns, MergedPolicy(ns)))
        if found is not None:
            out.append(found)
    return out


def label_pods(pods: Sequence[Any], implicit: Iterable[ImplicitBudget]) -> tuple[Any, ...]:
    """``PodFacts`` (engine_types) with the implicit selector label added to the
    pods that have an implicit budget; the others are returned as they are."""
    uids = {i.pod_uid for i in implicit}
    return tuple(
        replace(p, labels={**p.labels, IMPLICIT_LABEL: p.uid}) if p.uid in uids else p for p in pods
    )


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
