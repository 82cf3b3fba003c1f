"""Incremental evaluation decides exactly what a pass over everything decides
(issue 18): random sequences of changes (node reports, pods created, deleted
and relabelled, budgets created, changed and deleted, policies, namespace
labels, DRA claims shared by pods, device-pressure rules of policies and
budgets, Cap steps and soft limits at the shares with agents enforcing them,
a second report claiming a node, budgets whose spec does not parse, memory
limits annotations set at, above or below a pod's share or with a hard limit,
devices crossing their pressure threshold's margin) and of time passing, applied to two copies of one world; after each,
one copy is evaluated incrementally (only what the changes mark, timers,
level-triggered steps) and the other over everything, and their decisions,
budget statuses, implicit budgets' statuses and pod annotations must be
equal.

One suite for both change streams that feed a planner: the operator's (the
informers' changes and the clock, into ``plan.incremental``) and the fleet
simulation's (the fleet's pods, usage and clock at each tick, into
``simulate.triggers``). Each runs its planner and a pass over everything on
the same stream, and ``assert_agree`` compares what each observes."""

from __future__ import annotations

import os
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vramguard_api.memlimits import MEMORY_LIMITS_ANNOTATION, DeviceMemoryLimit, format_memory_limits
from vramguard_operator.engine.types import EngineConfig, Evict
from vramguard_sim.simulate.control import ControlConfig
from vramguard_sim.simulate.policyfile import DEFAULT_POLICY, parse_policy
from vramguard_sim.simulate.run import simulate

from ..policy.builders import cluster_nodes
from ..policy.dra_builders import claim, gpu, resource_slice, result
from ..simulate.policies import ACTING, ANNOTATE_ONLY, CAPPING, MIX, SMALL
from .world import World

GI = 1 << 30
T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
NODES = ["gpu-h100-ts", "gpu-a10-vgpu", "gpu-h100-b", "cpu-only"]
GPU_NODES = NODES[:3]  # with reports (the third a copy of the first: more nodes, fewer pods on each)
SPACES = ["ml", "research"]
PERIOD = 5.0
UUID = {n: f"GPU-{i:08x}-0000-4000-8000-000000000000" for i, n in enumerate(NODES)}  # NVML's form: caps apply
LADDER = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "10s", "cpuLimit": "500m"},
          {"action": "Evict", "after": "25s"}]
TEMPLATES: list[dict[str, Any]] = [
    {"selector": {"matchLabels": {"app": "x"}}, "limits": {"perPod": {"vram": "10Gi"}},
     "enforcement": {"escalation": LADDER}},
    {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x", "y"]}]},
     "limits": {"total": {"vram": "25Gi"}}, "tolerance": {"duration": "5s"},
     "enforcement": {"escalation": [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "15s"}]}},
    {"selector": {"matchLabels": {"app": "y"}}, "limits": {"perPod": {"vram": "10Gi", "ram": "8Gi"}},
     "enforcement": {"mode": "DryRun", "escalation": [{"action": "Annotate"}, {"action": "Evict", "after": "10s"}]}},
    {"selector": {"matchLabels": {"app": "z"}}, "limits": {"perDevice": {"fraction": 0.1}},
     "tolerance": {"duration": "10s", "overshootPercent": 50}, "warningThreshold": 0.7,
     "enforcement": {"escalation": [{"action": "Annotate"}, {"action": "Throttle", "after": "5s"}]}},
    {"selector": {"matchLabels": {"app": "x"}}, "limits": {"perPod": {"vram": "20Gi"}},
     "enforcement": {"escalation": [{"action": "Annotate"}]}},
    {"selector": {"matchLabels": {"app": "y"}}, "limits": {"perPod": {"vram": "10Gi"}},
     "enforcement": {"softLimits": "Share", "escalation": [
         {"action": "Annotate"}, {"action": "Cap", "after": "10s"}, {"action": "Evict", "after": "30s"}]}},
    {"selector": {"matchLabels": {"app": "z"}}, "limits": {"perDevice": {"vram": "12Gi"}},
     "devicePressure": {"minFree": "10%"},
     "enforcement": {"escalation": [{"action": "Annotate"}, {"action": "Cap", "after": "5s"}]}},
    {"selector": {"matchLabels": {"app": "w"}}, "limits": {"perPod": {"vram": "20Gi"}, "total": {"vram": "10Gi"}}},
    # thresholds that a budget change moves without a new report: a device far from 5% may be under 40%
    {"selector": {"matchLabels": {"app": "w"}}, "limits": {"perPod": {"vram": "30Gi"}}, "devicePressure": {"minFree": "40%"}},
    {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x", "z"]}]},
     "limits": {"perDevice": {"vram": "40Gi"}}, "devicePressure": {"minFree": "5%"},
     "enforcement": {"softLimits": "Share", "escalation": [{"action": "Annotate"}]}},
]
POLICIES: list[dict[str, Any]] = [
    {"defaults": {"shareFromNode": True}},
    {"mode": "DryRun", "namespaceSelector": {"matchLabels": {"team": "a"}}, "defaults": {"perPod": {"vram": "6Gi"}}},
    {"exemptNamespaces": ["research"], "ceilings": {"perPod": {"vram": "15Gi"}}},
    {"defaults": {"perDevice": {"vram": "5Gi"}}, "evictionRateLimit": {"perMinute": 6, "burst": 2}},
    {"defaults": {"shareFromNode": True}, "devicePressure": {"minFree": "5%"}, "softLimits": "Share"},
    {"namespaceSelector": {"matchLabels": {"team": "b"}}, "devicePressure": {"minFree": "20Gi", "protectShares": False}},
]
USAGE_GI = [None, 2, 5, 8, 9.5, 11, 14, 30]
SEEDS = int(os.environ.get("VG_EQUIVALENCE_SEEDS", "16"))


class Scenario:
    """Random changes, drawn once and applied to both worlds."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0

    def pick(self, worlds: list[World], kind: str) -> Any:
        keys = sorted(worlds[0].objects.get(kind, {}), key=str)
        return self.rng.choice(keys) if keys else None

    def change(self, worlds: list[World], now: datetime) -> None:
        r = self.rng.random()
        if r < 0.35:
            self._report(worlds, now)
        elif r < 0.5:
            self._new_pod(worlds)
        elif r < 0.58:
            self._pod_edit(worlds)
        elif r < 0.75:
            self._budget(worlds)
        elif r < 0.81:
            self._policy(worlds)
        elif r < 0.86:
            self._claim(worlds)
        elif r < 0.87:
            self._limits_edit(worlds)
        elif r < 0.91:
            ns = self.rng.choice(SPACES)
            labels = {"team": self.rng.choice(["a", "b"]), "kubernetes.io/metadata.name": ns}
            for w in worlds:
                w.put("namespaces", ns, {"metadata": {"name": ns, "uid": f"ns-{ns}", "labels": labels}})
        # else: only time passes

    def _report(self, worlds: list[World], now: datetime) -> None:
        node = self.rng.choice(GPU_NODES)
        if self.rng.random() < 0.07:
            for w in worlds:
                w.put("reports", (node, node), None)
            return
        pods = [b for b in worlds[0].objects.get("pods", {}).values() if b["spec"].get("nodeName") == node]
        age = self.rng.choice([0, 0, 0, 0, 30, 90, -90])
        entries = []
        for b in sorted(pods, key=lambda b: b["metadata"]["name"]):
            gi = self.rng.choice(USAGE_GI)
            if gi is None:
                continue
            used = int(gi * GI)
            entries.append({"uid": b["metadata"]["uid"], "namespace": b["metadata"]["namespace"],
                            "name": b["metadata"]["name"], "attribution": "Measured", "vramBytes": used,
                            "ramWorkingSetBytes": int(self.rng.choice([1, 6, 9]) * GI),
                            "devices": [{"uuid": UUID[node], "usedBytes": used}]})
        device = {"uuid": UUID[node], "index": 0,
                  "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI},
                  "memoryLimits": "Supported", "memoryLimitsReason": "ProbeSucceeded"}
        used = sum(e["vramBytes"] for e in entries)
        # under pressure, close to the threshold's margin (5% of 80Gi over minFree 5%/10%/20Gi) or far from it
        device["memory"]["usedBytes"] = used + int(self.rng.choice([0, 0, 4, 60, 68, 69.5, 71, 72.5]) * GI)
        device["processesComplete"] = True
        body = {"metadata": {"name": node, "uid": f"r-{node}"}, "spec": {"nodeName": node}, "status": {
            "sampleTime": (now - timedelta(seconds=age)).isoformat(),
            "agent": {"version": "1", "backend": "sim", "sampleIntervalSeconds": 5,
                      "enforceCaps": self.rng.random() < 0.7},
            "devices": [device], "pods": entries, "truncated": self.rng.random() < 0.1}}
        key = (node, node)
        if self.rng.random() < 0.05:  # a second object claims the node (or stops claiming it)
            key = (node, f"{node}-second")
            if worlds[0].get("reports", key) is not None:
                body = None
            else:
                body["metadata"] = {"name": key[1], "uid": f"r2-{node}"}
        for w in worlds:
            w.put("reports", key, _copy(body))

    def _new_pod(self, worlds: list[World]) -> None:
        self.n += 1
        name = f"p{self.n}"
        claimed = self.rng.random() < 0.25
        limits = {"cpu": "2"} | ({"nvidia.com/gpu": "1"} if self.rng.random() < 0.7 and not claimed else {})
        body = {"metadata": {"name": name, "namespace": self.rng.choice(SPACES), "uid": f"uid-{name}",
                             "labels": {"app": self.rng.choice("xyzw")}},
                "spec": {"nodeName": self.rng.choice(NODES), "containers": [
                    {"name": "main", "resources": {"limits": limits, "requests": {"cpu": "1"}}}]},
                "status": {"phase": "Running"}}
        if claimed:  # a DRA claim: its memory is the pod's limit on the device; shared, a claim budget
            body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": self.rng.choice(["c1", "c2"])}]
        for w in worlds:
            w.put("pods", body["metadata"]["uid"], _copy(body))

    def _pod_edit(self, worlds: list[World]) -> None:
        uid = self.pick(worlds, "pods")
        if uid is None:
            return
        delete, app = self.rng.random() < 0.4, self.rng.choice("xyzw")
        for w in worlds:
            body = w.get("pods", uid)
            if body is None:  # evicted in one world only: the check after the step says so
                continue
            if delete:
                w.put("pods", uid, None)
            else:
                body = _copy(body)
                body["metadata"]["labels"] = {"app": app}
                w.put("pods", uid, body)

    def _limits_edit(self, worlds: list[World]) -> None:
        """Someone sets a pod's memory limits: a soft limit at a share it may
        have (10Gi: perPod; 5Gi: the policy's perDevice; another pod's, as the
        operator wrote it) or not, a hard limit, or none."""
        uid = self.pick(worlds, "pods")
        body = worlds[0].get("pods", uid) if uid is not None else None
        if body is None or body["spec"]["nodeName"] not in GPU_NODES:
            return
        node = body["spec"]["nodeName"]
        others = [t for b in worlds[0].objects.get("pods", {}).values() if b["spec"]["nodeName"] == node
                  and (t := (b["metadata"].get("annotations") or {}).get(MEMORY_LIMITS_ANNOTATION))]
        choice = self.rng.choice(["none", "10", "5", "7", "hard", "other", "other"])
        text: str | None = None
        if choice == "other":
            text = self.rng.choice(others) if others else None
        elif choice == "hard":
            text = format_memory_limits({UUID[node]: DeviceMemoryLimit(10 * GI, 12 * GI)})
        elif choice != "none":
            text = format_memory_limits({UUID[node]: DeviceMemoryLimit(int(choice) * GI)})
        for w in worlds:
            body = w.get("pods", uid)
            if body is None:
                continue
            body = _copy(body)
            ann = body["metadata"].setdefault("annotations", {})
            ann.pop(MEMORY_LIMITS_ANNOTATION, None)
            if text is not None:
                ann[MEMORY_LIMITS_ANNOTATION] = text
            w.put("pods", uid, body)

    def _budget(self, worlds: list[World]) -> None:
        ns, name = self.rng.choice(SPACES), self.rng.choice(["b1", "b2", "b3"])
        key = (ns, name)
        if self.rng.random() < 0.2:
            for w in worlds:
                w.put("budgets", key, None)
            return
        spec = self.rng.choice(TEMPLATES)
        gen = (worlds[0].get("budgets", key) or {}).get("metadata", {}).get("generation", 0) + 1
        self.n += 1
        uid = (worlds[0].get("budgets", key) or {}).get("metadata", {}).get("uid") or f"b-{self.n}"
        body = {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryBudget",
                "metadata": {"name": name, "namespace": ns, "uid": uid, "generation": gen}, "spec": spec}
        for w in worlds:
            old = w.get("budgets", key)
            body_w = _copy(body)
            if old is not None and "status" in old:
                body_w["status"] = old["status"]
            w.put("budgets", key, body_w)

    def _claim(self, worlds: list[World]) -> None:
        ns, name = self.rng.choice(SPACES), self.rng.choice(["c1", "c2"])
        if self.rng.random() < 0.2:
            for w in worlds:
                w.put("claims", (ns, name), None)
            return
        users = [b for b in worlds[0].objects.get("pods", {}).values()
                 if b["metadata"]["namespace"] == ns and any(
                     r.get("resourceClaimName") == name for r in b["spec"].get("resourceClaims") or ())]
        nodes = [n for b in users if (n := b["spec"]["nodeName"]) in GPU_NODES] or GPU_NODES
        node = self.rng.choice(nodes)
        users = [b["metadata"]["name"] for b in users]
        body = claim(name, [result("gpu-0", node, self.rng.choice(["5Gi", "10Gi", "20Gi"]))], users, ns=ns)
        body["metadata"]["uid"] = f"claim-uid-{ns}-{name}"  # two namespaces' claims never share a uid
        for w in worlds:
            w.put("claims", (ns, name), _copy(body))

    def _policy(self, worlds: list[World]) -> None:
        name = self.rng.choice(["p1", "p2"])
        spec = None if self.rng.random() < 0.3 else self.rng.choice(POLICIES)
        body = None if spec is None else {"apiVersion": "vramguard.io/v1alpha1", "kind": "GPUMemoryPolicy",
                                          "metadata": {"name": name, "uid": f"pol-{name}", "generation": 1},
                                          "spec": spec}
        for w in worlds:
            w.put("policies", name, _copy(body))


def _copy(body: Any) -> Any:
    import copy

    return copy.deepcopy(body)


def _world() -> World:
    w = World(EngineConfig(freshness_seconds=60.0), period=PERIOD)
    nodes = cluster_nodes()
    for n in NODES:
        body = _copy(nodes.get(n) or {"metadata": {"name": n, "labels": {}}, "status": {"allocatable": {"cpu": "8"}}})
        if n == "gpu-h100-b":
            body = _copy(nodes[NODES[0]])
            body["metadata"]["name"] = n
        w.put("nodes", n, body)
    for ns in SPACES:
        w.put("namespaces", ns, {"metadata": {"name": ns, "uid": f"ns-{ns}",
                                              "labels": {"kubernetes.io/metadata.name": ns}}})
    for n in GPU_NODES:
        s = resource_slice(n, [gpu("gpu-0", UUID[n])])
        w.put("slices", s["metadata"]["name"], s)
    return w


def _annotations(w: World) -> dict[str, dict[str, str]]:
    return {uid: {k: v for k, v in (b["metadata"].get("annotations") or {}).items() if k.startswith("vramguard.io/")}
            for uid, b in w.objects.get("pods", {}).items()}


def _statuses(w: World) -> dict[Any, Any]:
    return {key: (s.to_api() if (s := w.cache.status_of(key)) is not None else None) for key in w.cache.budgets}


def assert_agree(planned: dict[str, Any], everything: dict[str, Any], where: str) -> None:
    """The harness of both streams: what the planner's run and the pass over
    everything observed (the same keys) are equal, key by key, the first
    difference named with ``where``."""
    assert planned.keys() == everything.keys(), where
    for key, want in everything.items():
        assert planned[key] == want, f"{where}: {key} differs"


def _observed(w: World, decisions: list[Any]) -> dict[str, Any]:
    """What an operator's evaluation leaves: its decisions, budget statuses,
    pod annotations and implicit budgets' statuses."""
    return {"decisions": sorted(map(repr, decisions)), "statuses": _statuses(w), "annotations": _annotations(w),
            "implicit": {k: v.to_api() for k, v in w.inc.memory.implicit_status.items()}}


@pytest.mark.parametrize("seed", range(SEEDS))
def test_incremental_and_full_evaluation_agree(seed: int) -> None:
    """The operator's stream: random changes and time, planned incrementally
    against a pass over everything, compared after every step."""
    inc, full = _world(), _world()
    scenario = Scenario(seed)
    now = T0
    for step in range(45):
        now += timedelta(seconds=PERIOD if scenario.rng.random() < 0.85 else PERIOD * scenario.rng.randint(2, 5))
        for _ in range(scenario.rng.choice([0, 1, 1, 2, 3])):
            scenario.change([inc, full], now)
        got, want = inc.step_incremental(now), full.step_full(now)
        assert_agree(_observed(inc, got), _observed(full, want), f"seed {seed}, step {step}, {now:%H:%M:%S}")


SIM_FIGURES = ("innocent_ooms", "over_share_ooms", "actions", "evictions", "evictions_blocked",
               "evictions_rate_limited", "jobs_completed", "dry_run_steps", "gpu_memory_in_use_bytes",
               "hard_limit_ooms", "soft_limit_evictions")


@pytest.mark.parametrize(
    ("policy", "caps"), [("annotate-only", False), ("built-in", False), ("acting", False), ("capping", True)]
)
def test_the_simulations_triggers_and_every_pod_at_every_tick_agree(policy: str, caps: bool) -> None:
    """The simulation's stream: one fleet (1 node, 1 h, ticks of 30 s) run with
    the triggers and with every pod evaluated at every tick (without the
    agent's dead-band, which the triggers model: exactly the same decisions)."""
    exact = ControlConfig(band_bytes=0, band_fraction=0.0, caps=caps)
    text = {"annotate-only": ANNOTATE_ONLY, "built-in": DEFAULT_POLICY, "acting": ACTING, "capping": CAPPING}[policy]
    base = replace(SMALL, hours=1.0, tick_s=30.0, mix=MIX, policy=parse_policy(text, policy))
    fast = simulate(replace(base, control=exact))
    every = simulate(replace(base, control=replace(exact, exhaustive=True)))
    assert_agree({k: getattr(fast, k) for k in SIM_FIGURES}, {k: getattr(every, k) for k in SIM_FIGURES}, policy)
    if policy == "annotate-only":  # per-pod implicit budgets, no device coupling: the triggers' point
        assert every.pods_evaluated > 3 * fast.pods_evaluated


def test_the_scenarios_reach_every_step() -> None:
    """The sequences above are worth comparing: between them they annotate,
    throttle, cap, evict (for device pressure too), recover, warn, run dry and
    settle memory limits (a scenario that never got there would prove little)."""
    seen: set[str] = set()
    pressure = limits = 0
    for seed in range(max(SEEDS, 40)):
        w, scenario, now = _world(), Scenario(seed), T0
        for _ in range(45):
            now += timedelta(seconds=PERIOD)
            for _ in range(scenario.rng.choice([0, 1, 1, 2, 3])):
                scenario.change([w], now)
            decisions = w.step_full(now)
            seen |= {type(d).__name__ for d in decisions}
            pressure += sum(1 for d in decisions if isinstance(d, Evict) and d.violation.kind == "DevicePressure")
            limits += sum(1 for a in _annotations(w).values() if "vramguard.io/memory-limits" in a)
    assert {"Annotate", "Throttle", "Cap", "Evict", "Recover", "Warn", "DryRunStep"} <= seen, seen
    assert pressure and limits, (pressure, limits)
