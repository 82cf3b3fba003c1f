"""The entries the operator keeps of watched objects, built by pure functions
from the API's JSON bodies (``informer`` parses each object once with these):

- pods (``PodEntry``: ``PodFacts``, the trimmed GPU pod that shares and
  implicit budgets read, the budgets named in its escalation state);
- GPUMemoryBudgets (the parsed model, or why it does not parse);
- GPUMemoryPolicies, NodeGPUUsage reports by node, namespace labels.

Each entry carries the object's ``resourceVersion``, so that the API server's
answer to one of the operator's own writes can be kept until the watch
delivers the same or a newer version (``rv_newer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.ends import ACK_ANNOTATION
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.engine.records import records_from_annotation
from vramguard_operator.engine.types import ANNOTATION_PREFIX, ANNOTATION_VIOLATIONS, PodFacts
from vramguard_operator.policy.implicit import ANNOTATION_LIMITS
from vramguard_operator.policy.sharers import grant_annotations, may_use_gpu

T = TypeVar("T")

GPU_RESOURCE_PREFIXES = ("nvidia.com/", "aliyun.com/")


def plain(value: Any) -> Any:
    """A deep plain copy of a kopf body or any part of it: mappings become
    dicts and lists new lists (kopf's bodies are read-only views over the raw
    data, which must not be shared with what the operator keeps)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def rv_newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is newer than ``b``.

    resourceVersions are opaque to clients by contract; every API server backed
    by etcd issues them from etcd's increasing revision, so they compare as
    integers. Anything else counts as not newer (the watch is then trusted)."""
    return a.isdigit() and b.isdigit() and int(a) > int(b)


@dataclass(frozen=True, slots=True)
class Versioned(Generic[T]):
    """An index entry: the object's uid and resourceVersion, and its parsed value."""

    uid: str
    resource_version: str
    value: T


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _problem(kind: str, body: Mapping[str, Any], err: Exception) -> str:
    meta = _meta(body)
    where = "/".join(x for x in (meta.get("namespace"), meta.get("name")) if x)
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        return f"{kind} {where}: {loc}: {first['msg']}"
    return f"{kind} {where}: {err}"


# --- entries --------------------------------------------------------------------------


def pod_entry(body: Mapping[str, Any]) -> Versioned[PodFacts]:
    """The facts of a pod and its version. Raises ``ValueError`` when metadata
    is incomplete."""
    meta = _meta(body)
    facts = PodFacts.from_api(body)
    return Versioned(facts.uid, str(meta.get("resourceVersion") or ""), facts)


@dataclass(frozen=True, slots=True)
class PodEntry:
    """What the operator keeps of a pod: its facts and version, the pod trimmed
    to what shares and implicit budgets read (``policy_handlers.gpu_pod_entry``;
    None for a pod that requests no GPU) and the names of the budgets its
    ``vramguard.io/violations`` annotation holds state for."""

    uid: str
    resource_version: str
    facts: PodFacts
    gpu: Mapping[str, Any] | None = None
    recorded: frozenset[str] = frozenset()

    @property
    def namespace(self) -> str:
        """The pod's namespace."""
        return self.facts.namespace

    def decides_like(self, other: PodEntry) -> bool:
        """Whether ``other`` gives every decision the same inputs (only the
        version differs: the echo of the operator's own write)."""
        return self.facts == other.facts and self.gpu == other.gpu


def pod_cache_entry(body: Mapping[str, Any]) -> PodEntry | None:
    """The ``PodEntry`` of a pod (None when its metadata is incomplete)."""
    try:
        v = pod_entry(body)
    except ValueError:
        return None
    facts = v.value
    text = facts.annotations.get(ANNOTATION_VIOLATIONS)
    recorded: frozenset[str] = frozenset()
    if text:
        records, _ = records_from_annotation(text, facts.namespace, facts.name)
        recorded = frozenset(r.key.budget for r in records)
    return PodEntry(v.uid, v.resource_version, facts, gpu_pod_entry(body), recorded)


def node_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A GPU node's labels and allocatable resources (None for other nodes, which
    are not kept)."""
    meta = _meta(body)
    status = body.get("status") or {}
    alloc = dict(status.get("allocatable") or status.get("capacity") or {})
    labels = dict(meta.get("labels") or {})
    gpu = labels.get("nvidia.com/gpu.present") == "true" or any(
        r.startswith(GPU_RESOURCE_PREFIXES) for r in alloc
    )
    if not gpu:
        return None
    return {
        "metadata": {"name": meta.get("name"), "labels": labels},
        "status": {"allocatable": {k: str(v) for k, v in alloc.items()}},
    }


def gpu_pod_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A pod that may use a GPU (``sharers.may_use_gpu``), trimmed to what shares
    and grants read (None for other pods): metadata (name, namespace, uid,
    labels, the annotations grants are read from and ``vramguard.io/limits``),
    ``spec.nodeName``, ``spec.resourceClaims``, containers' names and resources,
    phase and the claims' names in its status."""
    if not may_use_gpu(body):
        return None
    meta = _meta(body)
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    annotations = dict(meta.get("annotations") or {})
    kept = {**grant_annotations(annotations), **{k: v for k, v in annotations.items() if k == ANNOTATION_LIMITS}}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": kept,
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "resourceClaims": plain(spec.get("resourceClaims") or []),
            "containers": [
                {"name": c.get("name"), "resources": plain(c.get("resources") or {})}
                for c in spec.get("containers") or ()
            ],
        },
        "status": {
            "phase": status.get("phase"),
            "resourceClaimStatuses": plain(status.get("resourceClaimStatuses") or []),
            "extendedResourceClaimStatus": plain(status.get("extendedResourceClaimStatus")),
        },
    }


@dataclass(frozen=True, slots=True)
class BudgetEntry:
    """A GPUMemoryBudget: parsed, or with ``error`` saying why it does not parse
    (then ``budget`` is None and ``status`` is the raw status, for the writer)."""

    namespace: str
    name: str
    generation: int | None
    budget: GPUMemoryBudget | None
    error: str | None = None
    status: Mapping[str, Any] | None = None

    def status_api(self) -> dict[str, Any] | None:
        """The current status in API form (None when it has none)."""
        if self.budget is not None:
            st = self.budget.status
            return None if st is None else st.to_api()
        return dict(self.status) if self.status else None


def budget_entry(body: Mapping[str, Any]) -> Versioned[BudgetEntry]:
    """The index entry of a GPUMemoryBudget (never raises on a bad spec)."""
    meta, data = _meta(body), plain(body)
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    generation = meta.get("generation")
    keep: dict[str, Any] = {k: data[k] for k in ("apiVersion", "kind", "spec", "status") if k in data}
    keep["metadata"] = {
        "name": name,
        "namespace": ns,
        "uid": uid,
        "generation": generation,
        "resourceVersion": rv,
    }
    try:
        budget = GPUMemoryBudget.model_validate(keep)
    except (ValidationError, ValueError) as err:
        entry = BudgetEntry(
            ns, name, generation, None, _problem("GPUMemoryBudget", body, err), data.get("status")
        )
        return Versioned(uid, rv, entry)
    return Versioned(uid, rv, BudgetEntry(ns, name, generation, budget))


def report_entry(body: Mapping[str, Any]) -> Versioned[NodeGPUUsage | str]:
    """The index entry of a NodeGPUUsage: the model, or why it does not parse."""
    meta = _meta(body)
    data = dict(body)  # pydantic copies what it keeps; a shallow copy for the new metadata
    data["metadata"] = {"name": meta.get("name"), "uid": meta.get("uid")}
    acked = (meta.get("annotations") or {}).get(ACK_ANNOTATION)
    if acked is not None:  # how far the OOM records are published (controller/oom.py)
        data["metadata"]["annotations"] = {ACK_ANNOTATION: acked}
    uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    try:
        return Versioned(uid, rv, NodeGPUUsage.model_validate(data))
    except (ValidationError, ValueError) as err:
        return Versioned(uid, rv, _problem("NodeGPUUsage", body, err))


def report_node(body: Mapping[str, Any]) -> str:
    """The node a report describes: ``spec.nodeName``, else its name."""
    spec = body.get("spec") or {}
    return str(spec.get("nodeName") or _meta(body).get("name") or "")


def policy_entry(body: Mapping[str, Any]) -> Versioned[GPUMemoryPolicy | str]:
    """The index entry of a GPUMemoryPolicy: the model, or why it does not parse."""
    meta = _meta(body)
    data = {k: v for k, v in plain(body).items() if k in ("apiVersion", "kind", "spec")}
    data["metadata"] = {"name": meta.get("name"), "uid": meta.get("uid")}
    uid, rv = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    try:
        return Versioned(uid, rv, GPUMemoryPolicy.model_validate(data))
    except (ValidationError, ValueError) as err:
        return Versioned(uid, rv, _problem("GPUMemoryPolicy", body, err))


def namespace_entry(body: Mapping[str, Any]) -> Versioned[dict[str, str]]:
    """The index entry of a Namespace: its labels."""
    meta = _meta(body)
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return Versioned(str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""), labels)


def has_vramguard_state(pod: PodFacts) -> bool:
    """Whether the operator left annotations on the pod (escalation state or a
    throttled pod's original CPU), which must be evaluated even without budgets."""
    return any(k.startswith(ANNOTATION_PREFIX) for k in pod.annotations)
