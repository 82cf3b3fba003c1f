"""The policy side of device pressure (docs/device-pressure.md): each
namespace's rule from its merged GPUMemoryPolicies, and the node's share of
each device, the share of a pod that no budget limits there. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

from vramguard_api.pressure import PressureAction
from vramguard_api.steps import Action
from vramguard_operator.engine.types import PressureRule
from vramguard_operator.policy.merge import MergedPolicy
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.shares import node_share


def namespace_rule(merged: MergedPolicy) -> PressureRule | None:
    """The namespace's device-pressure rule: the largest ``minFree`` percentage
    and quantity of its applying policies (``merge``), protecting shares when
    any of them does; None when no policy sets one, or the namespace is
    exempt (vramguard never acts there)."""
    fraction, size = merged.pressure_min_free_fraction, merged.pressure_min_free_bytes
    if merged.exempt or (fraction is None and size is None):
        return None
    source = fraction if fraction is not None else size
    assert source is not None
    action = Action.EVICT if merged.pressure_action is None else merged.pressure_action.value
    protect = merged.pressure_protect_shares
    return PressureRule(
        min_free_fraction=None if fraction is None else fraction.value,
        min_free_bytes=None if size is None else size.value,
        action=cast(PressureAction, action),  # a value of the API's enum
        source=source.source,
        protect_shares=protect is None or protect.value,
    )


def namespace_rules(merged: Mapping[str, MergedPolicy], namespaces: Iterable[str]) -> dict[str, PressureRule]:
    """The rule of each of ``namespaces`` that has one (for ``EngineInput.pressure_rules``)."""
    out = {}
    for ns in namespaces:
        rule = namespace_rule(merged.get(ns, MergedPolicy(ns)))
        if rule is not None:
            out[ns] = rule
    return out


def device_shares(nodes: Mapping[str, NodeFacts]) -> dict[str, int]:
    """The node's share of each reported device, bytes by UUID (for
    ``EngineInput.device_shares``): a MIG device's own usable memory (the
    ``mig/<profile>`` share), a GPU's ``shares.node_share`` (usable memory over
    its time-slicing or MPS replicas, the vGPU's usable memory)."""
    out: dict[str, int] = {}
    for node in nodes.values():
        whole = node_share(node)
        for d in node.devices:
            if d.memory is None:
                continue
            if d.mig_profile is not None:
                out[d.uuid] = d.memory.usable_bytes
            elif whole is not None:
                out[d.uuid] = whole.bytes
    return out
