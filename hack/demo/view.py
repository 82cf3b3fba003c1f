"""What the demo runner (hack/demo/run.py) shows: the ``vramguard top`` table,
vramguard's Events as they happen, and the outcomes in the summary."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import plan as P  # hack/demo/plan.py (run.py puts hack/demo on sys.path)

from vramguard_operator.cli.top.command import fetch as top_fetch
from vramguard_operator.cli.top.model import Snapshot as TopSnapshot
from vramguard_operator.cli.top.render import render as top_render
from vramguard_operator.cli.top.rows import build_rows


class EventFeed:
    """Every Event the run saw (by uid) and which of them, at which count, were shown."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.shown: set[tuple[str, int]] = set()

    def fresh(self, listed: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Record ``listed`` (API-form Events) and return the new vramguard Events,
        oldest first: those on pods, and those on budgets that no pod got a copy of
        (a total's recovery). A repeat with a higher count is new."""
        for e in listed:
            self.events[e["metadata"]["uid"]] = e
        budget_only = {(b, e.reason, e.message) for b, e in P.budget_only_events(self.events.values())}
        fresh = []
        for e in self.events.values():
            key = (e["metadata"]["uid"], int(e.get("count") or 1))
            obj = e["involvedObject"]
            wanted = obj.get("kind") == "Pod" or (obj.get("name"), e.get("reason"), e.get("message")) in budget_only
            if key in self.shown or not P.from_vramguard(e) or not wanted:
                continue
            self.shown.add(key)
            fresh.append(e)
        return sorted(fresh, key=lambda e: e.get("firstTimestamp") or "")


def _since(when: datetime | None, start: datetime | None) -> float:
    return (when - start).total_seconds() if when and start else 0.0


def event_line(e: Mapping[str, Any], start: datetime | None) -> str:
    """One live-view line for an API-form Event, its time relative to ``start`` (the agents' start)."""
    obj = e["involvedObject"]
    repeat = f" (x{e['count']})" if int(e.get("count") or 1) > 1 else ""
    kind = "pod" if obj.get("kind") == "Pod" else "gmb"
    rel = _since(P.event_time(e), start)
    return f"t+{rel:>4.0f}s  {e.get('reason'):<22} {kind}/{obj.get('name')}{repeat}: {e.get('message')}"


def event_text(e: P.EventLine, start: datetime | None) -> str:
    """One summary line for an Event, its time relative to ``start`` (the agents' start)."""
    repeat = f" (x{e.count})" if e.count > 1 else ""
    return f"t+{_since(e.time, start):>4.0f}s {e.reason}{repeat}: {e.message}"


def who(r: P.PodOutcome) -> str:
    """A demo pod as the summary names it (a replacement after its original)."""
    if r.id.endswith("~new"):
        return f"{r.id.removesuffix('~new')}'s replacement ({r.workload}, pod {r.namespace}/{r.name})"
    return f"{r.id} ({r.workload}, pod {r.namespace}/{r.name})"


def table(api: Any, namespaces: Sequence[str]) -> str:
    """The ``vramguard top`` table of ``namespaces`` merged into one."""
    snaps = [top_fetch(api, ns) for ns in namespaces]
    merged = TopSnapshot(
        pods=[p for s in snaps for p in s.pods],
        budgets=[b for s in snaps for b in s.budgets],
        policies=snaps[0].policies,
        reports=snaps[0].reports,
        namespace_labels=snaps[0].namespace_labels,
        now=datetime.now(UTC),
    )
    rows, notes = build_rows(merged)
    return top_render(rows, notes, all_namespaces=True)


def print_outcomes(
    results: Sequence[P.PodOutcome], budget_events: Sequence[tuple[str, P.EventLine]], start: datetime | None
) -> None:
    """Print each pod's outcome with its Events (pods acted on first, then those
    left alone), then the Events only a budget got."""
    for r in results:
        if r.outcomes == ["leftAlone"]:
            continue
        print(f"{', '.join(r.outcomes):<30} {who(r)}")
        for e in r.events:
            print("    " + event_text(e, start))
    for r in results:
        if r.outcomes != ["leftAlone"]:
            continue
        warned = [e for e in r.events if e.reason == "AboveWarningThreshold"]
        note = " - warned only" if warned else ""
        print(f"{'left alone':<30} {who(r)}{note}")
        for e in r.events:
            print("    " + event_text(e, start))
    for name, e in budget_events:
        print(f"{'budget':<30} {name}: " + event_text(e, start))
