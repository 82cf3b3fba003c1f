"""The per-pod diagnosis (``engine.diagnosis``): the table, its order, unknown inputs."""

from __future__ import annotations

import math

import pytest

from vramguard_api.diagnosis import DIAGNOSES, DiagnosisThresholds
from vramguard_api.policy import GPUMemoryPolicySpec
from vramguard_operator.engine.diagnosis import RULES, PodMeasures, diagnose, diagnosis_changed_text

GI, MI = 2**30, 2**20
TH = DiagnosisThresholds()
# a pod well within everything: 40 of 80 GiB VRAM on a 80 GiB device, 10 of 32 GiB RAM
CALM = dict(vram_bytes=40 * GI, vram_limit_bytes=80 * GI, devices=((40 * GI, 80 * GI),), ram_bytes=10 * GI,
            ram_limit_bytes=32 * GI)


def named(**changes) -> str | None:
    finding = diagnose(PodMeasures(**{**CALM, **changes}), TH)
    return None if finding is None else finding.diagnosis


@pytest.mark.parametrize(
    ("changes", "diagnosis"),
    [
        ({}, "OK"),
        ({"ram_bytes": math.ceil(32 * GI * 0.85)}, "RAMShort"),  # at the ratio
        ({"ram_bytes": math.ceil(32 * GI * 0.85) - 1}, "OK"),
        ({"swap_bytes": 64 * MI}, "RAMShort"),
        ({"swap_bytes": 64 * MI - 1}, "OK"),
        ({"pressure_percent": 10.0}, "RAMShort"),
        ({"pressure_percent": 9.9}, "OK"),
        ({"vram_bytes": 68 * GI, "devices": ((68 * GI, 80 * GI),)}, "VRAMShort"),  # 85% of its limit
        ({"vram_limit_bytes": None, "devices": ((40 * GI, 80 * GI), (78 * GI, 80 * GI))}, "VRAMShort"),  # 97.5% full
        ({"vram_limit_bytes": None, "devices": ((40 * GI, 80 * GI), (77 * GI, 80 * GI))}, "OK"),
        ({"gpu_utilization_peak_percent": 3.0}, "VRAMIdle"),  # 50% of its share, idle
        ({"gpu_utilization_peak_percent": 6.0}, "OK"),
        ({"gpu_utilization_peak_percent": 0.0, "vram_bytes": 39 * GI}, "OK"),  # under half its share
        ({"vram_leak": True}, "VRAMLeak"),
        ({"ram_leak": True}, "RAMLeak"),
    ],
)
def test_each_rule_at_its_threshold(changes, diagnosis):
    assert named(**changes) == diagnosis


def test_the_first_rule_that_holds_wins_in_the_documented_order():
    assert [d for d, _ in RULES] + ["OK"] == list(DIAGNOSES)
    everything = {"ram_leak": True, "vram_leak": True, "swap_bytes": GI, "vram_bytes": 79 * GI,
                  "gpu_utilization_peak_percent": 0.0}
    order = []
    for _ in DIAGNOSES[:-1]:
        got = named(**everything)
        order.append(got)
        everything = {**everything, **_without(got)}
    assert order == list(DIAGNOSES[:-1])
    # VRAM not full while RAM runs out: RAM, not VRAM (the seeds' one-line diagnosis)
    assert named(ram_bytes=31 * GI, vram_bytes=20 * GI) == "RAMShort"


def _without(diagnosis: str) -> dict:
    return {
        "RAMLeak": {"ram_leak": False},
        "VRAMLeak": {"vram_leak": None},
        "RAMShort": {"swap_bytes": None},
        "VRAMShort": {"vram_bytes": 60 * GI, "devices": ((60 * GI, 80 * GI),)},
        "VRAMIdle": {"gpu_utilization_peak_percent": None},
    }[diagnosis]


def test_unmeasured_inputs_are_not_judged():
    assert diagnose(PodMeasures(), TH) is None  # nothing known: no diagnosis at all
    only_ram = PodMeasures(ram_bytes=GI)  # no limit, no swap, no pressure reading: nothing short
    assert diagnose(only_ram, TH).diagnosis == "OK"
    # idle needs the utilisation; without it a hoarder is not called idle
    assert named(gpu_utilization_peak_percent=None, vram_bytes=79 * GI, vram_limit_bytes=None, devices=((79 * GI, None),)) == "OK"


def test_thresholds_are_policy_fields_with_defaults_and_their_reasons_name_the_numbers():
    spec = GPUMemoryPolicySpec.model_validate({"diagnosis": {"ramShortRatio": 0.5, "minSwap": "1Gi"}})
    th = spec.diagnosis
    assert (th.ram_short_ratio, th.min_swap_bytes(), th.vram_short_ratio, th.idle_seconds()) == (0.5, GI, 0.85, 1800)
    finding = diagnose(PodMeasures(**{**CALM, "ram_bytes": 16 * GI}), th)
    assert finding.diagnosis == "RAMShort" and finding.because == "RAM working set 16Gi is 50% of its limit 32Gi (from 50%)"
    assert diagnose(PodMeasures(**{**CALM, "swap_bytes": 512 * MI}), th).diagnosis == "OK"
    with pytest.raises(ValueError, match="ramShortRatio"):
        GPUMemoryPolicySpec.model_validate({"diagnosis": {"ramShortRatio": 1.5}})
    text = diagnosis_changed_text("w0", "OK", finding)
    assert text == "pod w0: RAMShort (was OK): RAM working set 16Gi is 50% of its limit 32Gi (from 50%)"
