"""The demo runner's side of the local cluster (hack/demo/run.py): start or reuse
it, install the CRDs and examples/, create and remove the demo's objects, list
its pods, and the kubelet stand-in that reports the pods' container resources."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dra  # hack/demo/dra.py
import localkube  # hack/cluster/localkube.py (run.py puts it on sys.path)
import plan as P  # hack/demo/plan.py (run.py puts hack/demo on sys.path)
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("VG_CACHE", Path.home() / ".cache" / "vramguard"))


class Cluster:
    """The local cluster as the runner uses it; ``say`` prints a progress line."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.kubeconfig = ""
        self.started = False  # this run started the cluster (so it stops it)
        self.created_examples: list[str] = []
        self.created_dra: list[str] = []  # DeviceClasses and ResourceSlices this run made
        self.api: Any = None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl on this cluster; raises CalledProcessError when ``check`` and it fails."""
        return subprocess.run(
            [localkube.kubectl_binary(), "--kubeconfig", self.kubeconfig, *args],
            input=input, capture_output=True, text=True, check=check, timeout=180,
        )

    @staticmethod
    def kubectl_command() -> str:
        """The path of the kubectl built at the cluster's version, for commands printed to a person."""
        return localkube.kubectl_binary()

    def ensure(self) -> None:
        """Start the cluster with hack/cluster/up.sh (which reuses one that is up); RuntimeError when it fails."""
        kubeconfig = os.environ.get("VG_KUBECONFIG") or str(CACHE / "kubeconfig")
        was_up = Path(kubeconfig).exists() and subprocess.run(
            [localkube.kubectl_binary(), "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"],
            capture_output=True, timeout=30,
        ).returncode == 0
        self.say("local cluster: " + ("up, reused" if was_up else "starting it (hack/cluster/up.sh)"))
        up = subprocess.run([str(ROOT / "hack/cluster/up.sh")], capture_output=True, text=True, timeout=900)
        self.started = not was_up
        if up.returncode != 0:
            raise RuntimeError(f"hack/cluster/up.sh failed:\n{up.stdout}\n{up.stderr}")
        self.kubeconfig = up.stdout.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")
        self.api = config.new_client_from_config(config_file=self.kubeconfig)

    def install(self) -> None:
        """Apply the CRDs and examples/, remembering which examples this run created."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        crds = [f"crd/{p.name.split('_', 1)[1].removesuffix('.yaml')}.vramguard.io" for p in (ROOT / "crds").glob("*.yaml")]
        localkube.wait(self.kubectl, "--for=condition=Established", *crds, timeout_s=60)
        examples = str(ROOT / "examples")
        before = set(self.kubectl("get", "-f", examples, "-o", "name", "--ignore-not-found").stdout.split())
        self.kubectl("apply", "-f", examples)
        after = set(self.kubectl("get", "-f", examples, "-o", "name").stdout.split())
        self.created_examples = sorted(after - before)
        self.say(f"installed the CRDs and examples/ ({len(after)} objects, {len(self.created_examples)} new)")

    def install_dra(self, sc: P.DemoScenario) -> None:
        """Publish the scenario's ``draDevices`` as the stand-in DRA driver does
        (hack/demo/dra.py), with its DeviceClasses, remembering what this run created."""
        if not sc.dra_devices:
            return
        slices = dra.slices(sc.nodes, sc.dra_devices)
        classes = str(dra.DEVICE_CLASSES)
        before = set(self.kubectl("get", "-f", classes, "-o", "name", "--ignore-not-found").stdout.split())
        self.kubectl("apply", "-f", classes)
        after = set(self.kubectl("get", "-f", classes, "-o", "name").stdout.split())
        for s in slices:
            name = f"resourceslice.resource.k8s.io/{s['metadata']['name']}"
            if not self.kubectl("get", name, "--ignore-not-found", "-o", "name").stdout.strip():
                self.created_dra.append(name)
        dra.driver.publish(self.api, slices)
        self.created_dra += sorted(after - before)
        devices = ", ".join(f"{n}: {', '.join(d)}" for n, d in sc.dra_devices.items())
        self.say(f"published DRA devices ({devices}) as the stand-in driver {dra.driver.DRIVER}")

    def create_workloads(self, sc: P.DemoScenario, verbose: bool) -> None:
        """Create the scenario's namespaces and objects (after deleting what a killed run left)."""
        for ns in sc.namespaces:  # a previous run that was killed
            if self.kubectl("get", "namespace", ns, "--ignore-not-found", "-o", "name").stdout.strip():
                self.say(f"deleting namespace {ns} left by an earlier run")
                self.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")
        docs: list[Mapping[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": dict(labels)}}
            for ns, labels in sc.namespaces.items()
        ]
        docs += list(sc.objects)
        text = yaml.safe_dump_all(docs)
        deadline = time.monotonic() + 120
        while True:
            # Another suite's admission webhook (a chart being installed) can refuse for a while.
            applied = self.kubectl("apply", "-f", "-", input=text, check=False)
            if applied.returncode == 0 or time.monotonic() > deadline:
                break
            self.say("the API server refused some objects; retrying in 5 s: "
                     + (applied.stderr.strip().splitlines() or ["?"])[0][:300])
            time.sleep(5)
        if applied.returncode != 0:
            raise RuntimeError(f"kubectl apply failed:\n{applied.stderr}")
        out = applied.stdout
        self.say(f"created {len(docs)} objects: namespaces {', '.join(sc.namespaces)}, "
                 f"policy, budgets, workloads")
        if verbose:
            print(out)

    def pods(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        """The pods of ``namespaces`` as API-form dicts."""
        core = client.CoreV1Api(self.api)
        out = []
        for ns in namespaces:
            r: Any = core.list_namespaced_pod(ns, _preload_content=False)  # the raw response: API-form dicts
            out += json.loads(r.data)["items"]
        return out

    def events(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        """The Events of ``namespaces`` as API-form dicts."""
        core = client.CoreV1Api(self.api)
        out = []
        for ns in namespaces:
            raw: Any = core.list_namespaced_event(ns, _preload_content=False)
            out += json.loads(raw.data)["items"]
        return out

    def kubelet(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """The kubelet stand-in: report container resources (see plan.kubelet_status_patch)."""
        core = client.CoreV1Api(self.api)
        for pod in pods:
            patch = P.kubelet_status_patch(pod)
            if patch is None:
                continue
            meta = pod["metadata"]
            try:
                core.patch_namespaced_pod_status(meta["name"], meta["namespace"], patch,
                                                 _content_type="application/merge-patch+json")
            except ApiException as err:
                if err.status not in (404, 409, 422):
                    raise

    def remove(self, sc: P.DemoScenario) -> None:
        """Delete what the run made (namespaces, cluster-scoped objects, node reports,
        the examples it created) and stop the cluster if the run started it."""
        self.say("cleaning up: namespaces, policy, node reports")
        for ns in sc.namespaces:
            self.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
        cluster_scoped = [o for o in sc.objects if not (o.get("metadata") or {}).get("namespace")]
        for o in cluster_scoped:
            self.kubectl("delete", f"{o['kind'].lower()}.{o['apiVersion'].split('/')[0]}", o["metadata"]["name"],
                         "--ignore-not-found", check=False)
        self.kubectl("delete", "nodegpuusages.vramguard.io", *sc.node_names, "--ignore-not-found", check=False)
        if self.created_examples:
            self.kubectl("delete", *self.created_examples, "--ignore-not-found", "--wait=false", check=False)
        if self.created_dra:
            self.kubectl("delete", *self.created_dra, "--ignore-not-found", "--wait=false", check=False)
        for ns in sc.namespaces:
            self.kubectl("wait", "--for=delete", f"namespace/{ns}", "--timeout=60s", check=False)
        if self.started:
            self.say("stopping the cluster this run started (hack/cluster/down.sh)")
            subprocess.run([str(ROOT / "hack/cluster/down.sh")], capture_output=True, timeout=300, check=False)
