"""What the demo says about out-of-memory kills (pure, but for reading logs):

- ``without_vramguard``: the agents' scenario played on the simulated GPUs
  alone — the same devices and driver semantics the agents use
  (``vramguard_sim.simgpu``: an allocation that does not fit kills its
  process), no operator, no eviction — for the run's scenario time: the kills
  that happen when nobody acts;
- ``kills_in_logs``: the kills the agents logged during the run (their
  simulated devices log each one at WARNING, naming the pod);
- ``live_report``: the OOM kills the cluster recorded, read and judged as
  ``vramguard oom`` does (the agents' end records, ``cli.oom.judge``), beside
  the run without vramguard's kills judged by the same classifier
  (``vramguard_api.oom`` through ``simulate.ooms.driver_evidence``, with the
  live devices' shares), so that both "innocent" counts mean the same thing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramguard_api.oom import Verdict, classify
from vramguard_api.units import format_bytes, format_seconds
from vramguard_operator.cli import oom as oom_command
from vramguard_operator.controller.kubeapi import API_ERRORS
from vramguard_operator.controller.oom_reads import read_oom
from vramguard_operator.engine.oom import Finding
from vramguard_sim.scenario import Scenario
from vramguard_sim.simbackend import assign_pids, device_uuid
from vramguard_sim.simgpu import SimDevices, SimOOMKill
from vramguard_sim.simulate.ooms import driver_evidence

# "node N t=Xs: pod NS/NAME container C (pid P) killed by CUDA out of memory on ..." (simgpu.SimOOMKill.message)
_KILL_LINE = re.compile(r"node (\S+) t=([0-9.e+]+)s: pod ([^/\s]+)/(\S+) container \S+ \(pid \d+\) killed by CUDA out of memory")


@dataclass(frozen=True)
class Kill:
    """A pod killed by an out-of-memory error: where, when (scenario seconds),
    and the line that says so."""

    node: str
    namespace: str
    pod: str
    t_s: float
    text: str


@dataclass(frozen=True)
class Unguarded:
    """A kill of the run without vramguard, and what the others held on its
    device then (``owner`` as ``namespace/name``, bytes)."""

    kill: SimOOMKill
    holders: tuple[tuple[str, int], ...]


def without_vramguard(agent_scenario: Mapping[str, Any], duration_s: float, step_s: float) -> list[Unguarded]:
    """Every node of ``agent_scenario`` (the agents' format, real pod names)
    played for ``duration_s`` scenario seconds in steps of ``step_s`` (the
    agents' sampling, in scenario time) with nobody acting: the OOM kills, in
    time order."""
    scenario = Scenario.model_validate(agent_scenario)
    out: list[Unguarded] = []
    quiet = logging.getLogger("vramguard.sim.simgpu")  # the devices log each kill: this run is not the agents'
    level, quiet.level = quiet.level, logging.ERROR
    try:
        for node in scenario.nodes:
            devices = SimDevices(node, assign_pids(node), lambda gpu, mig, n=node: device_uuid(n, gpu, mig))
            for i in range(int(duration_s // step_s) + 1):
                for kill in devices.advance(i * step_s):
                    device = next(d for d in devices.devices.values() if d.uuid == kill.kill.device)
                    held = tuple((p.owner or "host", p.used_bytes) for p in device.processes.values() if p.used_bytes)
                    out.append(Unguarded(kill, held))
    finally:
        quiet.setLevel(level)
    return sorted(out, key=lambda u: (u.kill.time_s, u.kill.node))


def kills_in_logs(logs: Iterable[Path]) -> list[Kill]:
    """The OOM kills of pods the agents logged (their log files)."""
    out = []
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = _KILL_LINE.search(line)
            if m:
                out.append(Kill(m.group(1), m.group(3), m.group(4), float(m.group(2)), line[m.start():]))
    return out


def saved(
    expected: Iterable[str], killed_without: Iterable[str | None], killed_during: Iterable[str | None],
    running: Iterable[str | None],
) -> tuple[list[str], list[str]]:
    """Which of the ``expected`` pod ids vramguard saved, and which not (both
    sorted): saved is killed when nobody acts (``killed_without``), never
    killed during the run (``killed_during``), and running at its end
    (``running``: listed, Running, not leaving)."""
    without, during, alive = set(killed_without), set(killed_during), set(running)
    ok = {i for i in expected if i in without and i not in during and i in alive}
    return sorted(ok), sorted(set(expected) - ok)


def saved_lines(
    saved: Sequence[str], without: Sequence[Unguarded], names: Mapping[str, str], ran_s: float,
    pressure: Sequence[str],
) -> list[str]:
    """One line per pod ``saved``: when it was killed without vramguard, that it
    runs after ``ran_s`` of scenario time with it, and who was evicted for
    device pressure (``pressure``: scenario ids)."""
    out = []
    for i in saved:
        first = next(u for u in without if names.get(f"{u.kill.namespace}/{u.kill.pod}") == i)
        evicted = f" ({', '.join(pressure)} evicted for device pressure)." if pressure else "."
        out.append(f"vramguard saved {i}: without it, killed by CUDA out of memory after "
                   f"{format_seconds(first.kill.time_s)} of scenario time; with it, running after "
                   f"{format_seconds(ran_s)}{evicted}")
    return out


def describe(u: Unguarded, names: Mapping[str, str]) -> str:
    """One sentence: who died when (scenario time), what it held, the
    allocation that failed, and who held the device. ``names``: a demo id by
    ``namespace/name``."""
    kill, k = u.kill, u.kill.kill
    who = names.get(f"{kill.namespace}/{kill.pod}", kill.pod or "a host process")
    others = ", ".join(f"{names.get(o, o)} held {format_bytes(b)}" for o, b in u.holders)
    return (
        f"{who} is killed by CUDA out of memory after {format_seconds(kill.time_s)} of scenario time: it held "
        f"{format_bytes(k.held_bytes)} and an allocation of {format_bytes(k.requested_bytes)} failed with "
        f"{format_bytes(k.free_bytes)} free" + (f" ({others})" if others else "")
    )


def summarize(without: Sequence[Unguarded], names: Mapping[str, str]) -> list[str]:
    """One line per pod killed in ``without`` (time order of first kills): its
    first kill (``describe``), and when it was killed again after restarts."""
    by_pod: dict[str, list[Unguarded]] = {}
    for u in without:
        by_pod.setdefault(f"{u.kill.namespace}/{u.kill.pod}", []).append(u)
    lines = []
    for kills in by_pod.values():
        times = [format_seconds(u.kill.time_s) for u in kills[1:]]
        if len(times) > 5:  # a crash loop: its start and its end say enough
            times = [*times[:3], "...", times[-1]]
        again = f"; restarted, killed again {len(kills) - 1} times: {', '.join(times)}" if len(kills) > 2 else (
            f"; restarted, killed again at {times[0]}" if times else "")
        lines.append(describe(kills[0], names) + again)
    return lines


def judged_without(without: Sequence[Unguarded], shares: Mapping[str, int]) -> list[Verdict]:
    """Each kill of the run without vramguard through the one classifier, with
    ``shares`` (each device's share, bytes by UUID, as the live judge uses;
    a device without one: blame ``Unknown``)."""
    return [classify(driver_evidence(k.device, k.held_bytes, k.requested_bytes, k.free_bytes, shares.get(k.device),
                                     k.reason)) for k in (u.kill.kill for u in without)]


def counts(verdicts: Iterable[Verdict]) -> dict[str, int]:
    """Memory kills by verdict: ``{"GPUOutOfMemory/Innocent": n, "HostOutOfMemory": m, ...}`` (sorted)."""
    out: dict[str, int] = {}
    for v in verdicts:
        key = f"{v.kind}/{v.blame}" if v.blame else v.kind
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def innocent(verdicts: Iterable[Verdict]) -> int:
    """How many are innocent GPU OOM kills (the mission's figure)."""
    return sum(1 for v in verdicts if v.kind == "GPUOutOfMemory" and v.blame == "Innocent")


def live_report(api: Any, without: Sequence[Unguarded], namespaces: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """The demo's closing OOM lines and their JSON: the live count (the
    cluster's end records judged as ``vramguard oom`` judges them, of the
    demo's ``namespaces``: the cluster is shared with other tests) against the
    run without vramguard (``judged_without`` with the live shares), then the
    ``vramguard oom`` table; a cluster that cannot be read gives one line
    saying so (and ``{"error": ...}``)."""
    try:
        read = read_oom(api, None)
    except API_ERRORS as err:
        return [f"OOM records: cannot read the cluster: {err}"], {"error": str(err)}
    live: list[Finding] = [f for f in oom_command.select(oom_command.judge(read), None, None)
                           if f.namespace in namespaces]
    with_ = [f.verdict for f in live]
    without_ = judged_without(without, oom_command.shares(read))
    lines = [
        f"Innocent OOM kills (GPU OOM within the pod's limits and share, vramguard_api.oom): "
        f"with vramguard {innocent(with_)} (live, the cluster's records); "
        f"without {innocent(without_)} (the same scenario replayed, the same classifier)",
        f"  all OOM kills with vramguard: {_counted(counts(with_))}",
        f"  all OOM kills without: {_counted(counts(without_))}",
        "vramguard oom:",
        *("    " + line for line in oom_command.table(live).splitlines()),
    ]
    body = {"live": {"innocent": innocent(with_), "byVerdict": counts(with_),
                     "records": [json.loads(oom_command.to_json(f)) for f in live]},
            "withoutVramguard": {"innocent": innocent(without_), "byVerdict": counts(without_)}}
    return lines, body


def _counted(by: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in by.items()) or "none"
