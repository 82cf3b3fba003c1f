"""The engine's wording (``engine.messages``), built from figures alone."""

from __future__ import annotations

import math

import pytest

from vramguard_operator.engine import messages as msg
from vramguard_operator.engine.keys import BudgetRef, ViolationKey
from vramguard_operator.engine.ladder import Ladder, LadderStep
from vramguard_operator.engine.measure import LeakFigures, Measure, limit_measure
from vramguard_operator.engine.records import ViolationRecord

from .builders import GI, MI, at

B = BudgetRef("ml", "train", "uid-b")
KEY = ViolationKey("ml", "train", "PodVRAM", "w0")
LEAK_KEY = ViolationKey("ml", "train", "Leak", "w0")


@pytest.mark.parametrize(
    ("key", "subject"),
    [
        (KEY, "VRAM of pod w0"),
        (ViolationKey("ml", "train", "PodRAM", "w0"), "RAM of pod w0"),
        (ViolationKey("ml", "train", "DeviceVRAM", "w0", "GPU-1"), "VRAM on device GPU-1 of pod w0"),
        (ViolationKey("ml", "train", "TotalVRAM"), "total VRAM of the selected pods"),
        (ViolationKey("ml", "train", "TotalRAM"), "total RAM of the selected pods"),
        (LEAK_KEY, "VRAM of pod w0"),
        (ViolationKey("ml", "train", "RAMLeak", "w0"), "RAM of pod w0"),
    ],
)
def test_subjects(key, subject):
    assert msg.subject(key) == subject


def test_a_leak_value_is_per_hour():
    assert msg.value(KEY, 40 * GI) == "40Gi"
    assert msg.value(LEAK_KEY, 200 * MI) == "200Mi/h"


def test_step_text_names_budget_value_limit_since_and_the_next_step_with_its_time():
    # the example in docs/engine.md, "The ladder"
    rec = ViolationRecord(KEY, "uid-b", at(0), opened_at=at(0), step="Annotate", step_time=at(0))
    m = limit_measure(KEY, 45 * GI, 40 * GI, 0.1, 0.02, None)
    text = msg.step_text(B, rec, m, "Throttle", at(300), "Annotate")
    assert text == (
        "budget ml/train: VRAM of pod w0 is 45Gi, above its PodVRAM limit 40Gi since "
        "2024-05-01T10:00:00Z. Annotated. Next: Throttle at 2024-05-01T10:05:00Z."
    )
    assert msg.step_text(B, rec, m, None, None, "Throttle", "100m").endswith(
        ". Throttled: CPU limit set to 100m. No further step."
    )
    assert msg.step_text(B, rec, m, "Evict", None, None).endswith(
        "since 2024-05-01T10:00:00Z. Next: Evict when the projected exhaustion is near."
    )
    assert msg.dry_run_text("Evict", "x") == "dry run: would evict. x"


def leak_measure(seconds_left: float | None) -> Measure:
    figures = LeakFigures(1 * GI, 900 * MI, 5400.9, 16 * GI if seconds_left is not None else None, seconds_left)
    return Measure(LEAK_KEY, GI, 200 * MI, True, True, False, False, None, figures)


def test_leak_text_gives_growth_window_threshold_and_projection():
    rec = ViolationRecord(LEAK_KEY, "uid-b", at(0), opened_at=at(0))
    text = msg.step_text(B, rec, leak_measure(3725.9), "Evict", at(1800), "Annotate")
    assert text == (
        "budget ml/train: pod w0 leaks: VRAM grows 1Gi/h (lower bound 900Mi/h) over 1h30m, threshold 200Mi/h; "
        "projected to reach 16Gi in 1h2m. Annotated. Next: Evict at 2024-05-01T10:30:00Z."
    )
    assert "projected" not in msg.leak_detail(leak_measure(None))
    ram_key = ViolationKey("ml", "train", "RAMLeak", "w0")
    ram = Measure(ram_key, GI, 200 * MI, True, True, False, False, None, LeakFigures(GI, 900 * MI, 5400.9, None, None))
    ram_text = msg.step_text(B, ViolationRecord(ram_key, "uid-b", at(0), opened_at=at(0)), ram, None, None, "Annotate")
    assert ram_text.startswith("budget ml/train: pod w0 leaks: RAM grows 1Gi/h (lower bound 900Mi/h)")
    assert msg.recovered_text(B, ram_key, 10 * MI, 200 * MI, "GrowthStopped").startswith(
        "budget ml/train: RAM of pod w0 back to 10Mi/h (limit 200Mi/h)"
    )
    # no figures (unknown data): no detail, so the status says why instead
    assert msg.leak_detail(Measure(LEAK_KEY, None, 200 * MI, None, None, None, None)) == ""


def test_recovery_warning_and_orphan_texts():
    assert msg.recovered_text(B, KEY, 38 * GI, 40 * GI, "UsageBelowLimit") == (
        "budget ml/train: VRAM of pod w0 back to 38Gi (limit 40Gi): violation closed (UsageBelowLimit)"
    )
    assert msg.recovered_text(B, LEAK_KEY, 0, 200 * MI, "NoLongerSelected").endswith(
        "pod w0 back to 0/h (limit 200Mi/h): violation closed (NoLongerSelected)"
    )
    assert msg.budget_gone_text(ViolationKey("ml", "old", "DeviceVRAM", "w0", "GPU-1"), "w0") == (
        "budget ml/old is gone: DeviceVRAM on GPU-1 violation on pod w0 closed"
    )
    m = limit_measure(KEY, 34 * GI, 40 * GI, 0.1, 0.02, None)
    assert msg.warning_text(B, m, 0.85, "Annotate") == (
        "budget ml/train: VRAM of pod w0 is 34Gi, 85% of its PodVRAM limit 40Gi (warning threshold 85%). "
        "Next: a violation, then Annotate."
    )
    assert msg.warning_text(B, m, 0.85, None).endswith("(warning threshold 85%).")


def test_violation_message_says_pending_paused_or_measured():
    pending = ViolationRecord(KEY, "uid-b", at(0))
    assert msg.violation_message(pending, None, None, None, None) == (
        "above the limit since 2024-05-01T10:00:00Z, within the tolerance"
    )
    rec = ViolationRecord(KEY, "uid-b", at(0), opened_at=at(0), step="Throttle")
    unknown = limit_measure(KEY, None, 40 * GI, 0.1, 0.02, None)
    assert msg.violation_message(rec, unknown, None, 40 * GI, None) == "no fresh measured data: escalation paused"
    m = limit_measure(KEY, 45 * GI, 40 * GI, 0.1, 0.02, None)
    assert msg.violation_message(rec, m, 45 * GI, 40 * GI, None) == "VRAM of pod w0 45Gi > 40Gi"
    long = msg.violation_message(rec, m, 45 * GI, 40 * GI, "x" * 2000)
    assert long.startswith("VRAM of pod w0 45Gi > 40Gi; throttle impossible: x") and len(long) == 1024


def test_pod_message_lists_each_violation_with_its_next_rung():
    ladder = Ladder((LadderStep("Annotate", 0), LadderStep("Throttle", 300, "100m"), LadderStep("Evict", math.inf)))
    recs = [
        ViolationRecord(LEAK_KEY, "u", at(0), at(0), "Annotate", at(0), 1 * GI, 200 * MI),
        ViolationRecord(KEY, "u", at(0), at(60), "Annotate", at(60), 45 * GI, 40 * GI),
        ViolationRecord(ViolationKey("ml", "other", "PodRAM", "w0"), "u", at(0), at(0), "Throttle", at(300)),
    ]
    ladders = {"train": ladder}
    text = msg.pod_message(recs, lambda key: ladders.get(key.budget))
    assert text.split("; ") == [
        "budget other: PodRAM since 2024-05-01T10:00:00Z",
        "Throttle at 2024-05-01T10:05:00Z",
        "budget train: Leak 1Gi/h > 200Mi/h since 2024-05-01T10:00:00Z",
        "Annotate at 2024-05-01T10:00:00Z",
        "next Throttle at 2024-05-01T10:05:00Z",
        "budget train: PodVRAM 45Gi > 40Gi since 2024-05-01T10:00:00Z",
        "Annotate at 2024-05-01T10:01:00Z",
        "next Throttle at 2024-05-01T10:06:00Z",
    ]
    # an Evict that only the projection makes due has no time to announce
    at_throttle = [ViolationRecord(KEY, "u", at(0), at(0), "Throttle", at(300))]
    assert "next" not in msg.pod_message(at_throttle, lambda key: ladder)


def test_restore_problem_names_pod_annotation_and_containers():
    text = msg.restore_problem("ml", "w0", ["a", "b"])
    assert text.startswith("pod ml/w0 annotation vramguard.io/original-cpu: a, b: not restored")
    assert "no valid entry: not restored" in msg.restore_problem("ml", "w0", [])
