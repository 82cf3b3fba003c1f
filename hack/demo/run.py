#!/usr/bin/env python3
"""``make demo``: the whole of vramguard on the local cluster, seen as a user sees it.

1. starts the local cluster (hack/cluster/up.sh; reused when it is up), installs
   the CRDs and examples/;
2. creates the demo's namespaces, policy, budgets and workloads
   (hack/demo/scenario.yaml) and waits until kwok runs the pods;
3. starts the operator (``python -m vramguard_operator operator``) and one
   simulated agent per fake GPU node (``vramguard-agent run --backend sim
   --sim-speed N``), the agents playing the scenario's GPU memory N times
   faster than the clock;
4. shows a live view (a ``vramguard top`` table, and vramguard's Events as they
   happen) while a *kubelet stand-in* reports the pods' container resources,
   which kwok does not (the API server refuses an in-place resize without them);
5. prints a summary of what was annotated, throttled and evicted and why (from
   the Events), checks it against the scenario's expectations, and removes
   what it made: its processes, namespaces and policy, and the cluster when it
   started it. ``--keep`` runs until Ctrl-C and leaves the cluster and the
   demo's objects for a look around.

docs/demo.md describes the scenario and the time compression.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCE_ROOTS = [str(ROOT / d) for d in ("api", "operator", "agent")]
sys.path[:0] = [str(HERE), *SOURCE_ROOTS]

import plan as P  # noqa: E402  (hack/demo/plan.py)
import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from vramguard_operator.cli import top as top_cmd  # noqa: E402

CACHE = Path(os.environ.get("VG_CACHE", Path.home() / ".cache" / "vramguard"))
GROUP, VERSION = "vramguard.io", "v1alpha1"
TABLE_EVERY_S = 30.0  # the table in a log (not a terminal), wall clock
REDRAW_EVERY_S = 2.0  # the screen in a terminal


def _die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the runner dies, however it dies,
    so that nothing it started keeps running (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def span(seconds: float) -> str:
    """``1h05m``, ``4m30s``, ``42s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Demo:
    """One run of the demo; ``run()`` then, always, ``cleanup()``."""

    def __init__(self, args: argparse.Namespace, scenario: P.DemoScenario) -> None:
        self.args = args
        self.sc = scenario
        self.duration_s = args.duration or (scenario.short_duration_s if args.short else scenario.duration_s)
        self.speed = args.speed or scenario.speed
        self.workdir = Path(tempfile.mkdtemp(prefix="vramguard-demo-"))
        self.tty = sys.stdout.isatty() and not args.plain
        self.t_start = time.monotonic()
        self.t_agents: float | None = None
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.kubeconfig = ""
        self.started_cluster = False
        self.created_examples: list[str] = []
        self.api: Any = None
        self.resolved: P.Resolved | None = None
        self.seen_pods: dict[str, dict[str, Any]] = {}
        self.events: dict[str, dict[str, Any]] = {}
        self.shown: set[tuple[str, int]] = set()
        self.recent: list[str] = []
        self.health_port = free_port()
        self.wall_agents: datetime | None = None
        self.live_on = False  # a terminal is being redrawn: say() stays quiet
        self.live_started = False  # --keep leaves the demo up only once it ran

    # -- output

    def now_s(self) -> float:
        """Seconds since the agents started (since the run began, before that)."""
        return time.monotonic() - (self.t_agents if self.t_agents is not None else self.t_start)

    def say(self, text: str) -> None:
        if not (self.tty and self.live_on):
            print(f"[{span(time.monotonic() - self.t_start):>6}] {text}", flush=True)

    # -- the cluster

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", self.kubeconfig, *args],
            input=input, capture_output=True, text=True, check=check, timeout=180,
        )

    def ensure_cluster(self) -> None:
        kubeconfig = os.environ.get("VG_KUBECONFIG") or str(CACHE / "kubeconfig")
        was_up = Path(kubeconfig).exists() and subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, "get", "--raw", "/readyz"], capture_output=True, timeout=30
        ).returncode == 0
        self.say("local cluster: " + ("up, reused" if was_up else "starting it (hack/cluster/up.sh)"))
        up = subprocess.run([str(ROOT / "hack/cluster/up.sh")], capture_output=True, text=True, timeout=900)
        self.started_cluster = not was_up
        if up.returncode != 0:
            raise RuntimeError(f"hack/cluster/up.sh failed:\n{up.stdout}\n{up.stderr}")
        self.kubeconfig = up.stdout.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")
        self.api = config.new_client_from_config(config_file=self.kubeconfig)

    def install(self) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        crds = [f"crd/{p.name.split('_', 1)[1].removesuffix('.yaml')}.vramguard.io" for p in (ROOT / "crds").glob("*.yaml")]
        self.kubectl("wait", "--for=condition=Established", *crds, "--timeout=60s")
        examples = str(ROOT / "examples")
        before = set(self.kubectl("get", "-f", examples, "-o", "name", "--ignore-not-found").stdout.split())
        self.kubectl("apply", "-f", examples)
        after = set(self.kubectl("get", "-f", examples, "-o", "name").stdout.split())
        self.created_examples = sorted(after - before)
        self.say(f"installed the CRDs and examples/ ({len(after)} objects, {len(self.created_examples)} new)")

    def create_workloads(self) -> None:
        for ns in self.sc.namespaces:  # a previous run that was killed
            if self.kubectl("get", "namespace", ns, "--ignore-not-found", "-o", "name").stdout.strip():
                self.say(f"deleting namespace {ns} left by an earlier run")
                self.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s")
        docs: list[Mapping[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": dict(labels)}}
            for ns, labels in self.sc.namespaces.items()
        ]
        docs += list(self.sc.objects)
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
        self.say(f"created {len(docs)} objects: namespaces {', '.join(self.sc.namespaces)}, "
                 f"policy, budgets, workloads")
        if self.args.verbose:
            print(out)

    def pods(self) -> list[dict[str, Any]]:
        core = client.CoreV1Api(self.api)
        out = []
        for ns in self.sc.namespaces:
            r: Any = core.list_namespaced_pod(ns, _preload_content=False)  # the raw response: API-form dicts
            out += json.loads(r.data)["items"]
        for p in out:
            self.seen_pods[p["metadata"]["uid"]] = p
        return out

    def wait_for_pods(self, timeout_s: float = 180.0) -> P.Resolved:
        deadline = time.monotonic() + timeout_s
        while True:
            pods = self.pods()
            self.kubelet(pods)
            try:
                resolved = P.resolve(self.sc, pods)
                break
            except LookupError as err:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pods did not start: {err}") from None
                time.sleep(1.0)
        self.say(f"{len(resolved.pods)} pods running on "
                 f"{', '.join(sorted({p['spec']['nodeName'] for p in resolved.pods.values()}))}")
        return resolved

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

    # -- processes

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONPATH": os.pathsep.join(SOURCE_ROOTS),
                "PYTHONUNBUFFERED": "1"}

    def spawn(self, name: str, argv: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self.procs.append((name, proc, log))

    def start_processes(self, resolved: P.Resolved) -> None:
        """The operator first (so that the scenario's clock starts once it watches),
        then one simulated agent per node."""
        scenario_file = self.workdir / "agents-scenario.yaml"
        scenario_file.write_text(yaml.safe_dump(resolved.agent_scenario, sort_keys=False))
        ns_flags = [a for ns in self.sc.namespaces for a in ("-n", ns)]
        self.spawn("operator", [
            sys.executable, "-m", "vramguard_operator", "operator", *ns_flags,
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            f"--metrics-port={free_port()}", "--metrics-address=127.0.0.1",
            "--evaluation-period=1s", "--debounce=50ms", "--eviction-retry=5s", "--watch-timeout=60s",
        ])
        self.say(f"started the operator (watching {', '.join(self.sc.namespaces)}); logs in {self.workdir}")
        deadline = time.monotonic() + 120
        while not self.operator_evaluating():
            self.check_processes()
            if time.monotonic() > deadline:
                raise RuntimeError("the operator did not start evaluating within 120 s")
            time.sleep(0.5)
        interval_ms = int(round(self.sc.sample_interval_s * 1000))
        for node in self.sc.node_names:
            self.spawn(f"agent-{node}", [
                sys.executable, "-m", "vramguard_agent", "run", "--backend", "sim",
                "--scenario", str(scenario_file), "--node", node, "--kubeconfig", self.kubeconfig,
                "--sim-speed", f"{self.speed:g}", "--sample-interval", f"{interval_ms}ms",
                "--min-report-interval", "1s", "--heartbeat", "10s", "--metrics-address", "",
            ])
        self.t_agents = time.monotonic()
        self.wall_agents = datetime.now(UTC)
        self.say(f"the operator is evaluating; started {len(self.sc.node_names)} simulated agents "
                 f"({', '.join(self.sc.node_names)}): scenario time runs {self.speed:g}x the clock")

    def operator_evaluating(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return bool((json.loads(r.read()).get("evaluation") or {}).get("evaluations"))
        except (OSError, ValueError):
            return False

    def check_processes(self) -> None:
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop_processes(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 20
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    # -- the live view

    def poll_events(self) -> list[dict[str, Any]]:
        """New vramguard Events, oldest first: those on pods, and those on budgets
        that no pod got a copy of (a total's recovery). A repeat with a higher
        count is new."""
        core = client.CoreV1Api(self.api)
        for ns in self.sc.namespaces:
            raw: Any = core.list_namespaced_event(ns, _preload_content=False)
            for e in json.loads(raw.data)["items"]:
                self.events[e["metadata"]["uid"]] = e
        budget_only = {(b, e.reason, e.message) for b, e in P.budget_only_events(self.events.values())}
        fresh = []
        for e in self.events.values():
            key = (e["metadata"]["uid"], int(e.get("count") or 1))
            obj = e["involvedObject"]
            wanted = obj.get("kind") == "Pod" or (obj.get("name"), e.get("reason"), e.get("message")) in budget_only
            if key in self.shown or not P._from_vramguard(e) or not wanted:
                continue
            self.shown.add(key)
            fresh.append(e)
        return sorted(fresh, key=lambda e: e.get("firstTimestamp") or "")

    def event_line(self, e: Mapping[str, Any]) -> str:
        when = P._event_time(e)
        rel = (when - self.wall_agents).total_seconds() if when and self.wall_agents else 0.0
        obj = e["involvedObject"]
        repeat = f" (x{e['count']})" if int(e.get("count") or 1) > 1 else ""
        kind = "pod" if obj.get("kind") == "Pod" else "gmb"
        return f"t+{rel:>4.0f}s  {e.get('reason'):<22} {kind}/{obj.get('name')}{repeat}: {e.get('message')}"

    def table(self) -> str:
        snaps = [top_cmd.fetch(self.api, ns) for ns in self.sc.namespaces]
        merged = top_cmd.Snapshot(
            pods=[p for s in snaps for p in s.pods],
            budgets=[b for s in snaps for b in s.budgets],
            policies=snaps[0].policies,
            reports=snaps[0].reports,
            namespace_labels=snaps[0].namespace_labels,
            now=datetime.now(UTC),
        )
        rows, notes = top_cmd.build_rows(merged)
        return top_cmd.render(rows, notes, all_namespaces=True)

    def header(self) -> str:
        t = self.now_s()
        left = "until Ctrl-C" if self.args.keep else f"{span(max(0.0, self.duration_s - t))} left"
        return (f"vramguard demo   t+{span(t)}   scenario time ~{span(t * self.speed)} ({self.speed:g}x)   "
                f"{left}")

    def live(self) -> None:
        """Run the scenario for its duration (or until Ctrl-C with --keep)."""
        next_table = time.monotonic() + 5.0
        while self.args.keep or self.now_s() < self.duration_s:
            tick = time.monotonic()
            self.check_processes()
            self.kubelet(self.pods())
            for e in self.poll_events():
                line = self.event_line(e)
                self.recent = [*self.recent, line][-12:]
                if not self.tty:
                    print(line, flush=True)
            if time.monotonic() >= next_table:
                if self.tty:
                    width = shutil.get_terminal_size().columns
                    print("\x1b[H\x1b[2J" + self.header() + "\n\n" + self.table() + "\n\nvramguard Events:\n"
                          + "\n".join(line[:width] for line in self.recent), flush=True)
                    next_table = time.monotonic() + REDRAW_EVERY_S
                else:
                    print(f"\n{self.header()}\n{self.table()}\n", flush=True)
                    next_table = time.monotonic() + TABLE_EVERY_S
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))

    # -- the summary

    def summary(self) -> int:
        assert self.resolved is not None
        self.poll_events()
        results = P.outcomes(self.resolved, self.events.values(), self.seen_pods, self.sc)
        mismatch = P.check(self.sc.expect, results)
        t = self.now_s()
        print(f"\n{self.header()}\n{self.table()}\n", flush=True)
        print(f"== Summary: {span(t)} of wall-clock time, ~{span(t * self.speed)} of scenario time "
              f"({self.speed:g}x) ==")
        for r in results:
            if r.outcomes == ["leftAlone"]:
                continue
            print(f"{', '.join(r.outcomes):<30} {self._who(r)}")
            for e in r.events:
                print("    " + self._event_text(e))
        for r in results:
            if r.outcomes != ["leftAlone"]:
                continue
            warned = [e for e in r.events if e.reason == "AboveWarningThreshold"]
            note = " - warned only" if warned else ""
            print(f"{'left alone':<30} {self._who(r)}{note}")
            for e in r.events:
                print("    " + self._event_text(e))
        budget_events = P.budget_only_events(self.events.values())
        for name, e in budget_events:
            print(f"{'budget':<30} {name}: " + self._event_text(e))
        bad = {k: v for k, v in mismatch.items() if v[0] or v[1]}
        counts = ", ".join(f"{'left alone' if k == 'leftAlone' else k} {len(self.sc.expect[k])}" for k in P.OUTCOMES)
        # Shorter than the scenario's shortest length (--duration, Ctrl-C): too early to judge.
        judged = t >= self.sc.short_duration_s - 1
        if bad and not judged:
            print(f"The run was shorter than the scenario's {span(self.sc.short_duration_s)}: "
                  "its expectations are not checked.")
            bad = {}
        elif bad:
            print("The run does NOT match the scenario's expectations:")
            for k, (missing, unexpected) in bad.items():
                print(f"  {k}: missing {missing}, unexpected {unexpected}")
        else:
            print(f"The run matches the scenario ({counts}).", flush=True)
        if self.args.summary_json:
            extra = {
                "wallSeconds": round(t, 1),
                "speed": self.speed,
                "durationSeconds": self.duration_s,
                "agentsStarted": self.wall_agents.isoformat() if self.wall_agents else None,
                "processes": [{"name": n, "pid": p.pid} for n, p, _ in self.procs],
                "namespaces": list(self.sc.namespaces),
                "logs": str(self.workdir),
            }
            Path(self.args.summary_json).write_text(json.dumps(P.summary_json(results, mismatch, extra, budget_events), indent=2))
        return 1 if bad else 0

    @staticmethod
    def _who(r: P.PodOutcome) -> str:
        if r.id.endswith("~new"):
            return f"{r.id.removesuffix('~new')}'s replacement ({r.workload}, pod {r.namespace}/{r.name})"
        return f"{r.id} ({r.workload}, pod {r.namespace}/{r.name})"

    def _event_text(self, e: P.EventLine) -> str:
        rel = (e.time - self.wall_agents).total_seconds() if e.time and self.wall_agents else 0.0
        repeat = f" (x{e.count})" if e.count > 1 else ""
        return f"t+{rel:>4.0f}s {e.reason}{repeat}: {e.message}"

    # -- the whole run

    def run(self) -> int:
        self.ensure_cluster()
        self.install()
        self.create_workloads()
        self.resolved = self.wait_for_pods()
        self.start_processes(self.resolved)
        self.say("live view" + (" until Ctrl-C" if self.args.keep else f" for {span(self.duration_s)}")
                 + ": vramguard's Events as they happen" + ("" if self.tty else f", the table every {TABLE_EVERY_S:.0f}s"))
        self.live_on = self.live_started = True
        try:
            self.live()
        except KeyboardInterrupt:
            self.live_on = False
            self.say("interrupted")
        self.live_on = False
        return self.summary()

    def cleanup(self) -> None:
        self.stop_processes()
        if self.api is None:
            return
        if self.args.keep and self.live_started:
            print(f"\n--keep: the cluster and the demo's objects are left as they are "
                  f"(KUBECONFIG={self.kubeconfig}); look around with\n"
                  f"  vramguard top -A --kubeconfig {self.kubeconfig}\n"
                  f"  kubectl --kubeconfig {self.kubeconfig} get events -n vg-demo-serving\n"
                  f"and remove them with: kubectl delete ns {' '.join(self.sc.namespaces)}; "
                  f"kubectl delete gmp vg-demo")
            return
        self.say("cleaning up: namespaces, policy, node reports")
        for ns in self.sc.namespaces:
            self.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
        cluster_scoped = [o for o in self.sc.objects if not (o.get("metadata") or {}).get("namespace")]
        for o in cluster_scoped:
            self.kubectl("delete", f"{o['kind'].lower()}.{o['apiVersion'].split('/')[0]}", o["metadata"]["name"],
                         "--ignore-not-found", check=False)
        self.kubectl("delete", "nodegpuusages.vramguard.io", *self.sc.node_names, "--ignore-not-found", check=False)
        if self.created_examples:
            self.kubectl("delete", *self.created_examples, "--ignore-not-found", "--wait=false", check=False)
        for ns in self.sc.namespaces:
            self.kubectl("wait", "--for=delete", f"namespace/{ns}", "--timeout=60s", check=False)
        if self.started_cluster:
            self.say("stopping the cluster this run started (hack/cluster/down.sh)")
            subprocess.run([str(ROOT / "hack/cluster/down.sh")], capture_output=True, timeout=300, check=False)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hack/demo/run.py", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", type=Path, default=HERE / "scenario.yaml", help="the demo scenario")
    p.add_argument("--short", action="store_true", help="the scenario's shortDuration (for CI)")
    p.add_argument("--keep", action="store_true",
                   help="run until Ctrl-C, then leave the cluster and the demo's objects in place")
    p.add_argument("--duration", type=float, default=None, help="seconds of wall-clock time (overrides the scenario)")
    p.add_argument("--speed", type=float, default=None, help="scenario seconds per second (overrides the scenario)")
    p.add_argument("--summary-json", default=None, help="also write the summary to this file as JSON")
    p.add_argument("--plain", action="store_true", help="no screen redraws, even in a terminal")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        scenario = P.load_scenario(args.scenario)
    except (OSError, ValueError) as err:
        print(f"demo: {err}", file=sys.stderr)
        return 2

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Explicitly: a shell that starts the runner in the background leaves SIGINT ignored.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    demo = Demo(args, scenario)
    status = 1
    try:
        status = demo.run()
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        status = 130
    except (RuntimeError, ApiException, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or ""
        print(f"demo: {err}\n{detail}", file=sys.stderr)
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave processes behind
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        demo.cleanup()
    return status


if __name__ == "__main__":
    sys.exit(main())
