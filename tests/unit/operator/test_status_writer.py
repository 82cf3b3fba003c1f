"""Budget status writes off the decision path: coalesced per budget, at once
when anything but figures changed, figures on a period and only beyond the
dead band; a shard's fence; ``vramguard.io/limits`` writes."""

from __future__ import annotations

from typing import Any

from vramguard_api.budget import GPUMemoryBudgetStatus
from vramguard_operator.controller.status_writer import StatusWriter, decisive, figures_moved
from vramguard_operator.engine.types import BudgetRef, BudgetStatusUpdate, PodRef

GI = 1 << 30


def status(vram: int, matched: int = 2, warning: str = "below", violation_bytes: int | None = None) -> dict[str, Any]:
    st: dict[str, Any] = {
        "observedGeneration": 1, "matchedPods": matched, "effectiveMode": "Enforce",
        "usage": {"vramBytes": vram, "vram": f"{vram / GI:.3g}Gi"},
        "conditions": [{"type": "Warning", "status": "False" if warning == "below" else "True",
                        "reason": "BelowWarningThreshold" if warning == "below" else "AboveWarningThreshold",
                        "message": f"p-1 {vram / GI:.3g}Gi/10Gi", "lastTransitionTime": "2024-05-01T10:00:00Z"}],
        "openViolations": 0,
    }
    if violation_bytes is not None:
        st["openViolations"] = 1
        st["violations"] = [{"kind": "PodVRAM", "pod": "p-1", "observedBytes": violation_bytes, "limitBytes": 10 * GI,
                             "since": "2024-05-01T10:00:00Z", "openedAt": "2024-05-01T10:00:00Z", "step": "Annotate",
                             "message": f"VRAM of pod p-1 {violation_bytes / GI:.3g}Gi > 10Gi"}]
    return st


def test_only_figures_differ_when_decisive_is_equal() -> None:
    assert decisive(status(4 * GI)) == decisive(status(5 * GI, matched=3))
    assert decisive(status(4 * GI)) != decisive(status(4 * GI, warning="above"))
    assert decisive(status(4 * GI, violation_bytes=11 * GI)) == decisive(status(4 * GI, violation_bytes=12 * GI))
    assert decisive(status(4 * GI)) != decisive(status(4 * GI, violation_bytes=11 * GI))
    assert not figures_moved(status(100 * GI), status(100 * GI + (16 << 20)), 0.01)
    assert figures_moved(status(100 * GI), status(102 * GI), 0.01)
    assert figures_moved(status(100 * GI), status(100 * GI, matched=3), 0.01)
    assert figures_moved(status(4 * GI, violation_bytes=11 * GI), status(4 * GI, violation_bytes=12 * GI), 0.01)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Calls:
    """Stands in for the applier: records the status patches and answers with the budget."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.rv = 10
        self.actions = self

    def write_statuses(self, updates: Any, ctx: Any, result: Any) -> None:
        from vramguard_operator.controller.kubeapi import merge_patch

        for upd in updates:
            key = (upd.budget.namespace, upd.budget.name)
            patch = merge_patch(ctx.current_status.get(key), upd.status.to_api())
            if patch:
                self.patches.append(patch)
                self.rv += 1
                result.budgets[key] = {"metadata": {"resourceVersion": str(self.rv)}, "status": upd.status.to_api()}

    def patch_pod_annotations(self, ref: PodRef, patch: Any) -> dict[str, Any]:
        self.patches.append({"pod": ref.name, **patch})
        return {"metadata": {"name": ref.name}}


def upd(st: dict[str, Any], ns: str = "ml") -> BudgetStatusUpdate:
    return BudgetStatusUpdate(BudgetRef(ns, "train", "u"), GPUMemoryBudgetStatus.model_validate(st))


def writer(fence: Any = lambda ns: True) -> tuple[StatusWriter, Calls, Clock]:
    calls, clock = Calls(), Clock()
    return StatusWriter(calls, refresh=30.0, dead_band=0.01, fence=fence, clock=clock), calls, clock  # type: ignore[arg-type]


def due(w: StatusWriter) -> int:
    """Write what is due now (the thread's work, without the thread)."""
    return w.write_due()


def test_decisive_changes_are_written_at_once_and_coalesced() -> None:
    w, calls, clock = writer()
    first = status(4 * GI)
    w.put(upd(first), first, None)
    later = status(4 * GI, warning="above")
    w.put(upd(later), later, None)  # the same budget again before the write: the latest wins
    assert due(w) == 1 and calls.patches[0]["conditions"][0]["status"] == "True"
    assert w.writes == {"at_once": 1, "refresh": 0}


def test_figures_wait_for_the_period_and_the_dead_band() -> None:
    w, calls, clock = writer()
    base = status(100 * GI)
    w.put(upd(base), base, None)
    assert due(w) == 1
    nudged = status(100 * GI + (16 << 20))  # well within 1%
    w.put(upd(nudged), nudged, None)
    assert w.pending() == 0  # nothing worth a write
    moved = status(103 * GI)
    w.put(upd(moved), moved, None)
    assert due(w) == 0 and w.pending() == 1  # moved, but the period since the last write has not passed
    clock.t += 30
    assert due(w) == 1 and calls.patches[-1]["usage"]["vramBytes"] == 103 * GI
    assert w.writes == {"at_once": 1, "refresh": 1}


def test_the_api_status_known_from_the_watch_is_the_base_when_newer() -> None:
    w, calls, _ = writer()
    current = status(4 * GI, warning="above")
    w.put(upd(current), current, current, current_rv="50")
    assert w.pending() == 0  # the API already holds it
    w.put(upd(status(4 * GI)), status(4 * GI), status(1 * GI), current_rv="40")  # an older view is not the base
    assert due(w) == 1 and "conditions" in calls.patches[0]


def test_a_fenced_namespace_is_not_written_and_limits_are_reported_back() -> None:
    w, calls, _ = writer(fence=lambda ns: ns != "gone")
    st = status(4 * GI)
    w.put(upd(st, ns="gone"), st, None)
    assert w.flush() == 1 and calls.patches == []
    seen: list[Any] = []
    w.on_limits = lambda ref, patch, body: seen.append((ref.name, patch))
    ref = PodRef("ml", "free", "u1")
    w.put_limits(ref, {"vramguard.io/limits": "a"})
    w.put_limits(ref, {"vramguard.io/limits": "b"})  # the latest per pod
    assert w.flush() == 1 and seen == [("free", {"vramguard.io/limits": "b"})]


def test_the_oom_publishers_counters_are_no_reason_to_write() -> None:
    assert decisive({**status(4 * GI), "oomKills": {"innocent": 3}}) == decisive(status(4 * GI))
    w, calls, _ = writer()
    w.put(upd(status(4 * GI)), status(4 * GI), {**status(4 * GI), "oomKills": {"innocent": 3}}, "5")
    assert w.pending() == 0 and calls.patches == []
