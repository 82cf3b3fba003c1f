"""Which GPUMemoryPolicies apply to a namespace, and how several combine into one.

Precedence (docs/policy.md, "Precedence"):

- A policy *applies* to a namespace when its ``namespaceSelector`` matches the
  namespace's labels (unset: every namespace) and the namespace is not in the
  policy's own ``exemptNamespaces``.
- A namespace is *exempt* when any policy lists it in ``exemptNamespaces``,
  whether or not that policy's selector matches it: exemption is a safety rule
  ("vramguard never acts there"), so the most protective answer wins. With no
  policy at all, ``kube-system`` is exempt (the API's default).
- Limits (defaults and ceilings, each field on its own): the smallest value
  among the applying policies wins.
- ``defaults.perDevice`` given as bytes and as a fraction cannot be compared
  without a device: both winners are kept and the smaller one on the pod's
  device applies (``shares.per_device_limit``).
- ``defaults.shareFromNode``: the node's share is a candidate when any applying
  policy that has ``defaults`` asks for it; it competes with explicit
  ``perDevice`` defaults, smallest wins.
- ``mode``: ``DryRun`` wins over ``Enforce`` (audit before enforcement: adding a
  DryRun policy must never start enforcement anywhere).
- A policy that cannot be evaluated (a malformed ``namespaceSelector``, or a
  spec that does not parse) holds *every* namespace in ``DryRun`` until it is
  fixed: where it applies cannot be known, and it may be the DryRun policy
  that keeps a namespace from enforcement (fail safe). Its limits are not used.
- ``evictionRateLimit``: the smallest ``perMinute`` and the smallest ``burst``.
- ``injectFrameworkCaps``: on when any applying policy opts in.
- ``terminationMessageFallback``: the first applying policy that sets it (unset: on).
- ``devicePressure``: the largest ``minFree`` percentage and the largest
  ``minFree`` quantity of the applying policies both hold (a device keeps the
  larger of the two: the most protective threshold wins); ``protectShares``
  when any of them asks for it; ``action`` is the first policy's. A policy with ``devicePressure`` and no ``defaults`` counts
  as asking for the node's share (``shareFromNode``): the rule measures pods
  against their shares.
- Ties go to the policy whose name sorts first, so the winner is stable.

Each merged field carries the name of the policy it came from (``Sourced``), so
that status, Events and ``vramguard top`` can say where a limit came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from vramguard_api import conditions as C
from vramguard_api.budget import Mode
from vramguard_api.policy import GPUMemoryPolicy, GPUMemoryPolicyStatus
from vramguard_operator.engine.budget_status import ConditionSpec, settle_conditions
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.policy.fields import FIELD_PATHS, FIELDS, Reader, Sourced

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label the API server sets on every namespace (its own name)."""
DEFAULT_EXEMPT = frozenset({"kube-system"})
HELD = "every namespace is held in DryRun until it is fixed"
"""What an invalid policy's Ready=False condition adds to its error."""


@dataclass(frozen=True, slots=True)
class MergedPolicy:
    """The policies that apply to one namespace, merged field by field.

    Byte values are integers in bytes; fractions are in (0, 1]. ``None``: no
    applying policy sets the field. ``policies``: names of the applying
    policies, sorted. ``exempt_by``: a policy that exempts the namespace.
    ``invalid``: one line per policy that could not be evaluated (its name and
    the field); while there is any, ``mode`` is ``DryRun`` from the first of them.
    """

    namespace: str
    policies: tuple[str, ...] = ()
    exempt_by: str | None = None
    mode: Sourced[Mode] | None = None
    default_pod_vram: Sourced[int] | None = None
    default_pod_ram: Sourced[int] | None = None
    default_device_vram: Sourced[int] | None = None
    default_device_fraction: Sourced[float] | None = None
    share_from_node: Sourced[bool] | None = None
    ceiling_pod_vram: Sourced[int] | None = None
    ceiling_pod_ram: Sourced[int] | None = None
    ceiling_device_vram: Sourced[int] | None = None
    ceiling_device_fraction: Sourced[float] | None = None
    ceiling_total_vram: Sourced[int] | None = None
    ceiling_total_ram: Sourced[int] | None = None
    eviction_per_minute: Sourced[int] | None = None
    eviction_burst: Sourced[int] | None = None
    inject_framework_caps: Sourced[bool] | None = None
    pressure_min_free_fraction: Sourced[float] | None = None
    pressure_min_free_bytes: Sourced[int] | None = None
    pressure_protect_shares: Sourced[bool] | None = None
    pressure_action: Sourced[str] | None = None
    soft_limits: Sourced[bool] | None = None
    termination_message_fallback: Sourced[bool] | None = None
    invalid: tuple[str, ...] = ()

    @property
    def exempt(self) -> bool:
        """Whether vramguard must never act in this namespace."""
        return self.exempt_by is not None

    @property
    def effective_mode(self) -> Mode:
        """The namespace's mode: the winner's, ``Enforce`` when no policy applies."""
        return "Enforce" if self.mode is None else self.mode.value

    @property
    def has_defaults(self) -> bool:
        """Whether any default limit applies to GPU pods that no budget selects."""
        return any(
            f is not None
            for f in (
                self.default_pod_vram,
                self.default_pod_ram,
                self.default_device_vram,
                self.default_device_fraction,
                self.share_from_node,
            )
        )

    def ceilings(self) -> dict[str, Sourced[int] | Sourced[float]]:
        """The ceilings that are set, by budget limit path (``perPod.vram``, ...)."""
        fields: dict[str, Sourced[int] | Sourced[float] | None] = {
            "perPod.vram": self.ceiling_pod_vram,
            "perPod.ram": self.ceiling_pod_ram,
            "perDevice.vram": self.ceiling_device_vram,
            "perDevice.fraction": self.ceiling_device_fraction,
            "total.vram": self.ceiling_total_vram,
            "total.ram": self.ceiling_total_ram,
        }
        return {k: v for k, v in fields.items() if v is not None}


def policy_applies(policy: GPUMemoryPolicy, namespace: str, labels: Mapping[str, str]) -> bool:
    """Whether ``policy`` applies to ``namespace`` with these labels.

    The ``kubernetes.io/metadata.name`` label is assumed even when ``labels``
    lacks it (the API server sets it on every namespace). Raises ``ValueError``
    naming the policy and field when its namespaceSelector is malformed.
    """
    if namespace in policy.spec.exempt_namespaces:
        return False
    selector = policy.spec.namespace_selector
    if selector is None:
        return True
    name = policy.metadata.name or ""
    matcher = compile_selector(selector, f"GPUMemoryPolicy {name}: spec.namespaceSelector")
    return matcher({NAMESPACE_NAME_LABEL: namespace, **labels})


def exempt_by(policies: Iterable[GPUMemoryPolicy], namespace: str) -> str | None:
    """The first policy (by name) that lists ``namespace`` as exempt; ``"default"``
    for ``kube-system`` when there is no policy at all; None when not exempt."""
    listed = sorted(p.metadata.name or "" for p in policies if namespace in p.spec.exempt_namespaces)
    if listed:
        return listed[0]
    any_policy = any(True for _ in policies)
    return "default" if not any_policy and namespace in DEFAULT_EXEMPT else None


def selector_problems(policies: Iterable[GPUMemoryPolicy]) -> dict[str, str]:
    """Policy name -> why its ``namespaceSelector`` cannot be evaluated (the
    error names the policy and the field), for every policy with a malformed one."""
    out = {}
    for policy in policies:
        selector, name = policy.spec.namespace_selector, policy.metadata.name or ""
        if selector is None:
            continue
        try:
            compile_selector(selector, f"GPUMemoryPolicy {name}: spec.namespaceSelector")
        except ValueError as err:
            out[name] = str(err)
    return out


def applying_policies(
    policies: Sequence[GPUMemoryPolicy], namespace: str, labels: Mapping[str, str]
) -> tuple[list[GPUMemoryPolicy], list[str]]:
    """The policies that apply to the namespace, sorted by name, and one problem
    line per policy whose selector could not be evaluated (left out here;
    ``merge`` holds the namespace in DryRun for it)."""
    out, problems = [], []
    for policy in sorted(policies, key=lambda p: p.metadata.name or ""):
        try:
            if policy_applies(policy, namespace, labels):
                out.append(policy)
        except ValueError as err:
            problems.append(str(err))
    return out, problems


def merge(
    policies: Sequence[GPUMemoryPolicy],
    namespace: str,
    labels: Mapping[str, str],
    invalid: Mapping[str, str] | None = None,
) -> MergedPolicy:
    """Merge every policy that applies to ``namespace`` into one ``MergedPolicy``
    (precedence in the module docstring). ``policies`` is every policy of the
    cluster that parses; those that do not apply are ignored, except for
    exemptions. ``invalid``: policy name -> error of each policy whose spec
    does not parse. A malformed selector or an invalid policy makes the mode
    ``DryRun`` (``MergedPolicy.invalid`` says why)."""
    applying, _ = applying_policies(policies, namespace, labels)
    broken = {**selector_problems(policies), **(invalid or {})}
    fields = {name: combine(applying, read) for name, (read, combine) in FIELDS.items()}
    held: Sourced[Mode] | None = Sourced("DryRun", min(broken)) if broken else None
    mode = held or _mode(applying)
    return MergedPolicy(
        namespace=namespace,
        policies=tuple(p.metadata.name or "" for p in applying),
        exempt_by=exempt_by(policies, namespace),
        mode=mode,
        invalid=tuple(broken[n] for n in sorted(broken)),
        **fields,
    )


# --- the mode ---------------------------------------------------------------------


def _mode(applying: Sequence[GPUMemoryPolicy]) -> Sourced[Mode] | None:
    dry = [p for p in applying if p.spec.mode == "DryRun"]
    chosen = dry[0] if dry else (applying[0] if applying else None)
    return None if chosen is None else Sourced(chosen.spec.mode, chosen.metadata.name or "")



def overridden_fields(policy: GPUMemoryPolicy, merged: MergedPolicy) -> list[str]:
    """Spec paths that ``policy`` sets but where another policy wins in
    ``merged``'s namespace, as ``<path>: policy/<winner>``."""
    name = policy.metadata.name or ""
    out = []
    readers: dict[str, Reader] = {"mode": lambda p: p.spec.mode, **{k: r for k, (r, _) in FIELDS.items()}}
    for attr, read in readers.items():
        won = getattr(merged, attr)
        mine = read(policy)
        if mine is None or won is None or won.policy == name or won.value == mine:
            continue
        out.append(f"{FIELD_PATHS[attr]}: {won.source}")
    return out


def policy_status(
    policy: GPUMemoryPolicy,
    all_policies: Sequence[GPUMemoryPolicy],
    namespaces: Mapping[str, Mapping[str, str]],
    now: datetime,
    max_entries: int = 256,
) -> GPUMemoryPolicyStatus:
    """The desired status of ``policy``: the namespaces it applies to (from
    ``namespaces``: name -> labels), where a stricter policy wins over it
    (``overridden``), and a Ready condition (False with reason InvalidSpec when
    its namespaceSelector is malformed). ``now`` is timezone-aware; the
    condition's lastTransitionTime is kept from the current status when its
    status does not change."""
    previous = policy.status.conditions if policy.status else None
    gen = policy.metadata.generation
    # Checked on its own: with no namespace (or only exempt ones) to match, the
    # selector would never be compiled below.
    problem = selector_problems([policy]).get(policy.metadata.name or "")
    try:
        if problem is not None:
            raise ValueError(problem)
        names = sorted(ns for ns, labels in namespaces.items() if policy_applies(policy, ns, labels))
    except ValueError as err:
        wanted = [ConditionSpec(C.READY, "False", C.REASON_INVALID_SPEC, f"{err}; {HELD}")]
        return GPUMemoryPolicyStatus(
            observedGeneration=gen,
            conditions=settle_conditions(wanted, previous, gen, now),
            matchedNamespaces=0,
        )
    overridden = [
        f"{entry.split(':', 1)[0]} in {ns}:{entry.split(':', 1)[1]}"
        for ns in names
        for entry in overridden_fields(policy, merge(all_policies, ns, namespaces[ns]))
    ]
    message = f"applies to {len(names)} namespaces"
    if overridden:
        message += f"; a stricter policy wins for {len(overridden)} fields (see overridden)"
    wanted = [ConditionSpec(C.READY, "True", C.REASON_VALID, message)]
    return GPUMemoryPolicyStatus(
        observedGeneration=gen,
        conditions=settle_conditions(wanted, previous, gen, now),
        matchedNamespaces=len(names),
        namespaces=names[:max_entries] or None,
        overridden=overridden[:max_entries] or None,
    )
