"""Test harness for the operator on the local cluster: the operator as a real
subprocess (``python -m vramguard_operator operator``), kwok GPU nodes of the
tests' own, pods that kwok runs, and node reports written exactly as the agent
writes them (a NodeGPUUsage created once, then its status patched)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "vramguard.io", "v1alpha1"
GI = 1 << 30
T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Call ``fn`` until it returns something truthy; fail naming ``what``.

    A new object may not exist yet or have no status (or null fields) for a
    moment, so KeyError, TypeError, IndexError and a 404 from ``fn`` count as
    "not yet" until the deadline; the last one is raised after it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            last, error = fn(), None
        except (KeyError, TypeError, IndexError) as e:
            last, error = None, e
        except ApiException as e:
            if e.status != 404:
                raise
            last, error = None, e
        if last:
            return last
        time.sleep(interval)
    if error is not None:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}: {error!r}") from error
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


def stop_agent(agent: subprocess.Popen[bytes], tail: int = 4000) -> None:
    """Stop an agent process (SIGTERM, SIGKILL after 15 s) and print the last
    ``tail`` characters of its output, for the test's log."""
    agent.terminate()
    try:
        out, _ = agent.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        agent.kill()
        out, _ = agent.communicate()
    print("--- agent output ---\n" + out.decode(errors="replace")[-tail:])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stamp(t: datetime) -> str:
    """RFC 3339 with whole seconds and a Z, as metav1.Time."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- nodes --------------------------------------------------------------------------------


def gpu_node_manifest(name: str) -> dict[str, Any]:
    """A copy of the first fake GPU node (8×H100 time-sliced) under another name."""
    docs = list(yaml.safe_load_all((ROOT / "hack/cluster/gpu-nodes.yaml").read_text()))
    node = next(d for d in docs if d and d.get("kind") == "Node")
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    node["status"].pop("nodeInfo", None)  # the typed client wants all of it or none
    return node


def create_gpu_nodes(core: client.CoreV1Api, names: Iterable[str], timeout: float = 120) -> None:
    """Create kwok GPU nodes and wait until kwok marks them Ready."""
    names = list(names)
    for name in names:
        try:
            core.create_node(gpu_node_manifest(name))
        except ApiException as err:
            if err.status != 409:
                raise

    def ready() -> bool:
        for name in names:
            conds = core.read_node(name).status.conditions or []
            if not any(c.type == "Ready" and c.status == "True" for c in conds):
                return False
        return True

    wait_for(ready, timeout, f"nodes {names[:3]}... Ready", interval=0.5)


def delete_nodes(core: client.CoreV1Api, custom: client.CustomObjectsApi, names: Iterable[str]) -> None:
    """Delete nodes and their reports (ignoring those already gone)."""
    for name in names:
        for call, args in (
            (core.delete_node, (name,)),
            (custom.delete_cluster_custom_object, (GROUP, VERSION, "nodegpuusages", name)),
        ):
            try:
                call(*args)
            except ApiException as err:
                if err.status != 404:
                    raise


# --- pods ---------------------------------------------------------------------------------


def pod_manifest(
    name: str,
    node: str,
    labels: Mapping[str, str],
    cpu: str | None = "2",
    restart_on_resize: bool = False,
) -> dict[str, Any]:
    """A Guaranteed pod bound to ``node`` (CPU ``cpu``/``cpu``, 1Gi memory), or
    BestEffort-for-CPU when ``cpu`` is None."""
    resources: dict[str, Any] = {"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}
    if cpu is not None:
        resources["limits"]["cpu"] = cpu
        resources["requests"]["cpu"] = cpu
    policy = "RestartContainer" if restart_on_resize else "NotRequired"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/trainer:1",
                    "resources": resources,
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": policy}],
                }
            ],
        },
    }


def play_kubelet_resize_support(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """Do what a kubelet with in-place resize does and kwok does not: report each
    running container's resources in its status. The API server accepts a
    ``pods/resize`` only for pods whose running containers have them."""
    pod = core.read_namespaced_pod(name, namespace)
    statuses = []
    for c, s in zip(pod.spec.containers, pod.status.container_statuses or [], strict=False):
        started = stamp(s.state.running.started_at) if s.state and s.state.running else None
        statuses.append(
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}} if started else {},
                "resources": client.ApiClient().sanitize_for_serialization(c.resources),
            }
        )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"containerStatuses": statuses}},
        _content_type="application/merge-patch+json",
    )


def run_pods(
    core: client.CoreV1Api,
    namespace: str,
    manifests: Iterable[Mapping[str, Any]],
    resize_support: bool = True,
    timeout: float = 60,
) -> dict[str, client.V1Pod]:
    """Create pods, wait until kwok runs them, then (``resize_support``) play the
    kubelet's part for in-place resize. Returns the pods by name."""
    names = []
    for m in manifests:
        core.create_namespaced_pod(namespace, m)
        names.append(m["metadata"]["name"])

    def running() -> dict[str, client.V1Pod] | None:
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
        if all(n in pods and pods[n].status.phase == "Running" for n in names):
            return pods
        return None

    wait_for(running, timeout, f"pods {names[:3]} Running", interval=0.3)
    if resize_support:
        for n in names:
            play_kubelet_resize_support(core, namespace, n)
    return {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names}


# --- reports ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """One pod's usage in a report (bytes)."""

    pod: client.V1Pod
    vram: int | None
    ram: int | None = None


def report_status(usages: Iterable[Usage], sample_time: datetime, free: int | None = None) -> dict[str, Any]:
    """The NodeGPUUsage status an agent would write for these pods on one 80 GiB
    GPU (with ``free`` bytes free when given: the device's used memory)."""
    pods = []
    for u in usages:
        entry: dict[str, Any] = {
            "uid": u.pod.metadata.uid,
            "namespace": u.pod.metadata.namespace,
            "name": u.pod.metadata.name,
            "attribution": "Measured",
            "devices": [] if u.vram is None else [{"uuid": "GPU-e2e-0", "usedBytes": u.vram}],
        }
        if u.vram is not None:
            entry["vramBytes"] = u.vram
        if u.ram is not None:
            entry["ramWorkingSetBytes"] = u.ram
        pods.append(entry)
    return {
        "sampleTime": stamp(sample_time),
        "agent": {"version": "e2e", "backend": "sim", "sampleIntervalSeconds": 5},
        "devices": [
            {
                "uuid": "GPU-e2e-0",
                "index": 0,
                "modelName": "NVIDIA H100 80GB HBM3",
                "memory": {
                    "totalBytes": 80 * GI,
                    "reservedBytes": 0,
                    "usableBytes": 80 * GI,
                    **({} if free is None else {"usedBytes": 80 * GI - free}),
                },
            }
        ],
        "pods": pods,
    }


def publish(
    custom: client.CustomObjectsApi,
    node: str,
    usages: Iterable[Usage],
    age_seconds: float = 0.0,
    free: int | None = None,
) -> None:
    """Write ``node``'s NodeGPUUsage as the agent does: create it if missing, then
    patch its status (sampled ``age_seconds`` ago; ``free``: the device's free bytes)."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodeGPUUsage",
        "metadata": {"name": node},
        "spec": {"nodeName": node},
    }
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, "nodegpuusages", body)
    except ApiException as err:
        if err.status != 409:
            raise
    sample = datetime.now(UTC) - timedelta(seconds=age_seconds)
    custom.patch_cluster_custom_object_status(
        GROUP, VERSION, "nodegpuusages", node, {"status": report_status(usages, sample, free)},
        _content_type="application/merge-patch+json",
    )


# --- the operator ---------------------------------------------------------------------------


class OperatorProcess:
    """``python -m vramguard_operator operator`` as a subprocess, with its
    liveness endpoint and metrics on free local ports."""

    def __init__(
        self,
        kubeconfig: str,
        namespaces: Iterable[str],
        extra: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = list(namespaces)
        self.extra = list(extra)
        self.extra_env = dict(env or {})  # more variables (VRAMGUARD_CRASH_AT: a crash test)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="vramguard-operator-", suffix=".log")[1])
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.root = ROOT  # whose api/, operator/ and agent/ it runs

    def command(self) -> list[str]:
        ns_args = [a for ns in self.namespaces for a in ("-n", ns)]
        return [
            sys.executable, "-m", "vramguard_operator", "operator", *ns_args,
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            f"--metrics-port={self.metrics_port}", "--metrics-address=127.0.0.1",
            *self.extra,
        ]

    def start(self, timeout: float = 60, evaluating: bool = False, may_exit: bool = False) -> None:
        """Start it and wait until it serves its liveness endpoint, and (with
        ``evaluating``) until it has evaluated once. In namespaced mode kopf
        starts no watch at all until a namespace matches, so a first start
        cannot wait for an evaluation. ``may_exit``: an exit is what the test
        expects (a crash point), so it ends the wait too, however early."""
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "PYTHONPATH": os.pathsep.join(str(Path(self.root) / p) for p in ("api", "operator", "agent", "sim")),
            **self.extra_env,
        }
        with self.log.open("ab") as out:
            out.write(f"--- start {datetime.now(UTC).isoformat()}\n".encode())
            self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT)
        if may_exit:
            wait_for(lambda: self.proc is not None and (self.proc.poll() is not None or self._answers()), timeout,
                     "the operator", interval=0.3)
            return
        wait_for(self.ready if evaluating else self.health, timeout, "the operator", interval=0.3)

    def _answers(self) -> bool:
        try:
            return self.health() is not None
        except AssertionError:  # exited meanwhile
            return True

    def health(self) -> dict[str, Any] | None:
        """The liveness endpoint's JSON, None while it does not answer."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def ready(self) -> bool:
        h = self.health() or {}
        return bool((h.get("evaluation") or {}).get("evaluations"))

    def metrics(self) -> str:
        """The /metrics text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample's value from /metrics (None when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        for fam in text_string_to_metric_families(self.metrics()):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return None

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (graceful) or SIGKILL (a crash), and wait for the exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def exited(self) -> int | None:
        """The exit status once the process ended (negative: the signal), else None."""
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = 60) -> str:
        """The end of the operator's log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


# --- reading results ------------------------------------------------------------------------


def events_about(core: client.CoreV1Api, namespace: str, uid: str, reason: str | None = None) -> list[Any]:
    """core/v1 Events about the object with ``uid`` (optionally one reason), oldest first."""
    selector = f"involvedObject.uid={uid}" + (f",reason={reason}" if reason else "")
    items = core.list_namespaced_event(namespace, field_selector=selector).items
    return sorted(items, key=lambda e: (e.first_timestamp or e.event_time or datetime.min.replace(tzinfo=UTC)))


def get_budget(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    """A GPUMemoryBudget as a dict."""
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", name)


def condition(budget: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    """A condition of a budget's status, by type."""
    for c in (budget.get("status") or {}).get("conditions") or ():
        if c["type"] == type_:
            return dict(c)
    return None


def budget_manifest(
    name: str,
    limits: Mapping[str, Any],
    ladder: list[dict[str, str]],
    selector: Mapping[str, str] | None = None,
    mode: str = "Enforce",
) -> dict[str, Any]:
    """A GPUMemoryBudget selecting ``app=<name>`` unless told otherwise."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUMemoryBudget",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": dict(selector or {"app": name})},
            "limits": dict(limits),
            "enforcement": {"mode": mode, "escalation": ladder},
        },
    }


class Kube:
    """The API groups the operator's e2e tests use."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.policy = client.PolicyV1Api(api)

    def create_budget(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", manifest)

    def pod(self, namespace: str, name: str) -> client.V1Pod | None:
        """The pod, or None when it is gone."""
        try:
            return self.core.read_namespaced_pod(name, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
