"""The detector's one tuning object: frozen, and its default thresholds are the CRD's."""

from __future__ import annotations

import dataclasses

import pytest

from vramguard_api.budget import LeakDetection
from vramguard_api.leak.tuning import TUNING
from vramguard_api.units import parse_duration, quantity_to_bytes


def test_the_tuning_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TUNING.fast_min_snr = 3.0  # type: ignore[misc]


def test_the_default_thresholds_are_the_crds_defaults():
    ld = LeakDetection()
    assert quantity_to_bytes(ld.min_growth_per_hour, "minGrowthPerHour") == TUNING.default_min_growth_bytes_per_hour
    assert parse_duration(ld.min_window, "minWindow") == TUNING.default_min_window_seconds
    assert parse_duration(ld.min_evidence, "minEvidence") == TUNING.default_min_evidence_seconds

