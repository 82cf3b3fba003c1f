"""Properties of the device-pressure rule through ``evaluate``, over random
devices, pods, shares, modes and data quality, and over evaluation sequences:
never a pod within its share; never a second eviction on a device while a pod
there is terminating with memory held; exempt namespaces and DryRun never act;
stale or incomplete data never acts."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.engine.builders import GI, at, budget, pod
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.cli.replay_run import apply_output
from vramguard_operator.engine.evaluate import evaluate
from vramguard_operator.engine.types import (
    EffectivePolicy,
    EngineInput,
    EngineOutput,
    Evict,
    PodFacts,
    PressureRule,
)

USABLE = 80 * GI
DEVICES = ("GPU-0", "GPU-1")


@dataclass(frozen=True)
class Tenant:
    """One pod: namespace, device, use (GiB), its budget's per-device limit
    (GiB; None: no budget, the node's 20Gi share) and whether that budget (if
    any) is DryRun."""

    name: str
    ns: str
    device: str
    used: int
    limit: int | None
    dry_run: bool


@dataclass(frozen=True)
class World:
    tenants: tuple[Tenant, ...]
    free: dict[str, int]  # GiB per device
    complete: bool
    age: int  # seconds the report is old
    protect: bool  # the rule keeps the room of pods within their shares


@st.composite
def worlds(draw: st.DrawFn) -> World:
    n = draw(st.integers(1, 7))
    tenants = tuple(
        Tenant(
            f"p{i}",
            draw(st.sampled_from(["ml", "ml", "serving", "sys"])),
            draw(st.sampled_from(DEVICES)),
            draw(st.integers(0, 60)),
            draw(st.sampled_from([None, 10, 20, 30, 60])),
            draw(st.booleans()),
        )
        for i in range(n)
    )
    free = {d: draw(st.integers(0, 12)) for d in DEVICES}
    return World(tenants, free, draw(st.booleans()), draw(st.sampled_from([0, 0, 0, 120])), draw(st.booleans()))


def share(t: Tenant) -> int:
    return (t.limit if t.limit is not None else 20) * GI


def budgets_of(w: World) -> list[GPUMemoryBudget]:
    out = []
    for t in w.tenants:
        if t.limit is None:
            continue
        out.append(
            budget(
                name=f"b-{t.name}",
                ns=t.ns,
                uid=f"uid-b-{t.name}",
                selector={"matchLabels": {"app": t.name}},
                per_device={"vram": f"{t.limit}Gi"},
                ladder=[{"action": "Annotate", "after": "0s"}],
                mode="DryRun" if t.dry_run else "Enforce",
            )
        )
    return out


def report_of(w: World, pods: list[PodFacts], t: float) -> NodeGPUUsage:
    live = {p.name for p in pods}
    entries = [
        {
            "uid": f"uid-{x.name}",
            "namespace": x.ns,
            "name": x.name,
            "vramBytes": x.used * GI,
            "devices": [{"uuid": x.device, "usedBytes": x.used * GI}],
        }
        for x in w.tenants
        if x.name in live
    ]
    devices = [
        {
            "uuid": d,
            "index": i,
            "memory": {"totalBytes": USABLE, "usedBytes": USABLE - w.free[d] * GI, "usableBytes": USABLE},
            "processesComplete": w.complete,
        }
        for i, d in enumerate(DEVICES)
    ]
    return NodeGPUUsage.model_validate(
        {
            "metadata": {"name": "node-a"},
            "spec": {"nodeName": "node-a"},
            "status": {"sampleTime": at(t - w.age).isoformat(), "devices": devices, "pods": entries},
        }
    )


def evaluate_world(w: World, budgets: list[GPUMemoryBudget], pods: list[PodFacts], t: float) -> EngineOutput:
    rule = PressureRule(min_free_fraction=0.05, source="policy/p", protect_shares=w.protect)
    return evaluate(
        EngineInput(
            budgets=tuple(budgets),
            pods=tuple(pods),
            reports={"node-a": report_of(w, pods, t)},
            now=at(t),
            policy=EffectivePolicy(exempt_namespaces=frozenset({"sys"})),
            pressure_rules={"ml": rule, "serving": rule, "sys": rule},
            device_shares={d: 20 * GI for d in DEVICES},
        )
    )


def pods_of(w: World) -> list[PodFacts]:
    return [pod(x.name, ns=x.ns, labels={"app": x.name}) for x in w.tenants]


def pressure_evictions(out: EngineOutput) -> list[Evict]:
    found = []
    for d in out.decisions:
        if isinstance(d, Evict) and d.violation.kind == "DevicePressure":
            found.extend([d, *d.alternatives])
    return found


def check(w: World, out: EngineOutput, pods: list[PodFacts]) -> None:
    by_name = {x.name: x for x in w.tenants}
    terminating = {p.name for p in pods if p.terminating}
    for d in out.decisions:
        if d.violation.kind != "DevicePressure" or d.pod is None:
            continue
        x = by_name[d.pod.name]
        assert x.ns != "sys", "an exempt namespace"
        assert x.used * GI > share(x), "a pod within its share"
        assert d.limit_bytes == share(x)
    for e in pressure_evictions(out):
        x = by_name[e.pod.name]  # type: ignore[union-attr]
        assert not (x.dry_run and x.limit is not None) and x.ns != "sys", "DryRun or exempt acted on"
        assert x.used * GI > share(x), "a pod within its share"
        assert w.complete and w.age == 0, "incomplete or stale data acted on"
        held = [y for y in w.tenants if y.device == x.device and y.name in terminating and y.used > 0]
        assert not held, "a second eviction while one terminates"
        rooms = [share(y) - y.used * GI for y in w.tenants if y.device == x.device and y.ns != "sys"
                 and y.name not in terminating and y.used * GI <= share(y)] if w.protect else []
        assert w.free[x.device] * GI < max([USABLE * 0.05, *rooms]), "acted with enough free memory"


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_one_evaluation(w: World) -> None:
    pods = pods_of(w)
    check(w, evaluate_world(w, budgets_of(w), pods, 0), pods)


@settings(max_examples=150, deadline=None)
@given(worlds(), st.lists(st.sampled_from(["keep", "gone", "terminate"]), min_size=1, max_size=4))
def test_evaluation_sequences(w: World, moves: list[str]) -> None:
    budgets, pods = budgets_of(w), pods_of(w)
    evicted: set[str] = set()  # by the pressure rule, still there
    t = 0.0
    for move in moves:
        out = evaluate_world(w, budgets, pods, t)
        check(w, out, pods)
        evicted |= {e.pod.name for e in pressure_evictions(out)[:1] if e.pod is not None}
        devices = [x.device for x in w.tenants if x.name in evicted]
        assert len(devices) == len(set(devices)), "two pods evicted on one device"
        budgets, pods = apply_output(out, budgets, pods)
        if move == "gone":  # the terminating pods finish: their memory is freed
            gone = {p.name for p in pods if p.terminating}
            pods = [p for p in pods if not p.terminating]
            w = replace(w, tenants=tuple(x for x in w.tenants if x.name not in gone))
            evicted -= gone
        elif move == "terminate" and pods:  # someone deletes a pod meanwhile
            pods = [replace(pods[0], terminating=True), *pods[1:]]
        t += 10
