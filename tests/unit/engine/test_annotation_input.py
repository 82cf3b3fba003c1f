"""The vramguard.io/* pod annotations are input from objects anyone with pod
update rights can write: whatever they hold, evaluate reports the bad entries
in ``problems``, drops them, and never raises."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramguard_operator.engine.records import records_from_annotation
from vramguard_operator.engine.types import ANNOTATION_ORIGINAL_CPU, ANNOTATION_VIOLATIONS

from .builders import at, budget, pod, report, run, vram

GOOD = {
    "budget": "train",
    "budgetUID": "uid-train",
    "kind": "PodVRAM",
    "since": "2024-05-01T10:00:00Z",
    "openedAt": "2024-05-01T10:00:00Z",
    "step": "Annotate",
    "stepTime": "2024-05-01T10:00:00Z",
    "observedBytes": 5,
    "limitBytes": 4,
}

BAD = [
    # id, entry, field named in the problem
    ("device-int", {**GOOD, "kind": "DeviceVRAM", "device": 5}, "device"),
    ("device-dict", {**GOOD, "kind": "DeviceVRAM", "device": {"a": 1}}, "device"),
    ("device-list", {**GOOD, "kind": "DeviceVRAM", "device": ["GPU-0"]}, "device"),
    ("device-missing-for-device-kind", {**GOOD, "kind": "DeviceVRAM"}, "device"),
    ("device-on-pod-kind", {**GOOD, "device": "GPU-0"}, "device"),
    ("budget-int", {**GOOD, "budget": 5}, "budget"),
    ("budget-list", {**GOOD, "budget": ["train"]}, "budget"),
    ("budget-missing", {k: v for k, v in GOOD.items() if k != "budget"}, "budget"),
    ("budget-uid-dict", {**GOOD, "budgetUID": {}}, "budgetUID"),
    ("kind-list", {**GOOD, "kind": ["PodVRAM"]}, "kind"),
    ("kind-dict", {**GOOD, "kind": {}}, "kind"),
    ("kind-unknown", {**GOOD, "kind": "Bogus"}, "kind"),
    ("kind-missing", {k: v for k, v in GOOD.items() if k != "kind"}, "kind"),
    ("pod-int", {**GOOD, "pod": 3}, "pod"),
    ("step-list", {**GOOD, "step": ["Evict"]}, "step"),
    ("step-unknown", {**GOOD, "step": "Explode"}, "step"),
    ("since-int", {**GOOD, "since": 5}, "since"),
    ("since-missing", {k: v for k, v in GOOD.items() if k != "since"}, "since"),
    ("since-garbage", {**GOOD, "since": "yesterday"}, "since"),
    ("since-year-1", {**GOOD, "since": "0001-01-01T00:00:00+01:00"}, "since"),
    ("opened-at-year-9999", {**GOOD, "openedAt": "9999-12-31T23:59:59Z"}, "openedAt"),
    ("step-time-list", {**GOOD, "stepTime": []}, "stepTime"),
    ("observed-bool", {**GOOD, "observedBytes": True}, "observedBytes"),
    ("observed-float", {**GOOD, "observedBytes": 1.5}, "observedBytes"),
    ("limit-negative", {**GOOD, "limitBytes": -1}, "limitBytes"),
    ("limit-string", {**GOOD, "limitBytes": "4"}, "limitBytes"),
    ("evict-target-int", {**GOOD, "kind": "TotalVRAM", "evictTargetUID": 1}, "evictTargetUID"),
    ("entry-string", "PodVRAM", "entry"),
    ("entry-number", 7, "entry"),
    ("entry-list", [GOOD], "entry"),
    ("entry-null", None, "entry"),
]


@pytest.mark.parametrize(("entry", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_entry_is_reported_and_dropped(entry, field):
    text = json.dumps([GOOD, entry])
    records, problems = records_from_annotation(text, "ml", "w0")
    assert [r.key.kind for r in records] == ["PodVRAM"]  # the good entry is kept
    (problem,) = problems
    assert "ml/w0" in problem and "[1]" in problem and field in problem
    p = replace(pod("w0"), annotations={ANNOTATION_VIOLATIONS: text})
    out = run([budget(per_pod={"vram": "40Gi"})], [p], [report("node-a", at(60), {"w0": vram(41)})], at(60))
    assert len(out.problems) == 1
    (patch,) = out.pod_patches  # rewritten without the bad entry
    assert len(json.loads(patch.annotations[ANNOTATION_VIOLATIONS])) == 1


def test_deeply_nested_annotations_do_not_crash_the_engine():
    deep = "[" * 50_000 + "]" * 50_000  # within the size bound (a longer text is refused unparsed)
    p = replace(pod("w0"), annotations={ANNOTATION_VIOLATIONS: deep, ANNOTATION_ORIGINAL_CPU: deep})
    out = run([budget(per_pod={"vram": "40Gi"})], [p], [report("node-a", at(0), {"w0": vram(41)})], at(0))
    assert any("ml/w0" in problem and "nested" in problem for problem in out.problems)
    assert [d.action for d in out.decisions] == ["Annotate"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
TIMES = st.sampled_from(["2024-05-01T10:00:00Z", "2024-05-01T09:50:00+00:00", "2024-05-01", "9999-12-31T23:59:59Z"])
VALID: dict[str, Any] = {
    "budget": st.sampled_from(["train", "train", "other", ""]),
    "budgetUID": st.sampled_from(["uid-train", "", "x"]),
    "kind": st.sampled_from(["PodVRAM", "PodRAM", "DeviceVRAM", "TotalVRAM", "TotalRAM", "Leak"]),
    "device": st.sampled_from(["GPU-0", "GPU-1"]),
    "pod": st.sampled_from(["w0", "w1"]),
    "since": TIMES,
    "openedAt": TIMES,
    "step": st.sampled_from(["Annotate", "Throttle", "Evict"]),
    "stepTime": TIMES,
    "observedBytes": st.integers(-1, 1 << 40),
    "limitBytes": st.integers(-1, 1 << 40),
    "evictTargetUID": st.sampled_from(["uid-w0", "uid-w1"]),
}


@st.composite
def near_records(draw: st.DrawFn) -> dict[str, Any]:
    """An entry of plausible values (each field present or not) with up to two
    fields replaced by arbitrary JSON."""
    required = ("budget", "kind", "since")
    entry = draw(
        st.fixed_dictionaries(
            {k: VALID[k] for k in required}, optional={k: v for k, v in VALID.items() if k not in required}
        )
    )
    for key in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=2)):
        entry[key] = draw(JSON)
    return entry


ENTRY = near_records() | JSON
ORIGINAL = st.dictionaries(
    st.sampled_from(["main", "side"]) | st.text(max_size=5),
    st.fixed_dictionaries(
        {},
        optional={
            "limit": st.sampled_from(["4", "64", "x", ""]) | JSON,
            "request": st.sampled_from(["4", "-1"]) | JSON,
        },
    )
    | JSON,
    max_size=3,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    violations=st.lists(ENTRY, max_size=4).map(json.dumps) | JSON.map(json.dumps) | st.text(max_size=40),
    original=ORIGINAL.map(json.dumps) | JSON.map(json.dumps) | st.text(max_size=40),
    gib=st.sampled_from([1, 39.5, 41, 50]),
    cpu=st.sampled_from(["4", "100m", None]),
    t=st.sampled_from([0, 60, 600]),
)
def test_arbitrary_annotations_never_make_evaluate_raise(violations, original, gib, cpu, t):
    b = budget(per_pod={"vram": "40Gi"}, per_device={"vram": "30Gi"}, total={"vram": "60Gi"}, leak={"enabled": True})
    pods = [
        replace(pod("w0", cpu=cpu), annotations={ANNOTATION_VIOLATIONS: violations, ANNOTATION_ORIGINAL_CPU: original}),
        pod("w1"),
    ]
    usage = {"w0": vram(gib), "w1": vram(gib)}
    out = run([b], pods, [report("node-a", at(t), usage)], at(t))
    # the output is well-formed: statuses serialize, patches are strings or removals
    for update in out.statuses:
        update.status.to_api()
    for patch in out.pod_patches:
        assert all(v is None or isinstance(v, str) for v in patch.annotations.values())
