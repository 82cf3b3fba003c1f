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
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCE_ROOTS = [str(ROOT / d) for d in ("api", "operator", "agent", "sim")]
sys.path[:0] = [str(HERE), str(ROOT / "hack" / "cluster"), *SOURCE_ROOTS]

# The runner's parts, next to it in hack/demo/: plan (pure), oom, dra, cluster, children, view.
import dra  # noqa: E402
import oom  # noqa: E402
import plan as P  # noqa: E402
import realnode  # noqa: E402
import view  # noqa: E402
import yaml  # noqa: E402
from children import Children, free_port  # noqa: E402
from cluster import Cluster  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from vramguard_api.units import format_seconds  # noqa: E402

TABLE_EVERY_S = 30.0  # the table in a log (not a terminal), wall clock
REDRAW_EVERY_S = 2.0  # the screen in a terminal


class Demo:
    """One run of the demo; ``run()`` then, always, ``cleanup()``."""

    def __init__(self, args: argparse.Namespace, scenario: P.DemoScenario) -> None:
        self.args = args
        self.sc = scenario
        self.duration_s = args.duration or (scenario.short_duration_s if args.short else scenario.duration_s)
        self.speed = args.speed or scenario.speed
        self.children = Children(Path(tempfile.mkdtemp(prefix="vramguard-demo-")))
        self.cluster = Cluster(self.say)
        self.tty = sys.stdout.isatty() and not args.plain
        self.t_start = time.monotonic()
        self.t_agents: float | None = None
        self.resolved: P.Resolved | None = None
        self.seen_pods: dict[str, dict[str, Any]] = {}
        self.feed = view.EventFeed()
        self.recent: list[str] = []
        self.health_port = free_port()
        self.wall_agents: datetime | None = None
        self.live_on = False  # a terminal is being redrawn: say() stays quiet
        self.live_started = False  # --keep leaves the demo up only once it ran
        self.real = realnode.RealNodePart(args.real_node, self.cluster.kubectl, self.say)

    # -- output

    def now_s(self) -> float:
        """Seconds since the agents started (since the run began, before that)."""
        return time.monotonic() - (self.t_agents if self.t_agents is not None else self.t_start)

    def say(self, text: str) -> None:
        if not (self.tty and self.live_on):
            print(f"[{format_seconds(time.monotonic() - self.t_start):>6}] {text}", flush=True)

    # -- the cluster

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.pods(list(self.sc.namespaces))
        for p in out:
            self.seen_pods[p["metadata"]["uid"]] = p
        return out

    def wait_for_pods(self, timeout_s: float = 180.0) -> P.Resolved:
        deadline = time.monotonic() + timeout_s
        while True:
            pods = self.pods()
            self.cluster.kubelet(pods)
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

    # -- processes

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.cluster.kubeconfig, "PYTHONPATH": os.pathsep.join(SOURCE_ROOTS),
                "PYTHONUNBUFFERED": "1"}

    def start_processes(self, resolved: P.Resolved) -> None:
        """The operator first (so that the scenario's clock starts once it watches),
        then one simulated agent per node."""
        scenario_file = self.children.workdir / "agents-scenario.yaml"
        scenario_file.write_text(yaml.safe_dump(resolved.agent_scenario, sort_keys=False))
        ns_flags = [a for ns in self.real.namespaces(self.sc.namespaces) for a in ("-n", ns)]
        self.children.spawn("operator", [
            sys.executable, "-m", "vramguard_operator", "operator", *ns_flags,
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            f"--metrics-port={free_port()}", "--metrics-address=127.0.0.1",
            "--evaluation-period=1s", "--debounce=50ms", "--eviction-retry=5s", "--watch-timeout=60s",
        ], self.env())
        self.say(f"started the operator (watching {', '.join(self.sc.namespaces)}); logs in {self.children.workdir}")
        deadline = time.monotonic() + 120
        while not self.operator_evaluating():
            self.children.check()
            if time.monotonic() > deadline:
                raise RuntimeError("the operator did not start evaluating within 120 s")
            time.sleep(0.5)
        interval_ms = int(round(self.sc.sample_interval_s * 1000))
        for node in self.sc.node_names:
            self.children.spawn(f"agent-{node}", [
                sys.executable, "-m", "vramguard_agent", "run", "--backend", "sim",
                "--scenario", str(scenario_file), "--node", node, "--kubeconfig", self.cluster.kubeconfig,
                "--sim-speed", f"{self.speed:g}", "--sample-interval", f"{interval_ms}ms",
                "--min-report-interval", "1s", "--heartbeat", "10s", "--metrics-address", "",
            ], self.env())
        if self.real.active:
            self.children.spawn("realnode-agent", self.real.agent_argv(self.cluster.kubeconfig), self.env())
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

    # -- the live view

    def poll_events(self) -> list[dict[str, Any]]:
        """New vramguard Events, oldest first (see view.EventFeed.fresh)."""
        return self.feed.fresh(self.cluster.events(list(self.sc.namespaces)))

    def table(self) -> str:
        return view.table(self.cluster.api, self.real.namespaces(self.sc.namespaces))

    def header(self) -> str:
        t = self.now_s()
        left = "until Ctrl-C" if self.args.keep else f"{format_seconds(max(0.0, self.duration_s - t))} left"
        return (f"vramguard demo   t+{format_seconds(t)}   scenario time ~{format_seconds(t * self.speed)} ({self.speed:g}x)   "
                f"{left}")

    def live(self) -> None:
        """Run the scenario for its duration (or until Ctrl-C with --keep)."""
        next_table = time.monotonic() + 5.0
        while self.args.keep or self.now_s() < self.duration_s:
            tick = time.monotonic()
            self.children.check()
            self.cluster.kubelet(self.pods())
            self.real.observe()
            for e in self.poll_events():
                line = view.event_line(e, self.wall_agents)
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
        events = self.feed.events.values()
        results = P.outcomes(self.resolved, events, self.seen_pods, self.sc)
        mismatch = P.check(self.sc.expect, results)
        t = self.now_s()
        print(f"\n{self.header()}\n{self.table()}\n", flush=True)
        print(f"== Summary: {format_seconds(t)} of wall-clock time, ~{format_seconds(t * self.speed)} of scenario time "
              f"({self.speed:g}x) ==")
        budget_events = P.budget_only_events(events)
        view.print_outcomes(results, budget_events, self.wall_agents)
        oom_json, saved_bad = self.oom_summary(t, results)
        dra_limits = self.dra_summary()
        bad = {k: v for k, v in mismatch.items() if v[0] or v[1]}
        if saved_bad:
            bad["savedFromOOM"] = (saved_bad, [])
        if self.sc.dra_devices and not dra_limits:
            bad["draLimits"] = (["a limit from a DRA claim"], [])
        counts = ", ".join(f"{'left alone' if k == 'leftAlone' else k} {len(self.sc.expect[k])}" for k in P.OUTCOMES)
        # Shorter than the scenario's shortest length (--duration, Ctrl-C): too early to judge.
        judged = t >= self.sc.short_duration_s - 1
        if bad and not judged:
            print(f"The run was shorter than the scenario's {format_seconds(self.sc.short_duration_s)}: "
                  "its expectations are not checked.")
            bad = {}
        elif bad:
            print("The run does NOT match the scenario's expectations:")
            for k, (missing, unexpected) in bad.items():
                print(f"  {k}: missing {missing}, unexpected {unexpected}")
        else:
            print(f"The run matches the scenario ({counts}).", flush=True)
        print("\n" + "\n".join(self.real.summary(self.cluster.events)), flush=True)
        if self.args.summary_json:
            self.write_summary_json(t, results, mismatch, budget_events, {**oom_json, "draLimits": dra_limits})
        return 1 if bad else 0

    def oom_summary(self, t: float, results: list[P.PodOutcome]) -> tuple[dict[str, Any], list[str]]:
        """Print the out-of-memory kills of the run (the agents' logs) and of the
        same scenario with nobody acting (``oom.without_vramguard``, for the
        run's scenario time); return them as JSON, and the ids of
        ``savedFromOOM`` that were not saved."""
        assert self.resolved is not None
        names = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": i for i, p in self.resolved.pods.items()}
        during = oom.kills_in_logs(log for name, _, log in self.children.procs if name.startswith("agent-"))
        step = self.sc.sample_interval_s * self.speed
        without = oom.without_vramguard(self.resolved.agent_scenario, t * self.speed, step)
        print("Out-of-memory kills during the run: " + (", ".join(
            f"{names.get(f'{k.namespace}/{k.pod}', k.pod)} at {format_seconds(k.t_s)}" for k in during) or "none"))
        print("Without vramguard (the same scenario on the simulated GPUs, nobody acting):")
        for line in oom.summarize(without, names):
            print("    " + line)
        if not without:
            print("    no out-of-memory kill")
        # alive: in the last listing, running, not leaving (a pod evicted or gone is not saved)
        running = {self.resolved.by_uid.get(p["metadata"]["uid"]) for p in self.pods()
                   if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}
        saved, not_saved = oom.saved(self.sc.saved_from_oom, [names.get(f"{u.kill.namespace}/{u.kill.pod}") for u in without],
                                     [names.get(f"{k.namespace}/{k.pod}") for k in during], running)
        pressure = sorted(r.id for r in results if "DevicePressure" in r.reasons)
        live_lines, live_json = oom.live_report(self.cluster.api, without, self.real.namespaces(self.sc.namespaces))
        print("\n".join([*oom.saved_lines(saved, without, names, t * self.speed, pressure), *live_lines]))
        body = {
            "oomKillsDuringRun": [{"id": names.get(f"{k.namespace}/{k.pod}"), "pod": f"{k.namespace}/{k.pod}",
                                   "scenarioSeconds": k.t_s, "text": k.text} for k in during],
            "withoutVramguard": [{"id": names.get(f"{u.kill.namespace}/{u.kill.pod}"), "scenarioSeconds": u.kill.time_s,
                                  "text": oom.describe(u, names)} for u in without],
            "savedFromOOM": saved, "oomRecords": live_json,
        }
        return body, not_saved

    def dra_summary(self) -> list[dict[str, str]]:
        """Print the limits vramguard took from DRA claims (the pods'
        ``vramguard.io/limits`` as last listed); return them as JSON."""
        assert self.resolved is not None
        latest = {self.resolved.by_uid[u]: p for u, p in self.seen_pods.items() if u in self.resolved.by_uid}
        limits = dra.claim_limits(latest)
        if self.sc.dra_devices:
            print("Limits from DRA claims (what the scheduler booked, enforced):")
            for lim in limits or ():
                print("    " + lim.text())
            if not limits:
                print("    none")
        return [{"id": x.id, "key": x.key, "limit": x.limit, "source": x.source, "detail": x.detail} for x in limits]

    def write_summary_json(
        self,
        t: float,
        results: list[P.PodOutcome],
        mismatch: dict[str, tuple[list[str], list[str]]],
        budget_events: list[tuple[str, P.EventLine]],
        more: dict[str, Any],
    ) -> None:
        extra = {
            **more,
            "wallSeconds": round(t, 1),
            "speed": self.speed,
            "durationSeconds": self.duration_s,
            "agentsStarted": self.wall_agents.isoformat() if self.wall_agents else None,
            "processes": [{"name": n, "pid": p.pid} for n, p, _ in self.children.procs],
            "namespaces": list(self.sc.namespaces),
            "logs": str(self.children.workdir),
        }
        Path(self.args.summary_json).write_text(json.dumps(P.summary_json(results, mismatch, extra, budget_events), indent=2))

    # -- the whole run

    def run(self) -> int:
        self.cluster.ensure()
        self.cluster.install()
        self.cluster.install_dra(self.sc)
        self.cluster.create_workloads(self.sc, self.args.verbose)
        self.resolved = self.wait_for_pods()
        self.real.start()
        self.start_processes(self.resolved)
        self.say("live view" + (" until Ctrl-C" if self.args.keep else f" for {format_seconds(self.duration_s)}")
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
        self.children.stop()
        if self.cluster.api is None:
            return
        if self.args.keep and self.live_started:
            kubeconfig, kubectl = self.cluster.kubeconfig, f"{self.cluster.kubectl_command()} --kubeconfig"
            print(f"\n--keep: the cluster and the demo's objects are left as they are "
                  f"(KUBECONFIG={kubeconfig}); look around with\n"
                  f"  vramguard top -A --kubeconfig {kubeconfig}\n"
                  f"  {kubectl} {kubeconfig} get events -n vg-demo-serving\n"
                  f"and remove them with: {kubectl} {kubeconfig} delete ns {' '.join(self.sc.namespaces)}; "
                  f"{kubectl} {kubeconfig} delete gmp vg-demo")
            return
        self.real.remove()
        self.cluster.remove(self.sc)


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
    p.add_argument("--real-node", choices=("auto", "on", "off"), default="auto", help="also run one workload on "
                   "the local cluster's real node (docs/demo.md): auto where it is up, on (else an error), off")
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
