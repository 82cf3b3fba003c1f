"""The pure parts of the demo runner (hack/demo/run.py): the demo scenario, the
agents' scenario written from it once the pods run, the kubelet stand-in's
status patch, and the summary built from vramguard's Events.

Nothing here talks to a cluster; run.py does the I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from vramguard_api.units import parse_duration

OUTCOMES = ("annotated", "throttled", "evicted", "leftAlone")
# vramguard's Event reasons, by the outcome they show (docs/operator.md, "Actions, in order").
ANNOTATE_REASONS = frozenset({"LimitExceeded", "LeakDetected"})
THROTTLE_REASONS = frozenset({"Throttled"})
EVICT_REASONS = frozenset({"Evicting", "DevicePressure"})
COMPONENT = "vramguard"
_EPOCH = datetime.fromtimestamp(0, UTC)


# --- the demo scenario -------------------------------------------------------------------


@dataclass(frozen=True)
class PodPlan:
    """One simulated pod: ``id`` (its name in the summary), the namespace and
    labels that select exactly one real pod, and the node it runs on."""

    id: str
    namespace: str
    labels: Mapping[str, str]
    node: str

    def matches(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``pod`` (an API Pod dict) is in the namespace with these labels."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        return meta.get("namespace") == self.namespace and all(labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True)
class DemoScenario:
    """``hack/demo/scenario.yaml`` parsed: speeds and durations in seconds;
    ``saved_from_oom``: pods that the simulated GPUs kill when nobody acts and
    that must survive the run; ``dra_devices``: the devices of each node that
    the stand-in DRA driver publishes (hack/demo/dra.py)."""

    speed: float
    sample_interval_s: float
    duration_s: float
    short_duration_s: float
    namespaces: Mapping[str, Mapping[str, str]]
    objects: Sequence[Mapping[str, Any]]
    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[PodPlan]
    expect: Mapping[str, frozenset[str]]
    saved_from_oom: frozenset[str] = frozenset()
    dra_devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def node_names(self) -> list[str]:
        """The simulated nodes, one agent each."""
        return [str(n["name"]) for n in self.nodes]


def load_scenario(path: Path) -> DemoScenario:
    """Read and check the demo scenario. Raises ``ValueError`` naming the file and
    the field: a pod without ``id`` or ``select``, a duplicate id, an object in a
    namespace the scenario does not create, an expectation naming an unknown id."""
    data = yaml.safe_load(path.read_text())
    where = str(path)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: want a mapping")
    namespaces = {str(k): dict(v or {}) for k, v in (data.get("namespaces") or {}).items()}
    pods: list[PodPlan] = []
    for i, node in enumerate(data.get("nodes") or ()):
        for j, pod in enumerate(node.get("pods") or ()):
            field_ = f"{where}: nodes[{i}].pods[{j}]"
            select = pod.get("select") or {}
            if not pod.get("id") or not select.get("namespace"):
                raise ValueError(f"{field_}: needs id and select.namespace")
            if select["namespace"] not in namespaces:
                raise ValueError(f"{field_}: namespace {select['namespace']!r} is not in namespaces")
            pods.append(PodPlan(str(pod["id"]), select["namespace"], dict(select.get("labels") or {}), node["name"]))
    ids = [p.id for p in pods]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: duplicate pod ids in {ids}")
    for obj in data.get("objects") or ():
        ns = (obj.get("metadata") or {}).get("namespace")
        if ns is not None and ns not in namespaces:
            raise ValueError(f"{where}: {obj.get('kind')} {obj['metadata'].get('name')}: namespace {ns!r} is not in namespaces")
    expect, saved, dra_devices = _expectations(data, set(ids), where)

    def seconds(key: str, default: str) -> float:
        return parse_duration(str(data.get(key, default)), f"{where}: {key}")

    speed = float(data.get("speed", 1))
    if speed <= 0:
        raise ValueError(f"{where}: speed: {speed} is not positive")
    return DemoScenario(
        speed=speed,
        sample_interval_s=seconds("sampleInterval", "1s"),
        duration_s=seconds("duration", "150s"),
        short_duration_s=seconds("shortDuration", "90s"),
        namespaces=namespaces,
        objects=list(data.get("objects") or ()),
        nodes=list(data.get("nodes") or ()),
        pods=pods,
        expect=expect,
        saved_from_oom=saved,
        dra_devices=dra_devices,
    )


def _expectations(
    data: Mapping[str, Any], ids: set[str], where: str
) -> tuple[dict[str, frozenset[str]], frozenset[str], dict[str, tuple[str, ...]]]:
    """The scenario's ``expect`` (outcomes, ``savedFromOOM``) and ``draDevices``;
    ``ValueError`` for an unknown pod id or node."""
    expect: dict[str, frozenset[str]] = {}
    for key in OUTCOMES:
        named = frozenset(str(x) for x in (data.get("expect") or {}).get(key) or ())
        unknown = named - ids
        if unknown:
            raise ValueError(f"{where}: expect.{key}: unknown pod ids {sorted(unknown)}")
        expect[key] = named
    saved = frozenset(str(x) for x in (data.get("expect") or {}).get("savedFromOOM") or ())
    if saved - ids:
        raise ValueError(f"{where}: expect.savedFromOOM: unknown pod ids {sorted(saved - ids)}")
    dra_devices = {str(k): tuple(str(d) for d in v or ()) for k, v in (data.get("draDevices") or {}).items()}
    unknown_nodes = set(dra_devices) - {str(n.get("name")) for n in data.get("nodes") or ()}
    if unknown_nodes:
        raise ValueError(f"{where}: draDevices: unknown nodes {sorted(unknown_nodes)}")
    return expect, saved, dra_devices


@dataclass(frozen=True)
class Resolved:
    """The agents' scenario (the format of docs/agent.md, real pod names) and the
    pods it names: ``by_uid`` id by pod uid, ``pods`` the Pod dicts by id."""

    agent_scenario: dict[str, Any]
    by_uid: dict[str, str]
    pods: dict[str, Mapping[str, Any]]


def resolve(scenario: DemoScenario, pods: Iterable[Mapping[str, Any]]) -> Resolved:
    """Name each simulated pod after the one running pod its ``select`` matches.
    Raises ``LookupError`` naming the id when none or several match."""
    running = [
        p for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    chosen: dict[str, Mapping[str, Any]] = {}
    for plan in scenario.pods:
        found = [p for p in running if plan.matches(p)]
        if len(found) != 1:
            names = sorted(p["metadata"]["name"] for p in found)
            raise LookupError(f"pod {plan.id}: want one running pod in {plan.namespace} with labels "
                              f"{dict(plan.labels)}, found {names or 'none'}")
        chosen[plan.id] = found[0]
    nodes = []
    for node in scenario.nodes:
        out = {k: v for k, v in node.items() if k != "pods"}
        out["pods"] = []
        for pod in node.get("pods") or ():
            meta = chosen[pod["id"]]["metadata"]
            entry = {k: v for k, v in pod.items() if k not in ("id", "select")}
            out["pods"].append({"namespace": meta["namespace"], "name": meta["name"], **entry})
        nodes.append(out)
    by_uid = {p["metadata"]["uid"]: pid for pid, p in chosen.items()}
    return Resolved({"nodes": nodes}, by_uid, chosen)


# --- the kubelet stand-in -----------------------------------------------------------------


def kubelet_status_patch(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The status patch a kubelet with in-place resize would make: each running
    container's ``resources`` as its spec says (after a resize too). None when
    the status already says so, or the pod is not running.

    kwok runs pods but reports no container resources, and the API server
    accepts ``pods/resize`` only for pods whose running containers report
    them; the demo plays this part of the kubelet (as tests/e2e do)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    containers = (pod.get("spec") or {}).get("containers") or []
    current = {s.get("name"): s for s in status.get("containerStatuses") or []}
    statuses, changed = [], False
    for c in containers:
        have = dict(current.get(c["name"]) or {})
        want = _resources(c.get("resources") or {})
        if have.get("resources") != want:
            changed = True
        state = have.get("state") or {}
        statuses.append({
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": have.get("imageID", ""),
            "ready": True,
            "started": True,
            "restartCount": have.get("restartCount", 0),
            "state": state if state.get("running") else {"running": {"startedAt": status.get("startTime")}},
            "resources": want,
        })
    return {"status": {"containerStatuses": statuses}} if changed else None


def _resources(r: Mapping[str, Any]) -> dict[str, Any]:
    return {k: dict(r[k]) for k in ("limits", "requests") if r.get(k)}


# --- the summary ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventLine:
    """One vramguard Event on a pod (repeats of the same message counted)."""

    reason: str
    message: str
    time: datetime | None
    count: int = 1


@dataclass
class PodOutcome:
    """What happened to one pod: its Events and the outcomes they show."""

    id: str
    namespace: str
    name: str
    workload: str
    events: list[EventLine] = field(default_factory=list)

    @property
    def reasons(self) -> set[str]:
        return {e.reason for e in self.events}

    @property
    def outcomes(self) -> list[str]:
        """``annotated``, ``throttled``, ``evicted`` as shown by the Events;
        ``leftAlone`` when none of them."""
        out = [
            name
            for name, reasons in (
                ("annotated", ANNOTATE_REASONS),
                ("throttled", THROTTLE_REASONS),
                ("evicted", EVICT_REASONS),
            )
            if self.reasons & reasons
        ]
        return out or ["leftAlone"]


def workload_of(pod: Mapping[str, Any]) -> str:
    """``Deployment chat``, ``Job llm-sweep``, or ``Pod sdxl-0`` (from the owner
    references; a ReplicaSet's name less its pod-template hash is the Deployment's)."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") == "ReplicaSet":
            hash_ = (meta.get("labels") or {}).get("pod-template-hash")
            name = ref["name"]
            return "Deployment " + (name[: -len(hash_) - 1] if hash_ and name.endswith("-" + hash_) else name)
        if ref.get("kind"):
            return f"{ref['kind']} {ref['name']}"
    return f"Pod {meta.get('name')}"


def event_time(e: Mapping[str, Any]) -> datetime | None:
    """When an Event (API-form dict) happened: its first, event or last timestamp; None without one."""
    raw = e.get("firstTimestamp") or e.get("eventTime") or e.get("lastTimestamp")
    if not raw:
        return None
    return datetime.fromisoformat(str(raw).replace("Z", "+00:00"))


def outcomes(
    resolved: Resolved,
    events: Iterable[Mapping[str, Any]],
    seen_pods: Mapping[str, Mapping[str, Any]],
    scenario: DemoScenario,
) -> list[PodOutcome]:
    """Each demo pod's outcome from vramguard's Events on pods. ``seen_pods``:
    every Pod the run saw, by uid (replacements the controllers made are
    reported too, with the id ``<id>~new``: the pod they replace)."""
    result: dict[str, PodOutcome] = {}
    for pid, pod in resolved.pods.items():
        meta = pod["metadata"]
        result[meta["uid"]] = PodOutcome(pid, meta["namespace"], meta["name"], workload_of(pod))
    for uid, pod in sorted(seen_pods.items(), key=lambda kv: kv[1]["metadata"].get("creationTimestamp") or ""):
        if uid in result:
            continue
        plan = next((p for p in scenario.pods if p.matches(pod)), None)
        if plan is not None:
            meta = pod["metadata"]
            result[uid] = PodOutcome(plan.id + "~new", meta["namespace"], meta["name"], workload_of(pod))
    ordered = sorted(
        (e for e in events if from_vramguard(e) and (e.get("involvedObject") or {}).get("kind") == "Pod"),
        key=lambda e: (event_time(e) or _EPOCH, (e.get("metadata") or {}).get("name", "")),
    )
    for e in ordered:
        target = result.get((e.get("involvedObject") or {}).get("uid") or "")
        if target is not None:
            target.events.append(EventLine(e.get("reason") or "", e.get("message") or "", event_time(e),
                                           int(e.get("count") or 1)))
    return list(result.values())


def budget_only_events(events: Iterable[Mapping[str, Any]]) -> list[tuple[str, EventLine]]:
    """vramguard's Events on budgets that no pod got a copy of (the engine posts
    each pod's Event on its budget too; a total's recovery only on the budget),
    as (budget name, Event), oldest first."""
    mine = [e for e in events if from_vramguard(e)]
    on_pods = {(e.get("reason"), e.get("message")) for e in mine if (e.get("involvedObject") or {}).get("kind") == "Pod"}
    out = [
        ((e.get("involvedObject") or {}).get("name") or "",
         EventLine(e.get("reason") or "", e.get("message") or "", event_time(e), int(e.get("count") or 1)))
        for e in mine
        if (e.get("involvedObject") or {}).get("kind") == "GPUMemoryBudget"
        and (e.get("reason"), e.get("message")) not in on_pods
    ]
    return sorted(out, key=lambda x: (x[1].time or _EPOCH, x[0]))


def from_vramguard(e: Mapping[str, Any]) -> bool:
    """Whether an Event (API-form dict) was posted by vramguard (its source or reporting component)."""
    return (e.get("source") or {}).get("component") == COMPONENT or e.get("reportingComponent") == COMPONENT


def check(expect: Mapping[str, frozenset[str]], results: Sequence[PodOutcome]) -> dict[str, tuple[list[str], list[str]]]:
    """Per outcome, the ids expected but missing and the ids present but not
    expected (replacement pods, ``~new``, are not checked). Empty lists
    everywhere: the run matches the scenario."""
    out = {}
    for key in OUTCOMES:
        got = {r.id for r in results if key in r.outcomes and not r.id.endswith("~new")}
        want = set(expect.get(key, frozenset()))
        out[key] = (sorted(want - got), sorted(got - want))
    return out


def summary_json(results: Sequence[PodOutcome], mismatch: Mapping[str, tuple[list[str], list[str]]],
                 extra: Mapping[str, Any], budget_events: Sequence[tuple[str, EventLine]] = ()) -> dict[str, Any]:
    """The summary as JSON (``--summary-json``): pods with outcomes and Events,
    the ids per outcome, the mismatches, budget-only Events, and ``extra``
    (timings, processes)."""
    return {
        **extra,
        "budgetEvents": [
            {"budget": b, "reason": e.reason, "message": e.message, "time": e.time.isoformat() if e.time else None}
            for b, e in budget_events
        ],
        "pods": [
            {
                "id": r.id,
                "namespace": r.namespace,
                "name": r.name,
                "workload": r.workload,
                "outcomes": r.outcomes,
                "events": [
                    {"reason": e.reason, "message": e.message, "time": e.time.isoformat() if e.time else None,
                     "count": e.count}
                    for e in r.events
                ],
            }
            for r in results
        ],
        "outcomes": {k: sorted(r.id for r in results if k in r.outcomes) for k in OUTCOMES},
        "mismatch": {k: {"missing": v[0], "unexpected": v[1]} for k, v in mismatch.items() if v[0] or v[1]},
    }
