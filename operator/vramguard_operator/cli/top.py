"""``vramguard top``: GPU pods with their VRAM (per device) and RAM, their
effective limits and where each came from, the VRAM trend and the state vramguard
has them in, sorted by pressure. Works against any cluster where vramguard runs,
with the current kubeconfig (or ``--kubeconfig``).

What is read (all through the API, nothing from the operator's memory):

- Pods of the namespace (``-n``; ``-A`` for all) and the ``NodeGPUUsage``
  reports: VRAM per device, RAM working set and trend features, by pod uid;
- ``GPUMemoryBudget``s: the budgets that select a pod give its limits, lowered
  by the ``GPUMemoryPolicy`` ceilings exactly as the operator lowers them
  (``ceilings.effective_budget``), with their sources (``gmb/<budget>``, or
  ``policy/<name>/ceiling``); their status gives open and pending violations
  and warnings;
- a pod no budget selects: its implicit limits from the annotation
  ``vramguard.io/limits`` (``node/time-slicing:4``, ``vgpu/usable``,
  ``mig/1g.5gb``, ``policy/<name>``, ...);
- the pod annotations ``vramguard.io/violations`` (open violations that reached
  a step) and ``vramguard.io/original-cpu`` (throttled).

``build_rows`` is pure (a ``Snapshot`` in, ``Row``s out); ``fetch`` does the reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from vramguard_api.budget import DEFAULT_WARNING_THRESHOLD, GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.units import format_bytes, parse_duration
from vramguard_api.usage import GPUDevice, PodUsage
from vramguard_operator.controller.indexes import budget_entry, policy_entry, report_entry, report_node
from vramguard_operator.engine.escalation import records_from_annotation
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.engine.types import ANNOTATION_ORIGINAL_CPU, ANNOTATION_VIOLATIONS
from vramguard_operator.policy.ceilings import effective_budget
from vramguard_operator.policy.implicit import read_limits
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.shares import PodGPURequest

GROUP, VERSION = "vramguard.io", "v1alpha1"
DEFAULT_FRESHNESS_S = 60.0
# Growth below this (bytes per hour) is shown as "flat": the noise of a steady pod.
FLAT_GROWTH_BYTES_PER_HOUR = 64 * 2**20

# States, most severe first; a pod shows the first that holds.
STATES = ("leak", "throttled", "violating", "warning", "ok")
_SEVERITY = {s: len(STATES) - i for i, s in enumerate(STATES)}
# Limit paths of a budget's spec and status.limitSources, and their short names in the table.
LIMIT_NAMES = {
    "perDevice": "dev",
    "perPod.vram": "pod",
    "perPod.ram": "ram",
    "total.vram": "total",
    "total.ram": "total-ram",
}


@dataclass(frozen=True)
class Snapshot:
    """What ``build_rows`` needs, in API form (JSON-like dicts, camelCase keys).

    ``namespace_labels``: labels by namespace name (policies select namespaces by
    them); ``now``: timezone-aware, for report freshness; ``notes``: what could
    not be read (shown under the table)."""

    pods: Sequence[Mapping[str, Any]]
    budgets: Sequence[Mapping[str, Any]] = ()
    policies: Sequence[Mapping[str, Any]] = ()
    reports: Sequence[Mapping[str, Any]] = ()
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    freshness_s: float = DEFAULT_FRESHNESS_S
    notes: Sequence[str] = ()


@dataclass(frozen=True)
class DeviceFigure:
    """A pod's VRAM on one device. ``label``: ``gpu<index>``, ``gpu<index>/<MIG
    profile>`` for a MIG device; bytes None when unknown."""

    label: str
    uuid: str
    used_bytes: int | None


@dataclass(frozen=True)
class Limit:
    """One effective limit of a pod: ``name`` (``dev``, ``pod``, ``ram``,
    ``total``, ``total-ram``), the limit and the usage it is compared with
    (bytes; for ``dev`` on the device where the ratio is highest, for totals the
    sum over the budget's selected pods), and its source."""

    name: str
    limit_bytes: int
    used_bytes: int | None
    source: str

    @property
    def ratio(self) -> float | None:
        """used / limit, None when the usage is unknown or the limit is 0."""
        if self.used_bytes is None or self.limit_bytes <= 0:
            return None
        return self.used_bytes / self.limit_bytes


@dataclass(frozen=True)
class Row:
    """One pod in the table. ``pressure``: the highest usage/limit ratio over its
    limits (None without a measured limit); ``growth_bytes_per_hour`` from the
    agent's trend features; ``why``: the violations and warnings behind
    ``state``; ``stale``: its node's report is older than the freshness bound
    (or missing)."""

    namespace: str
    pod: str
    node: str | None
    vram_bytes: int | None
    devices: tuple[DeviceFigure, ...]
    ram_bytes: int | None
    limits: tuple[Limit, ...]
    growth_bytes_per_hour: float | None
    trend_leak: bool | None
    state: str
    why: tuple[str, ...]
    pressure: float | None
    stale: bool

    @property
    def binding(self) -> Limit | None:
        """The limit with the highest usage ratio (else the first one)."""
        measured = [lim for lim in self.limits if lim.ratio is not None]
        if measured:
            return max(measured, key=lambda lim: lim.ratio or 0.0)
        return self.limits[0] if self.limits else None

    def sort_key(self) -> tuple[int, float, str, str]:
        """State first (leak, throttled, violating, warning, ok), then pressure."""
        return (-_SEVERITY[self.state], -(self.pressure or 0.0), self.namespace, self.pod)


# --- building rows (pure) ----------------------------------------------------------------


@dataclass
class _Budget:
    name: str
    namespace: str
    model: GPUMemoryBudget  # with the effective (ceiling-lowered) limits
    sources: dict[str, str]
    matches: Any
    threshold: float
    selected: list[str] = field(default_factory=list)  # pod uids


@dataclass(frozen=True)
class _Usage:
    pod: PodUsage
    node: str
    devices: Mapping[str, GPUDevice]
    fresh: bool


def _parse_reports(snap: Snapshot) -> tuple[dict[str, _Usage], set[str], list[str]]:
    """Pod usage by uid, the nodes with a fresh report, and problems."""
    usage: dict[str, _Usage] = {}
    fresh_nodes: set[str] = set()
    notes: list[str] = []
    for body in snap.reports:
        entry = report_entry(body).value
        if isinstance(entry, str):
            notes.append(entry)
            continue
        node, status = report_node(body), entry.status
        if status is None:
            continue
        age = (snap.now - status.sample_time).total_seconds()
        fresh = age <= snap.freshness_s
        if fresh:
            fresh_nodes.add(node)
        devices = {d.uuid: d for d in status.devices}
        for p in status.pods:
            usage[p.uid] = _Usage(p, node, devices, fresh)
    return usage, fresh_nodes, notes


def _parse_budgets(snap: Snapshot, notes: list[str]) -> dict[str, list[_Budget]]:
    policies: list[GPUMemoryPolicy] = []
    for body in snap.policies:
        p = policy_entry(body).value
        if isinstance(p, str):
            notes.append(p)
        else:
            policies.append(p)
    out: dict[str, list[_Budget]] = {}
    for body in snap.budgets:
        entry = budget_entry(body).value
        if entry.budget is None:
            notes.append(entry.error or f"GPUMemoryBudget {entry.namespace}/{entry.name}: does not parse")
            continue
        ns = entry.namespace
        labels = {"kubernetes.io/metadata.name": ns, **snap.namespace_labels.get(ns, {})}
        try:
            matcher = compile_selector(entry.budget.spec.selector)
            model, sources = effective_budget(entry.budget, merge(policies, ns, labels))
        except ValueError as err:
            notes.append(f"GPUMemoryBudget {ns}/{entry.name}: {err}")
            continue
        named = {k: f"gmb/{entry.name}" if v == "budget" else v for k, v in sources.items()}
        threshold = entry.budget.spec.warning_threshold
        out.setdefault(ns, []).append(_Budget(entry.name, ns, model, named, matcher, threshold))
    return out


def _device_label(d: GPUDevice | None) -> str:
    if d is None:
        return "gpu?"
    return f"gpu{d.index}/{d.mig_profile}" if d.mig_profile else f"gpu{d.index}"


def _usable(d: GPUDevice | None) -> int | None:
    return None if d is None or d.memory is None else d.memory.usable_bytes


def _budget_limits(b: _Budget, u: _Usage | None, totals: Mapping[str, tuple[int | None, int | None]]) -> list[Limit]:
    lim = b.model.spec.limits
    out: list[Limit] = []
    if lim.per_device is not None:
        best: Limit | None = None
        devices = u.pod.devices if u is not None else []
        for dev in devices:
            cap = lim.per_device.bytes_for(_usable(u.devices.get(dev.uuid) if u else None))
            if cap is None:
                continue
            cand = Limit("dev", cap, dev.used_bytes, b.sources.get("perDevice", f"gmb/{b.name}"))
            if best is None or (cand.ratio or 0) > (best.ratio or 0):
                best = cand
        if best is None:
            fixed = lim.per_device.bytes_for(None)
            if fixed is not None:
                best = Limit("dev", fixed, None, b.sources.get("perDevice", f"gmb/{b.name}"))
        if best is not None:
            out.append(best)
    vram = u.pod.vram_bytes if u is not None else None
    ram = u.pod.ram_working_set_bytes if u is not None else None
    for path, mem, kind, used in (
        ("perPod.vram", lim.per_pod, "vram", vram),
        ("perPod.ram", lim.per_pod, "ram", ram),
        ("total.vram", lim.total, "vram", totals[b.name][0]),
        ("total.ram", lim.total, "ram", totals[b.name][1]),
    ):
        if mem is None:
            continue
        value = mem.vram_bytes() if kind == "vram" else mem.ram_bytes()
        if value is not None:
            out.append(Limit(LIMIT_NAMES[path], value, used, b.sources.get(path, f"gmb/{b.name}")))
    return out


def _implicit_limits(annotations: Mapping[str, str], u: _Usage | None) -> list[Limit]:
    out: list[Limit] = []
    for path, entry in sorted(read_limits(annotations).items()):
        if path not in LIMIT_NAMES or not isinstance(entry, Mapping):
            continue
        try:
            value = int(entry["bytes"])
        except (KeyError, TypeError, ValueError):
            continue
        source = str(entry.get("source") or "policy")
        used: int | None = None
        if u is not None:
            if path == "perDevice":
                known = [d.used_bytes for d in u.pod.devices if d.used_bytes is not None]
                used = max(known) if known else (0 if not u.pod.devices and u.pod.vram_bytes == 0 else None)
            elif path == "perPod.vram":
                used = u.pod.vram_bytes
            else:
                used = u.pod.ram_working_set_bytes
        out.append(Limit(LIMIT_NAMES[path], value, used, source))
    return out


def _state(
    pod: Mapping[str, Any],
    budgets: Sequence[_Budget],
    limits: Sequence[Limit],
    threshold: float,
) -> tuple[str, tuple[str, ...]]:
    """The pod's state and the reasons for it (see ``STATES``)."""
    meta = pod.get("metadata") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    annotations = meta.get("annotations") or {}
    found: set[str] = set()
    why: list[str] = []
    text = annotations.get(ANNOTATION_VIOLATIONS)
    recorded: set[tuple[str, str, str | None]] = set()
    if text:
        records, _ = records_from_annotation(text, ns, name)
        for r in records:
            if r.opened_at is None:
                continue
            recorded.add((r.key.budget, r.key.kind, r.key.device))
            found.add("leak" if r.key.kind == "Leak" else "violating")
            why.append(f"{r.key.kind} (budget {r.key.budget}): {r.step or 'open'}")
    for b in budgets:
        status = b.model.status
        if status is None:
            continue
        for v in status.violations or ():
            if v.pod not in (None, name) or (b.name, v.kind, v.device) in recorded:
                continue
            if v.opened_at is None:
                found.add("warning")
                why.append(f"{v.kind} (budget {b.name}): pending, within the tolerance")
            else:
                found.add("leak" if v.kind == "Leak" else "violating")
                mode = " (dry run)" if v.dry_run or status.effective_mode == "DryRun" else ""
                why.append(f"{v.kind} (budget {b.name}): {v.step or 'open'}{mode}")
        for w in status.warnings or ():
            if w.pod in (None, name):
                found.add("warning")
                why.append(f"{w.kind} (budget {b.name}): above the warning threshold")
    if ANNOTATION_ORIGINAL_CPU in annotations:
        found.add("throttled")
    if not found & {"leak", "violating", "warning"}:
        for lim in limits:
            if lim.ratio is not None and lim.ratio >= threshold:
                found.add("warning")
                why.append(f"{lim.name} at {lim.ratio:.0%} of {format_bytes(lim.limit_bytes)} ({lim.source})")
    state = next((s for s in STATES if s in found), "ok")
    return state, tuple(why)


def _is_gpu_pod(pod: Mapping[str, Any]) -> bool:
    try:
        return PodGPURequest.from_api(pod).is_gpu_pod
    except (ValueError, TypeError):
        return False


def build_rows(snap: Snapshot) -> tuple[list[Row], list[str]]:
    """The table's rows, sorted by pressure, and notes about what could not be
    read. A row for each pod that is not finished and is measured in a node
    report, requests a GPU resource, or is selected by a budget."""
    usage, fresh_nodes, notes = _parse_reports(snap)
    budgets = _parse_budgets(snap, notes)
    live = [
        p for p in snap.pods if ((p.get("status") or {}).get("phase")) not in ("Succeeded", "Failed")
    ]
    selecting: dict[str, list[_Budget]] = {}
    for pod in live:
        meta = pod.get("metadata") or {}
        uid, labels = meta.get("uid") or "", meta.get("labels") or {}
        for b in budgets.get(meta.get("namespace") or "", ()):
            if b.matches(labels):
                b.selected.append(uid)
                selecting.setdefault(uid, []).append(b)
    totals: dict[str, tuple[int | None, int | None]] = {}
    for group in budgets.values():
        for b in group:
            vram = [usage[u].pod.vram_bytes for u in b.selected if u in usage]
            ram = [usage[u].pod.ram_working_set_bytes for u in b.selected if u in usage]
            totals[b.name] = (
                sum(v for v in vram if v is not None) if vram else None,
                sum(r for r in ram if r is not None) if ram else None,
            )
    rows = []
    for pod in live:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid = meta.get("uid") or ""
        u = usage.get(uid)
        mine = selecting.get(uid, [])
        if u is None and not mine and not _is_gpu_pod(pod):
            continue
        limits: list[Limit] = []
        for b in mine:
            limits.extend(_budget_limits(b, u, totals))
        if not mine:
            limits.extend(_implicit_limits(meta.get("annotations") or {}, u))
        threshold = min((b.threshold for b in mine), default=DEFAULT_WARNING_THRESHOLD)
        state, why = _state(pod, mine, limits, threshold)
        ratios = [lim.ratio for lim in limits if lim.ratio is not None]
        trend = u.pod.trend if u is not None else None
        node = spec.get("nodeName")
        rows.append(
            Row(
                namespace=meta.get("namespace") or "",
                pod=meta.get("name") or "",
                node=node,
                vram_bytes=u.pod.vram_bytes if u is not None else None,
                devices=tuple(
                    DeviceFigure(_device_label(u.devices.get(d.uuid)), d.uuid, d.used_bytes) for d in u.pod.devices
                )
                if u is not None
                else (),
                ram_bytes=u.pod.ram_working_set_bytes if u is not None else None,
                limits=tuple(limits),
                growth_bytes_per_hour=trend.growth_bytes_per_hour if trend is not None else None,
                trend_leak=trend.leak if trend is not None else None,
                state=state,
                why=why,
                pressure=max(ratios) if ratios else None,
                stale=node not in fresh_nodes,
            )
        )
    rows.sort(key=Row.sort_key)
    return rows, [*snap.notes, *notes]


# --- rendering ------------------------------------------------------------------------------


def trend_text(growth_bytes_per_hour: float | None, leak: bool | None = None) -> str:
    """``+1.2Gi/h``, ``-300Mi/h``, ``flat`` (below 64Mi/h either way) or ``-`` (unknown)."""
    if growth_bytes_per_hour is None:
        return "-"
    if abs(growth_bytes_per_hour) < FLAT_GROWTH_BYTES_PER_HOUR:
        return "flat"
    sign = "+" if growth_bytes_per_hour > 0 else "-"
    return f"{sign}{format_bytes(abs(growth_bytes_per_hour))}/h"


def _devices_text(devices: Sequence[DeviceFigure], most: int = 3) -> str:
    if not devices:
        return "-"
    shown = sorted(devices, key=lambda d: -(d.used_bytes or 0))[:most]
    parts = [f"{d.label}:{format_bytes(d.used_bytes) if d.used_bytes is not None else '?'}" for d in shown]
    if len(devices) > most:
        parts.append(f"+{len(devices) - most}")
    return " ".join(sorted(parts))


def table_rows(rows: Iterable[Row], all_namespaces: bool, wide: bool = False) -> list[list[str]]:
    """The cells of the table, header first."""
    header = ["POD", "NODE", "VRAM", "DEVICES", "RAM", "LIMIT", "SOURCE", "USE", "TREND", "STATE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    if wide:
        header += ["LIMITS", "WHY"]
    out = [header]
    for r in rows:
        bind = r.binding
        vram = "?" if r.vram_bytes is None else format_bytes(r.vram_bytes)
        cells = [
            r.pod,
            r.node or "-",
            vram + ("*" if r.stale else ""),
            _devices_text(r.devices),
            format_bytes(r.ram_bytes),
            f"{bind.name} {format_bytes(bind.limit_bytes)}" if bind else "-",
            bind.source if bind else "-",
            f"{r.pressure:.0%}" if r.pressure is not None else "-",
            trend_text(r.growth_bytes_per_hour, r.trend_leak),
            r.state,
        ]
        if all_namespaces:
            cells.insert(0, r.namespace)
        if wide:
            cells.append(", ".join(f"{x.name} {format_bytes(x.limit_bytes)} ({x.source})" for x in r.limits) or "-")
            cells.append("; ".join(r.why) or "-")
        out.append(cells)
    return out


def render(rows: Sequence[Row], notes: Sequence[str] = (), all_namespaces: bool = False, wide: bool = False) -> str:
    """The table as text (columns padded like kubectl's), with footnotes."""
    if not rows:
        lines = ["No GPU pods found."]
    else:
        cells = table_rows(rows, all_namespaces, wide)
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        if any(r.stale for r in rows):
            lines.append("* no fresh node report: the figures may be old or missing")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts (``-o json``)."""
    out = []
    for r in rows:
        d = asdict(r)
        d["devices"] = [asdict(x) for x in r.devices]
        d["limits"] = [{**asdict(x), "ratio": x.ratio} for x in r.limits]
        d["why"] = list(r.why)
        out.append(d)
    return out


# --- reading the cluster ------------------------------------------------------------------


def _items(response: Any) -> list[dict[str, Any]]:
    data = json.loads(response.data) if hasattr(response, "data") else response
    return list(data.get("items") or [])


def fetch(api: Any, namespace: str | None, freshness_s: float = DEFAULT_FRESHNESS_S) -> Snapshot:
    """Read a ``Snapshot`` through ``api`` (a kubernetes ``ApiClient``):
    ``namespace`` None reads every namespace. Cluster-scoped reads that are
    forbidden (policies, namespaces, reports) become notes; a missing
    vramguard CRD raises ``LookupError``."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    notes: list[str] = []
    if namespace is None:
        pods = _items(core.list_pod_for_all_namespaces(_preload_content=False))
    else:
        pods = _items(core.list_namespaced_pod(namespace, _preload_content=False))
    try:
        if namespace is None:
            budgets = _items(custom.list_cluster_custom_object(GROUP, VERSION, "gpumemorybudgets"))
        else:
            budgets = _items(custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets"))
    except ApiException as err:
        if err.status == 404:
            raise LookupError("vramguard's CRDs are not installed in this cluster (kubectl apply -f crds/)") from None
        raise

    def optional(what: str, call: Any) -> list[dict[str, Any]]:
        try:
            return _items(call())
        except ApiException as err:
            if err.status in (401, 403, 404):
                notes.append(f"cannot list {what}: {err.status} {err.reason}")
                return []
            raise

    policies = optional("gpumemorypolicies", lambda: custom.list_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies"))
    reports = optional("nodegpuusages", lambda: custom.list_cluster_custom_object(GROUP, VERSION, "nodegpuusages"))
    labels: dict[str, dict[str, str]] = {}
    if policies:
        listed = optional("namespaces", lambda: core.list_namespace(_preload_content=False))
        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in listed}
    return Snapshot(pods, budgets, policies, reports, labels, datetime.now(UTC), freshness_s, notes)


def _current_namespace(kubeconfig: str | None, context: str | None) -> str:
    from kubernetes import config

    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except config.ConfigException:
        return "default"
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _api(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            pass
    return config.new_client_from_config(config_file=kubeconfig, context=context)


# --- the command ------------------------------------------------------------------------------


def _duration(flag: str) -> Any:
    def parse(value: str) -> float:
        try:
            return parse_duration(value, field=flag)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``vramguard top`` flags."""
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="pods of every namespace")
    p.add_argument("-w", "--watch", action="store_true", help="refresh until interrupted")
    p.add_argument(
        "--interval", type=_duration("--interval"), default=2.0, help="refresh interval with --watch (default 2s)"
    )
    p.add_argument("-o", "--output", choices=["table", "wide", "json"], default="table", help="output format")
    p.add_argument(
        "--freshness",
        type=_duration("--freshness"),
        default=DEFAULT_FRESHNESS_S,
        help="node reports older than this are marked stale (default 60s, the operator's default)",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context")


def show(api: Any, args: argparse.Namespace, namespace: str | None) -> str:
    """One refresh of the output as text."""
    rows, notes = build_rows(fetch(api, namespace, args.freshness))
    if args.output == "json":
        return json.dumps({"rows": rows_json(rows), "notes": list(notes)}, indent=2, default=str)
    return render(rows, notes, all_namespaces=namespace is None, wide=args.output == "wide")


def run(args: argparse.Namespace) -> int:
    """Print the table once, or refresh it every ``--interval`` with ``--watch``."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        api = _api(args.kubeconfig, args.context)
    except Exception as err:  # noqa: BLE001 - ConfigException, a missing or malformed file
        print(f"vramguard top: cannot load a Kubernetes configuration: {err}", file=sys.stderr)
        return 1
    namespace = None if args.all_namespaces else (args.namespace or _current_namespace(args.kubeconfig, args.context))
    tty = sys.stdout.isatty()
    try:
        while True:
            try:
                text = show(api, args, namespace)
            except LookupError as err:
                print(f"vramguard top: {err}", file=sys.stderr)
                return 1
            except (ApiException, HTTPError, OSError) as err:
                print(f"vramguard top: cannot read the cluster: {err}", file=sys.stderr)
                if not args.watch:
                    return 1
                text = ""
            if not args.watch:
                print(text)
                return 0
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            head = "\x1b[H\x1b[2J" if tty else ""
            print(f"{head}vramguard top {'-A' if namespace is None else '-n ' + namespace}   {stamp}\n{text}\n",
                  flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
