"""The policy a simulation runs vramguard with: GPUMemoryPolicies and,
optionally, GPUMemoryBudgets, as YAML documents (what a platform team would
``kubectl apply``).

Budgets must be in one of the simulated namespaces (``workloads.NAMESPACES``:
``training``, ``serving``, ``research``, ``batch``) and select pods by their
labels: ``app`` (the workload's name, e.g. ``finetune-3``),
``app.kubernetes.io/component`` (``training``, ``inference``, ``batch``) and,
for Jobs, ``job-name``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.explain import validation_error
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_sim.simulate.workloads import NAMESPACES

DEFAULT_POLICY = """\
# vramguard's recommended policy for shared GPUs (examples/recommended-policy.yaml
# without its namespaceSelector, with a rate limit sized for a 160-GPU fleet
# and softLimits): enforce, give every GPU pod that no budget
# selects its node's fair share of a device (an implicit budget that
# annotates), and evict the pod most above its share when a device's free
# memory falls under 5% or under the room a pod within its share needs to
# reach it (docs/device-pressure.md), within an eviction rate limit.
# softLimits: the driver's soft limit of every GPU pod at its share; inert
# unless the node agents apply memory limits (--enforce-caps: the "with caps" run).
apiVersion: vramguard.io/v1alpha1
kind: GPUMemoryPolicy
metadata: {name: fleet-default}
spec:
  mode: Enforce
  defaults: {shareFromNode: true}
  devicePressure: {minFree: 5%, protectShares: true, action: Evict}
  evictionRateLimit: {perMinute: 10, burst: 10}
  softLimits: Share
"""


@dataclass(frozen=True, slots=True)
class PolicySet:
    """What vramguard runs with: ``policies`` and ``budgets``; ``source`` names
    where they came from (a file, or ``built-in``)."""

    policies: tuple[GPUMemoryPolicy, ...]
    budgets: tuple[GPUMemoryBudget, ...] = ()
    source: str = "built-in"


def parse_policy(text: str, source: str) -> PolicySet:
    """Parse YAML documents into a ``PolicySet``. Raises ``ValueError`` naming
    ``source``, the document and the field for YAML that does not parse, an
    unknown kind, an invalid object, a budget outside the simulated
    namespaces, or no GPUMemoryPolicy at all."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not YAML: {err}") from err
    policies, budgets = [], []
    for i, doc in enumerate(docs):
        where = f"{source}: document {i + 1}"
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if kind == "GPUMemoryPolicy":
            policies.append(_model(GPUMemoryPolicy, doc, where))
        elif kind == "GPUMemoryBudget":
            budgets.append(_budget(doc, where))
        else:
            raise ValueError(f"{where}: kind {kind!r} is neither GPUMemoryPolicy nor GPUMemoryBudget")
    if not policies:
        raise ValueError(f"{source}: no GPUMemoryPolicy (vramguard without one gives pods no implicit budgets)")
    return PolicySet(tuple(policies), tuple(budgets), source)


def load_policy(path: str | Path | None) -> PolicySet:
    """The policy in ``path``, or the built-in ``DEFAULT_POLICY`` when None."""
    if path is None:
        return parse_policy(DEFAULT_POLICY, "built-in")
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"--policy {path}: {err.strerror or err}") from err
    return parse_policy(text, str(path))


def _model(cls: Any, doc: dict[str, Any], where: str) -> Any:
    try:
        return cls.model_validate(doc)
    except ValidationError as err:
        raise ValueError(f"{where}: {validation_error(err, cls)}") from None


def _budget(doc: dict[str, Any], where: str) -> GPUMemoryBudget:
    budget: GPUMemoryBudget = _model(GPUMemoryBudget, doc, where)
    meta = budget.metadata
    if meta.namespace not in set(NAMESPACES.values()):
        raise ValueError(
            f"{where}: metadata.namespace {meta.namespace!r}: the simulated pods live in "
            f"{', '.join(sorted(set(NAMESPACES.values())))}"
        )
    if not meta.name:
        raise ValueError(f"{where}: metadata.name: missing")
    update = {"uid": meta.uid or f"sim-budget-{meta.namespace}-{meta.name}", "generation": meta.generation or 1}
    return budget.model_copy(update={"metadata": meta.model_copy(update=update), "status": None})
