"""The Cap step and what a budget wants of its pods' memory limits: the hard
limits a fired Cap sets (or why none can be), the held Caps and the soft
limits at the pods' shares (``engine.caps``: the levels and the annotation),
and how a fired Cap stands for the status message.

Each function works on one budget's ``BudgetWork``, as ``steps`` does.
"""

from __future__ import annotations

from vramguard_api.steps import Action
from vramguard_operator.engine import caps
from vramguard_operator.engine import ladder as lad
from vramguard_operator.engine import messages as msg
from vramguard_operator.engine.keys import EVENT_CAP_IMPOSSIBLE, EVENT_CAPPED
from vramguard_operator.engine.measure import BudgetLimits, Measure, PodData
from vramguard_operator.engine.outputs import Cap, EventSpec
from vramguard_operator.engine.records import ViolationRecord, capped
from vramguard_operator.engine.work import BudgetWork, Fire


def cap(w: BudgetWork, f: Fire, d: PodData, rung: lad.LadderStep) -> None:
    """A Cap decision for ``d``: the hard limits its pod patch will carry (as the
    driver computes them from the pod's current annotation), or why none can be set."""
    levels, refused = _cap_plan(w, f.m, d, rung)
    if not levels:
        reason = _cap_impossible(f.m, refused)
        text = msg.cap_impossible_text(msg.step_text(w.ref, f.rec, f.m, f.next_step, f.next_time, None), reason)
        w.emit(Cap, f, d, EventSpec("Warning", EVENT_CAP_IMPOSSIBLE, text, w.event_key(f.rec, Action.CAP)), hard_limits={}, impossible_reason=reason)
        return
    held = caps.held_hard(d.pod)
    used = {u: v for u, v, _ in d.devices}
    hard = {u: caps.hard_limit(level, used.get(u), held.get(u)) for u, level in levels.items()}
    floors = {u: caps.hard_limit(level, level, None) for u, level in levels.items()}
    text = msg.step_text(w.ref, f.rec, f.m, f.next_step, f.next_time, Action.CAP, done_text=msg.capped_text(hard, floors))
    w.emit(Cap, f, d, EventSpec("Warning", EVENT_CAPPED, text, w.event_key(f.rec, Action.CAP)), hard_limits=hard)


def _cap_plan(w: BudgetWork, m: Measure, d: PodData, rung: lad.LadderStep) -> tuple[dict[str, int], list[str]]:
    """The levels of ``d``'s hard limits that can be written, and why the others cannot."""
    levels = caps.cap_levels(m, d, rung.hard_limit, caps.held_hard(d.pod)) or {}
    return caps.writable(levels, w.state.nodes.get(d.pod.node_name or ""))


def _cap_impossible(m: Measure, refused: list[str]) -> str:
    if m.key.kind in ("PodRAM", "TotalRAM"):
        return "the driver limits GPU memory only, not RAM"
    return "; ".join(refused) or "the pod holds no GPU memory on a device to cap"


def _cap_holders(w: BudgetWork, rec: ViolationRecord) -> list[PodData]:
    """The running pods a held Cap applies to: the violation's pod, or for a total
    the pods its Cap step was fired on (their annotation says so)."""
    if rec.key.pod is not None:
        return [d for d in w.data if d.pod.name == rec.key.pod]
    out = [d for d in w.data if (r := w.records_on(d.pod.uid).get(rec.key)) is not None and capped(r)]
    return sorted(out, key=lambda d: d.pod.name)


def want_caps(w: BudgetWork) -> None:
    """Cap is level-triggered: every violation that reached its Cap step for real
    holds its pods at their levels while the budget enforces and its ladder has
    a Cap; on unknown data their limits are kept as they are."""
    if not w.acting:
        return
    for rec in w.next_records.values():
        rung = w.ladder_for(rec.key).rung(Action.CAP) if capped(rec) else None
        if rung is None:
            continue
        m = w.measured.get(rec.key)
        for d in _cap_holders(w, rec):
            known = m is not None and m.over is not None
            levels = caps.cap_levels(m, d, rung.hard_limit, caps.held_hard(d.pod)) if m is not None and known else None
            w.want_limits(d.pod.uid, caps.HOLD if levels is None else caps.LimitsWant(hard=levels))


def want_soft_limits(w: BudgetWork, lim: BudgetLimits, on: bool) -> None:
    """Guarantees: the soft limit of each running pod at its share on each device
    it uses, while the budget enforces with soft limits ``on``; a pod on a stale
    or missing report keeps what it has."""
    if not (on and w.acting):
        return
    for d in w.data:
        if d.state != "Fresh":
            w.want_limits(d.pod.uid, caps.HOLD)
            continue
        share = caps.shares(d, lim)
        if share:
            w.want_limits(d.pod.uid, caps.LimitsWant(soft=share))


def cap_status(w: BudgetWork, rec: ViolationRecord, m: Measure) -> str | None:
    """How a fired Cap stands, for the status message (None: no Cap held)."""
    rung = w.ladder_for(rec.key).rung(Action.CAP)
    if not (w.acting and capped(rec) and rung is not None):
        return None
    out = []
    for d in _cap_holders(w, rec):
        levels, refused = _cap_plan(w, m, d, rung)
        node = w.state.nodes.get(d.pod.node_name or "")
        entries = caps.reported(d.pod, node)
        impossible = None if levels else _cap_impossible(m, refused)
        out.append(msg.cap_status_text([(u, entries.get(u)) for u in sorted(levels)], impossible))
    return "; ".join(out) or None
