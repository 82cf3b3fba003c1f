"""The device-pressure rule on one device (engine.pressure.decide): a table of
cases, and properties over random devices."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramguard_operator.engine.keys import BudgetRef, PodRef
from vramguard_operator.engine.pressure import DeviceFacts, Occupant, PressureRule, decide

GI = 1 << 30
USABLE = 80 * GI
FIVE = PressureRule(min_free_fraction=0.05, source="policy/p", protect_shares=False)  # 4Gi of 80Gi: minFree alone
GUARD = PressureRule(min_free_fraction=0.05, source="policy/p")  # and the room of pods within their shares


def occ(name: str, used: float | None, share: float | None = 20, **kw: object) -> Occupant:
    """A pod on the device using ``used`` GiB with a ``share`` GiB share, under FIVE, enforcing."""
    fields: dict[str, object] = {
        "rule": FIVE,
        "mode": "Enforce",
        "home": BudgetRef("ns", f"default:{name}"),
    }
    fields.update(kw)
    return Occupant(
        PodRef("ns", name, f"uid-{name}"),
        None if used is None else int(used * GI),
        None if share is None else int(share * GI),
        **fields,  # type: ignore[arg-type]
    )


def device(*occupants: Occupant, free: float = 2, known: bool = True) -> DeviceFacts:
    """GPU-0 with ``free`` GiB free (the rest used)."""
    return DeviceFacts("GPU-0", "node-a", USABLE, USABLE - int(free * GI), known, occupants)


CASES = [
    # id, device, verdict, chosen, fall-backs
    ("no rule on any pod", device(occ("a", 50, rule=None), occ("b", 10, rule=None)), "NoRule", None, ()),
    ("only an exempt pod has a rule", device(occ("a", 50, mode="Exempt"), occ("b", 10, rule=None)), "NoRule", None, ()),
    ("incomplete data", device(occ("a", 50), occ("b", 10), known=False), "Unknown", None, ()),
    ("enough free", device(occ("a", 50), occ("b", 10), free=4), "Clear", None, ()),
    ("one over its share", device(occ("a", 50), occ("b", 15)), "Act", "a", ()),
    ("most bytes above share first", device(occ("a", 30), occ("b", 40, share=25), occ("c", 10)), "Act", "b", ("a",)),
    ("ties by name", device(occ("b", 30), occ("a", 30)), "Act", "a", ("b",)),
    ("all within their shares", device(occ("a", 20), occ("b", 19.9), occ("c", 20)), "NoCandidate", None, ()),
    ("a pod leaving with memory: wait", device(occ("a", 50), occ("b", 25, leaving=True)), "Waiting", None, ()),
    ("a pod leaving without memory: act", device(occ("a", 50), occ("b", 0, leaving=True)), "Act", "a", ()),
    ("exempt pod never chosen", device(occ("a", 50, mode="Exempt"), occ("b", 25)), "Act", "b", ()),
    ("a pod without a rule is not subject", device(occ("a", 50, rule=None), occ("b", 25)), "Act", "b", ()),
    ("unknown share: not subject", device(occ("a", 50, share=None), occ("b", 25)), "Act", "b", ()),
    ("unknown use: not subject", device(occ("a", None), occ("b", 25)), "Act", "b", ()),
    ("dry run is ranked too", device(occ("a", 50, mode="DryRun"), occ("b", 25)), "Act", "a", ("b",)),
    ("the previous choice stays first", device(occ("a", 50), occ("b", 25, chosen_before=True)), "Act", "b", ("a",)),
    (
        "a budget's larger minFree sets the threshold",
        device(occ("a", 50, rule=PressureRule(0.10, source="budget ns/x")), occ("b", 10), free=6),
        "Act",
        "a",
        (),
    ),
    ("room a neighbour needs", device(occ("a", 50, rule=GUARD), occ("b", 5, rule=GUARD), free=10), "Act", "a", ()),
    ("room enough", device(occ("a", 50, rule=GUARD), occ("b", 5, rule=GUARD), free=15), "Clear", None, ()),
    ("an unprotected neighbour's room", device(occ("a", 50, rule=GUARD), occ("b", 5), free=10), "Clear", None, ()),
    (
        "a leaving pod's room is not kept",
        device(occ("a", 50, rule=GUARD), occ("b", 5, rule=GUARD, leaving=True), free=10),
        "Clear",
        None,
        (),
    ),
    ("an exempt pod's room is not kept", device(occ("a", 50, rule=GUARD), occ("b", 5, rule=GUARD, mode="Exempt"),
                                                free=10), "Clear", None, ()),
    (
        "bytes and fraction: the larger",
        device(occ("a", 50, rule=PressureRule(0.01, 5 * GI)), occ("b", 10), free=4.5),
        "Act",
        "a",
        (),
    ),
]


@pytest.mark.parametrize(("facts", "kind", "chosen", "rest"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(facts: DeviceFacts, kind: str, chosen: str | None, rest: tuple[str, ...]) -> None:
    v = decide(facts)
    assert v.kind == kind
    assert (v.chosen.pod.name if v.chosen else None) == chosen
    assert tuple(c.pod.name for c in v.candidates[1:]) == rest


def test_threshold_and_protected() -> None:
    v = decide(device(occ("a", 50), occ("b", 15), occ("c", 20.5)))
    assert v.min_free == int(USABLE * 0.05)
    assert [o.pod.name for o in v.protected] == ["b"]
    assert [o.pod.name for o in v.candidates] == ["a", "c"]


def test_the_room_sets_the_threshold_when_larger() -> None:
    v = decide(device(occ("a", 50, rule=GUARD), occ("b", 5, rule=GUARD), occ("c", 18, rule=GUARD), free=10))
    assert v.room_for is not None and v.room_for.pod.name == "b"
    assert v.min_free == 15 * GI and v.rule == GUARD
    small = decide(device(occ("a", 50, rule=GUARD), occ("b", 18, rule=GUARD), free=3))
    assert small.room_for is None and small.min_free == int(USABLE * 0.05)


def test_rule_text() -> None:
    assert FIVE.text() == "5%"
    assert PressureRule(0.025, 4 * GI).text() == "2.5% or 4Gi"
    assert PressureRule.combine([PressureRule(0.05), PressureRule(0.1), PressureRule(None, GI)]) == PressureRule(
        0.1, GI
    )
    unprotected = PressureRule(0.05, protect_shares=False)
    assert not PressureRule.combine([unprotected, unprotected]).protect_shares  # type: ignore[union-attr]
    assert PressureRule.combine([unprotected, PressureRule(0.01)]).protect_shares  # type: ignore[union-attr]
    assert PressureRule.combine([]) is None


# --- properties --------------------------------------------------------------------

MODES = st.sampled_from(["Enforce", "Enforce", "DryRun", "Exempt"])


@st.composite
def occupants(draw: st.DrawFn, i: int) -> Occupant:
    used = draw(st.one_of(st.none(), st.integers(0, 60)))
    share = draw(st.one_of(st.none(), st.integers(1, 40)))
    rule = draw(st.sampled_from([None, FIVE, GUARD, PressureRule(0.1), PressureRule(None, 8 * GI, protect_shares=False)]))
    return Occupant(
        PodRef("ns", f"p{i}", f"u{i}"),
        None if used is None else used * GI,
        None if share is None else share * GI,
        rule,
        draw(MODES),
        draw(st.booleans()),
        None,
        draw(st.booleans()),
    )


@st.composite
def devices(draw: st.DrawFn) -> DeviceFacts:
    n = draw(st.integers(0, 6))
    occs = tuple(draw(occupants(i)) for i in range(n))
    used = draw(st.integers(0, 80)) * GI
    return DeviceFacts("GPU-0", "node-a", USABLE, used, draw(st.booleans()), occs)


@settings(max_examples=400, deadline=None)
@given(devices())
def test_never_a_pod_within_its_share_nor_an_exempt_or_leaving_one(d: DeviceFacts) -> None:
    v = decide(d)
    for c in v.candidates:
        assert c.used is not None and c.share is not None and c.used > c.share
        assert c.mode != "Exempt" and not c.leaving and c.rule is not None


@settings(max_examples=400, deadline=None)
@given(devices())
def test_never_acts_while_a_pod_leaves_with_memory(d: DeviceFacts) -> None:
    v = decide(d)
    if any(o.leaving and (o.used or 0) > 0 for o in d.occupants):
        assert v.kind != "Act"


@settings(max_examples=400, deadline=None)
@given(devices())
def test_unknown_data_never_acts(d: DeviceFacts) -> None:
    v = decide(replace(d, known=False))
    assert v.kind in ("NoRule", "Unknown")
    assert not v.candidates


@settings(max_examples=400, deadline=None)
@given(devices())
def test_acts_only_under_the_threshold(d: DeviceFacts) -> None:
    v = decide(d)
    if v.kind == "Act":
        assert v.min_free is not None and d.free is not None and d.free < v.min_free
        ruled = [o.rule.min_free(USABLE) for o in d.occupants if o.rule is not None and o.mode != "Exempt"]
        assert v.min_free == max(max(ruled), max(o.room for o in d.occupants))
