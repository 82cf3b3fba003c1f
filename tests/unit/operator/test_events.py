"""Event correlation: repeats update the existing Event instead of adding one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from vramguard_operator.controller.events import EventCorrelator, ObjectRef
from vramguard_operator.engine.types import EventSpec

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
POD = ObjectRef("v1", "Pod", "ml", "w0", "uid-w0")
BLOCKED = EventSpec("Warning", "EvictionBlocked", "refused (HTTP 429 ...)")


def test_a_repeat_within_the_window_is_found_and_a_new_message_is_not():
    c = EventCorrelator(window_seconds=600)
    key = c.key(POD, BLOCKED)
    assert c.previous(key, T0) is None
    c.remember(key, "w0.1", "ml", T0)
    seen = c.previous(key, T0 + timedelta(seconds=30))
    assert seen is not None and seen.name == "w0.1"
    other = c.key(POD, EventSpec("Warning", "EvictionBlocked", "another message"))
    assert c.previous(other, T0) is None
    same_text_other_pod = c.key(ObjectRef("v1", "Pod", "ml", "w1", "uid-w1"), BLOCKED)
    assert c.previous(same_text_other_pod, T0) is None


def test_entries_expire_and_the_memory_is_bounded():
    c = EventCorrelator(window_seconds=60, size=2)
    k1, k2, k3 = (c.key(ObjectRef("v1", "Pod", "ml", f"w{i}", f"u{i}"), BLOCKED) for i in range(3))
    c.remember(k1, "a", "ml", T0)
    assert c.previous(k1, T0 + timedelta(seconds=61)) is None
    c.remember(k1, "a", "ml", T0)
    c.remember(k2, "b", "ml", T0)
    c.remember(k3, "c", "ml", T0)
    assert c.previous(k1, T0) is None  # least recently used out
    assert c.previous(k3, T0) is not None
