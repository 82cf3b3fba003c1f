"""Builders for engine test objects, and a loop that applies an engine output the
way the actions layer would when every call succeeds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.meta import LabelSelector, LabelSelectorRequirement
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.cli.replay_run import apply_output
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import (
    ContainerFacts,
    Decision,
    EffectivePolicy,
    EngineConfig,
    EngineInput,
    EngineOutput,
    PodFacts,
)

GI = 1 << 30
MI = 1 << 20
T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
NS = "ml"


def at(seconds: float) -> datetime:
    """T0 plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def budget(
    *,
    name: str = "train",
    ns: str = NS,
    uid: str = "uid-train",
    generation: int = 1,
    per_pod: dict[str, str] | None = None,
    per_device: dict[str, Any] | None = None,
    total: dict[str, str] | None = None,
    tolerance: dict[str, Any] | None = None,
    ladder: list[dict[str, str]] | None = None,
    mode: str = "Enforce",
    selector: dict[str, Any] | None = None,
    warning: float | None = None,
    leak: dict[str, Any] | None = None,
) -> GPUMemoryBudget:
    """A GPUMemoryBudget selecting ``app=train`` unless told otherwise."""
    limits: dict[str, Any] = {}
    if per_pod:
        limits["perPod"] = per_pod
    if per_device:
        limits["perDevice"] = per_device
    if total:
        limits["total"] = total
    spec: dict[str, Any] = {
        "selector": selector if selector is not None else {"matchLabels": {"app": "train"}},
        "limits": limits,
        "enforcement": {
            "mode": mode,
            "escalation": ladder
            or [
                {"action": "Annotate", "after": "0s"},
                {"action": "Throttle", "after": "5m"},
                {"action": "Evict", "after": "10m"},
            ],
        },
    }
    if tolerance:
        spec["tolerance"] = tolerance
    if warning is not None:
        spec["warningThreshold"] = warning
    if leak is not None:
        spec["leakDetection"] = leak
    return GPUMemoryBudget.model_validate(
        {
            "metadata": {"name": name, "namespace": ns, "uid": uid, "generation": generation},
            "spec": spec,
        }
    )


def stale_selector(*expressions: dict[str, Any]) -> LabelSelector:
    """A selector with requirements the API no longer admits (stored under an
    older CRD), built without validation to reach the engine's own checks."""
    return LabelSelector.model_construct(
        match_expressions=[LabelSelectorRequirement.model_construct(**e) for e in expressions]
    )


def pod(
    name: str,
    *,
    ns: str = NS,
    node: str = "node-a",
    labels: dict[str, str] | None = None,
    cpu: str | None = "4",
    phase: str = "Running",
) -> PodFacts:
    """A running pod labelled ``app=train`` with one container ``main``."""
    return PodFacts(
        namespace=ns,
        name=name,
        uid=f"uid-{name}",
        labels=labels if labels is not None else {"app": "train"},
        node_name=node,
        phase=phase,
        containers=(ContainerFacts("main", cpu_limit=cpu, cpu_request=cpu),),
    )


def report(
    node: str,
    t: datetime,
    pods: dict[str, dict[str, Any]],
    *,
    devices: list[dict[str, Any]] | None = None,
    ns: str = NS,
    truncated: bool = False,
) -> NodeGPUUsage:
    """A NodeGPUUsage sampled at ``t``; ``pods`` maps pod name to PodUsage fields
    (camelCase), uid derived from the name."""
    pod_list = [{"uid": f"uid-{n}", "namespace": ns, "name": n, **f} for n, f in pods.items()]
    return NodeGPUUsage.model_validate(
        {
            "metadata": {"name": node},
            "spec": {"nodeName": node},
            "status": {
                "sampleTime": t.isoformat(),
                "devices": devices
                or [
                    {
                        "uuid": "GPU-0",
                        "index": 0,
                        "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI},
                    }
                ],
                "pods": pod_list,
                "truncated": truncated,
            },
        }
    )


def gpu(uuid: str, index: int = 0, gib: int = 80) -> dict[str, Any]:
    """A device entry of ``gib`` GiB, all usable."""
    b = gib * GI
    return {"uuid": uuid, "index": index, "memory": {"totalBytes": b, "reservedBytes": 0, "usableBytes": b}}


TWO_GPUS = [gpu("GPU-0", 0), gpu("GPU-1", 1)]
"""Two 80 GiB devices: room for pods that together hold more than one (a
report may not put more on a device than it has, engine/report_checks.py)."""


def vram(n: float, device: str = "GPU-0", **extra: Any) -> dict[str, Any]:
    """PodUsage fields for ``n`` GiB of VRAM on one device."""
    b = int(n * GI)
    return {"vramBytes": b, "devices": [{"uuid": device, "usedBytes": b}], **extra}


def run(
    budgets: list[GPUMemoryBudget],
    pods: list[PodFacts],
    reports: list[NodeGPUUsage],
    now: datetime,
    *,
    policy: EffectivePolicy | None = None,
    config: EngineConfig | None = None,
) -> EngineOutput:
    """One evaluation."""
    return evaluate(
        EngineInput(
            budgets=tuple(budgets),
            pods=tuple(pods),
            reports={r.spec.node_name: r for r in reports},
            now=now,
            policy=policy or EffectivePolicy(),
            config=config or EngineConfig(),
        )
    )


def apply(
    out: EngineOutput, budgets: list[GPUMemoryBudget], pods: list[PodFacts]
) -> tuple[list[GPUMemoryBudget], list[PodFacts]]:
    """Apply ``out`` as a fully successful actions layer would (the replay's own
    ``apply_output``): statuses written, pod patches merged, resizes done,
    evicted pods terminating."""
    return apply_output(out, budgets, pods)


def simulate(
    budgets: list[GPUMemoryBudget],
    pods: list[PodFacts],
    timeline: list[tuple[float, dict[str, dict[str, Any]]]],
    devices: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> tuple[list[tuple[float, Decision]], list[GPUMemoryBudget], list[PodFacts]]:
    """Evaluate at each (seconds, usage) of ``timeline`` on node-a (its
    ``devices``, default one 80 GiB GPU-0), applying each output before the
    next; returns (time, decision) pairs and the end state."""
    events: list[tuple[float, Decision]] = []
    for t, usage in timeline:
        out = run(budgets, pods, [report("node-a", at(t), usage, devices=devices)], at(t), **kw)
        events.extend((t, d) for d in out.decisions)
        budgets, pods = apply(out, budgets, pods)
    return events, budgets, pods


def steps(events: list[tuple[float, Decision]]) -> list[tuple[float, str, str | None]]:
    """(time, action, pod name) of each decision."""
    return [(t, d.action, d.pod.name if d.pod else None) for t, d in events]
