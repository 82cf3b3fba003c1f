"""The scale benchmark's cluster: N kwok GPU nodes with 8 GPU pods each across
100 namespaces, 200 budgets, a policy giving unbudgeted pods a default share,
and a load generator that writes each node's NodeGPUUsage every 30 s with
every pod's VRAM moving by ±16 MiB, as real agents do.

The fleet grows (``grow_to``) so that one cluster serves every size in turn.
The operator runs under a ServiceAccount token, so that the API server's audit
log (hack/cluster/up.sh turns it on for ServiceAccounts) counts its requests.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.e2e.chart_rbac import AuditLog, token_kubeconfig
from tests.e2e.operator_harness import GI, GROUP, VERSION, gpu_node_manifest, stamp, wait_for
from tests.unit.chart.rbac import read_events

# VG_SCALE_POLICY=recommended: the policy also sets devicePressure (minFree 5%)
# and softLimits: Share, as examples/recommended-policy.yaml does (the pods of
# a node are then evaluated together while one of its devices is near its
# threshold, and a pod is quiet only once its soft limits stand at its share)
POLICY_EXTRA: dict[str, Any] = (
    {"devicePressure": {"minFree": "5%"}, "softLimits": "Share"}
    if os.environ.get("VG_SCALE_POLICY") == "recommended" else {}
)
# VG_SCALE_ENFORCE_CAPS=1: the agents apply memory limits (--enforce-caps), so the
# recommended policy's soft limits are written on every pod (off: they are asked
# for, but no agent applies them, and none is written)
ENFORCE_CAPS = os.environ.get("VG_SCALE_ENFORCE_CAPS") == "1"
NAMESPACES = 100
PODS_PER_NODE = 8
REPORT_PERIOD_S = 30.0
STEP = 16 << 20  # each report moves every pod's VRAM by this much, up or down
BASE_VRAM = 10 * GI
OVER_VRAM = 45 * GI  # above the budgets' 40Gi per-pod limit
LIMIT = "40Gi"
OVER_FRACTION = 0.02
LABEL = "vg-scale-bench"
GPU_POD_LABEL = "vramguard.io/gpu-pod"  # what the mutating webhook sets on GPU pods
SYSTEM_NS = "vg-scale-system"
ACCOUNT = "vg-scale-operator"
ANNOTATION = "vramguard.io/violations"
LIMITS = "vramguard.io/limits"


def namespace_of(i: int) -> str:
    return f"vg-scale-{i % NAMESPACES:02d}"


def app_of(i: int) -> str:
    """Half the pods in budget a, a quarter in b, a quarter unbudgeted."""
    return ("a", "a", "b", "free")[(i // NAMESPACES) % 4]


@dataclass
class PodSlot:
    """One pod of the fleet, what its agent reports for it, and its uid once created."""

    index: int
    node: str
    namespace: str
    name: str
    app: str
    uid: str = ""
    vram: int = BASE_VRAM
    over: bool = False
    held: bool = False  # a trial's: the load generator leaves its VRAM where the trial put it


@dataclass
class Fleet:
    """The nodes, pods and reports of the benchmark (grown with ``grow_to``)."""

    api: client.ApiClient
    nodes: list[str] = field(default_factory=list)
    pods: dict[str, list[PodSlot]] = field(default_factory=dict)  # by node
    lock: threading.Lock = field(default_factory=threading.Lock)
    reports_written: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(18))

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    # -- building

    def prepare(self) -> None:
        """Namespaces, budgets and the policy (once)."""
        _create(self.core.create_namespace, {"metadata": {"name": SYSTEM_NS}})
        for i in range(NAMESPACES):
            ns = namespace_of(i)
            _create(self.core.create_namespace, {"metadata": {"name": ns, "labels": {LABEL: "true"}}})
            for app, limits in (("a", {"perPod": {"vram": LIMIT}}),
                                ("b", {"perPod": {"vram": LIMIT, "ram": "64Gi"}})):
                _create(lambda body, ns=ns: self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, "gpumemorybudgets", body), _budget(app, limits))
        _create(lambda body: self.custom.create_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", body), {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryPolicy", "metadata": {"name": "vg-scale"},
            "spec": {"namespaceSelector": {"matchLabels": {LABEL: "true"}}, "defaults": {"shareFromNode": True},
                     **POLICY_EXTRA},
        })

    def grow_to(self, n: int) -> None:
        """Add nodes, their pods and their first reports up to ``n`` nodes."""
        new = [f"vg-scale-n{i:05d}" for i in range(len(self.nodes), n)]
        if not new:
            return
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._create_node, new))
        wait_for(lambda: self._ready_nodes() >= n, 60 + n * 0.5, f"{n} kwok nodes Ready", interval=2)
        first = len(self.nodes) * PODS_PER_NODE
        slots = [self._slot(first + k, node) for k, node in
                 ((k, new[k // PODS_PER_NODE]) for k in range(len(new) * PODS_PER_NODE))]
        existing = self._existing_pods()  # a fleet left by an interrupted run is taken as it is
        with ThreadPoolExecutor(8) as pool:
            uids = list(pool.map(lambda s: existing.get(s.name) or self._create_pod(s), slots))
        for slot, uid in zip(slots, uids, strict=True):
            slot.uid = uid
            self.pods.setdefault(slot.node, []).append(slot)
        self.nodes.extend(new)
        wait_for(lambda: self._running() >= n * PODS_PER_NODE, 120 + n * 0.5,
                 f"{n * PODS_PER_NODE} pods Running", interval=3)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._first_report, new))

    def _slot(self, i: int, node: str) -> PodSlot:
        app = app_of(i)
        slot = PodSlot(i, node, namespace_of(i), f"p{i:06d}", app)
        slot.over = app != "free" and self.rng.random() < OVER_FRACTION / 0.75
        slot.vram = OVER_VRAM if slot.over else BASE_VRAM
        return slot

    def _create_node(self, name: str) -> None:
        node = gpu_node_manifest(name)
        node["metadata"]["labels"][LABEL] = "true"
        node["metadata"]["labels"].pop("type", None)  # hack/cluster/up.sh waits for every type=kwok node
        _create(self.core.create_node, node)

    def _create_pod(self, slot: PodSlot) -> str:
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": slot.name, "labels": {LABEL: "true", "app": slot.app, GPU_POD_LABEL: "true"}},
            "spec": {
                "nodeName": slot.node, "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.invalid/trainer:1", "resources": {
                    "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                    "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}}}],
            },
        }
        try:
            resp = self.core.create_namespaced_pod(slot.namespace, body, _preload_content=False)
            return str(json.loads(resp.data)["metadata"]["uid"])
        except ApiException as err:
            if err.status != 409:
                raise
            return str(self.core.read_namespaced_pod(slot.name, slot.namespace).metadata.uid)

    def _existing_pods(self) -> dict[str, str]:
        out, cont = {}, None
        while True:
            resp = self.core.list_pod_for_all_namespaces(label_selector=f"{LABEL}=true", limit=2000, _continue=cont,
                                                        _preload_content=False)
            data = json.loads(resp.data)
            out.update({p["metadata"]["name"]: p["metadata"]["uid"] for p in data["items"]})
            cont = data["metadata"].get("continue")
            if not cont:
                return out

    def _ready_nodes(self) -> int:
        resp = self.core.list_node(label_selector=f"{LABEL}=true", _preload_content=False)
        items = json.loads(resp.data)["items"]
        return sum(1 for n in items if any(c["type"] == "Ready" and c["status"] == "True"
                                           for c in n.get("status", {}).get("conditions") or ()))

    def _running(self) -> int:
        count, cont = 0, None
        while True:
            resp = self.core.list_pod_for_all_namespaces(
                label_selector=f"{LABEL}=true", field_selector="status.phase=Running", limit=2000,
                _continue=cont, _preload_content=False)
            data = json.loads(resp.data)
            count += len(data["items"])
            cont = data["metadata"].get("continue")
            if not cont:
                return count

    def _first_report(self, node: str) -> None:
        _create(lambda body: self.custom.create_cluster_custom_object(GROUP, VERSION, "nodegpuusages", body), {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeGPUUsage",
            "metadata": {"name": node, "labels": {LABEL: "true"}}, "spec": {"nodeName": node}})
        self.publish(node)

    # -- reports

    def publish(self, node: str, move: bool = False) -> None:
        """Write ``node``'s report as its agent would (``move``: every pod's VRAM
        first moves by ±16 MiB, staying within 1 GiB of where it started)."""
        with self.lock:
            for s in self.pods[node]:
                if move and not s.held:
                    base = OVER_VRAM if s.over else BASE_VRAM
                    s.vram = min(base + GI, max(base - GI, s.vram + self.rng.choice((-STEP, STEP))))
            status = _report_status(self.pods[node])
        self.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "nodegpuusages", node, {"status": status},
            _content_type="application/merge-patch+json", _preload_content=False)
        with self.lock:
            self.reports_written += 1

    def budgeted_under(self) -> list[PodSlot]:
        """Pods in a budget and below its limit (trial candidates)."""
        return [s for slots in self.pods.values() for s in slots if s.app != "free" and not s.over]

    def unbudgeted(self) -> set[str]:
        """Names of the pods no budget selects (the policy's implicit budgets)."""
        return {s.name for slots in self.pods.values() for s in slots if s.app == "free"}

    def over_pods(self) -> list[PodSlot]:
        return [s for slots in self.pods.values() for s in slots if s.over]

    def cleanup(self) -> None:
        for i in range(NAMESPACES):
            _ignore_404(lambda i=i: self.core.delete_namespace(namespace_of(i)))
        _ignore_404(lambda: self.custom.delete_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", "vg-scale"))
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: (_ignore_404(lambda: self.core.delete_node(n)), _ignore_404(
                lambda: self.custom.delete_cluster_custom_object(GROUP, VERSION, "nodegpuusages", n))), self.nodes))


def _report_status(slots: Iterable[PodSlot]) -> dict[str, Any]:
    slots = list(slots)
    return {
        "sampleTime": stamp(datetime.now(UTC)),
        "agent": {"version": "bench", "backend": "sim", "sampleIntervalSeconds": 5, "enforceCaps": ENFORCE_CAPS},
        # each device's used memory is its pod's (a complete report, as the agent's): the
        # device-pressure rule can judge it (without it every device is Unknown)
        "devices": [{"uuid": gpu_uuid(slots[0].node, d), "index": d, "modelName": "NVIDIA H100 80GB HBM3",
                     "memory": {"totalBytes": 80 * GI, "reservedBytes": 0, "usableBytes": 80 * GI,
                                "usedBytes": slots[d].vram if d < len(slots) else 0}}
                    for d in range(PODS_PER_NODE)],
        "pods": [{"uid": s.uid, "namespace": s.namespace, "name": s.name, "attribution": "Measured",
                  "vramBytes": s.vram, "ramWorkingSetBytes": 4 * GI,
                  "devices": [{"uuid": gpu_uuid(s.node, k), "usedBytes": s.vram}]}
                 for k, s in enumerate(slots)],
    }


def gpu_uuid(node: str, index: int) -> str:
    """A device's UUID in NVML's form (``GPU-`` and hex groups), unique per node
    and index, so that memory limits can be written for it (``is_gpu_uuid``)."""
    n = int(node.rsplit("n", 1)[1])
    return f"GPU-{n:08x}-{index:04x}-4000-8000-000000000000"


def _budget(app: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryBudget", "metadata": {"name": app},
            "spec": {"selector": {"matchLabels": {"app": app}}, "limits": limits,
                     "enforcement": {"mode": "Enforce", "escalation": [{"action": "Annotate", "after": "0s"}]}}}


def _create(call: Callable[[Any], Any], body: Any) -> None:
    try:
        call(body)
    except ApiException as err:
        if err.status != 409:
            raise


def _ignore_404(call: Callable[[], Any]) -> None:
    try:
        call()
    except ApiException as err:
        if err.status != 404:
            raise


# --- the load generator ----------------------------------------------------------------------


class LoadGenerator:
    """Every node re-reports every 30 s, staggered, with VRAM moving ±16 MiB.
    At most ``WORKERS`` writes are under way at once and as many wait: where the
    API server cannot take the rate (a loaded machine), the period stretches
    instead of a backlog growing without bound (the figures say what rate was
    reached and how old the reports got)."""

    WORKERS = 12

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="vg-scale-load")
        self.errors = 0
        self.slots = threading.BoundedSemaphore(2 * self.WORKERS)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        nodes = list(self.fleet.nodes)
        period = REPORT_PERIOD_S / len(nodes)
        with ThreadPoolExecutor(self.WORKERS) as pool:
            start, i = time.monotonic(), 0
            while not self.stop.is_set():
                delay = start + i * period - time.monotonic()
                if delay > 0 and self.stop.wait(delay):
                    break
                while not self.slots.acquire(timeout=1):
                    if self.stop.is_set():
                        return
                pool.submit(self._one, nodes[i % len(nodes)])
                i += 1

    def _one(self, node: str) -> None:
        try:
            self.fleet.publish(node, move=True)
        except Exception:  # a failed report only makes the load lighter
            self.errors += 1
        finally:
            self.slots.release()


# --- the operator's identity and requests -------------------------------------------------


def operator_kubeconfig(api: client.ApiClient, admin_kubeconfig: str, path: Path) -> str:
    """A kubeconfig for a ServiceAccount bound to cluster-admin, so that the
    audit log records the operator's requests (and only those)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    _create(lambda b: core.create_namespaced_service_account(SYSTEM_NS, b), {"metadata": {"name": ACCOUNT}})
    _create(rbac.create_cluster_role_binding, {
        "metadata": {"name": ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": SYSTEM_NS}]})
    token = core.create_namespaced_service_account_token(
        ACCOUNT, SYSTEM_NS, {"spec": {"expirationSeconds": 6 * 3600}}).status.token
    return token_kubeconfig(admin_kubeconfig, token, path)


@dataclass
class Requests:
    """The operator's requests in a window, from the audit log (hack/cluster/up.sh
    logs every ServiceAccount request at Metadata level, RequestReceived left
    out): ``total``, the requests that completed in the window (stage
    ResponseComplete: every request once, a watch when it ends), ``writes``
    those of them that create, update, patch or delete, ``watches`` the
    watches opened in the window (stage ResponseStarted), ``by_verb`` the
    completed ones by "verb resource[/subresource]" and ``codes`` by response
    code. A window with no line of the operator's account has no request in it."""

    total: int
    writes: int
    watches: int
    by_verb: dict[str, int]
    codes: dict[int, int]


def operator_requests(audit: AuditLog, offset: int) -> Requests:
    """The requests of the benchmark's operator account after ``offset`` (bytes of the log)."""
    user = f"system:serviceaccount:{SYSTEM_NS}:{ACCOUNT}"
    by_verb: dict[str, int] = {}
    codes: dict[int, int] = {}
    watches = 0
    for ev in read_events(audit.path, offset):
        if (ev.get("user") or {}).get("username") != user:
            continue
        verb = ev.get("verb", "")
        if ev.get("stage") == "ResponseStarted":
            watches += verb == "watch"
            continue
        if ev.get("stage") != "ResponseComplete":
            continue
        res = (ev.get("objectRef") or {}).get("resource", "")
        sub = (ev.get("objectRef") or {}).get("subresource")
        key = f"{verb} {res}{'/' + sub if sub else ''}"
        by_verb[key] = by_verb.get(key, 0) + 1
        code = int((ev.get("responseStatus") or {}).get("code") or 0)
        codes[code] = codes.get(code, 0) + 1
    writes = sum(n for k, n in by_verb.items() if k.split()[0] in ("create", "update", "patch", "delete"))
    return Requests(sum(by_verb.values()), writes, watches, by_verb, codes)


# --- process figures ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine_load() -> float:
    """The 1-minute load average (how busy the shared machine was)."""
    return float(Path("/proc/loadavg").read_text().split()[0])
