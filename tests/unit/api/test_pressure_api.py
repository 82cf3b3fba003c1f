"""``devicePressure`` in the API: ``minFree`` as a percentage in (0, 50] or a
quantity within the memory bounds, the same verdict from the models and from
the CRD's CEL rules, and the field in policies and budgets."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from vramguard_api import crdgen
from vramguard_api.budget import GPUMemoryBudget
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_api.pressure import (
    _OVER_FIFTY,
    _ZERO_PERCENT,
    MIN_FREE_PATTERN,
    PERCENT_PATTERN,
    DevicePressure,
    min_free_problem,
)

GI = 1 << 30


@pytest.mark.parametrize("value", ["5%", "0.5%", "0.001%", "50%", "50.000%", "050%", "4Gi", "1Mi", "8Pi", "5e9"])
def test_accepted(value: str) -> None:
    assert min_free_problem(value) is None
    assert DevicePressure(minFree=value).min_free == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0%", "0% must be above 0%"),
        ("0.000%", "0.000% must be above 0%"),
        ("50.001%", "50.001% is above the maximum of 50%: keeping more free idles the device"),
        ("100%", "100% is above the maximum of 50%: keeping more free idles the device"),
        ("5.1234%", "should match pattern"),
        ("10m", "10m is below the minimum of 1Mi"),
        ("9Pi", "9Pi is above the maximum of 8Pi"),
    ],
)
def test_refused_with_the_value_and_the_bound(value: str, message: str) -> None:
    with pytest.raises(ValidationError) as err:
        GPUMemoryPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"devicePressure": {"minFree": value}}})
    [e] = err.value.errors()
    assert e["loc"] == ("spec", "devicePressure", "minFree")
    assert message in e["msg"]


def test_conversions_and_defaults() -> None:
    dp = DevicePressure()
    assert (dp.min_free, dp.action, dp.protect_shares) == ("5%", "Evict", True)
    assert not DevicePressure(protectShares=False).protect_shares
    assert dp.min_free_fraction() == 0.05 and dp.min_free_bytes() is None
    q = DevicePressure(minFree="4Gi")
    assert q.min_free_fraction() is None and q.min_free_bytes() == 4 * GI
    assert DevicePressure(minFree="2.5%").min_free_fraction() == 0.025


def test_in_policies_and_budgets() -> None:
    p = GPUMemoryPolicy.model_validate({"metadata": {"name": "p"}, "spec": {"devicePressure": {}}})
    assert p.spec.device_pressure == DevicePressure()
    b = GPUMemoryBudget.model_validate(
        {
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {
                "selector": {},
                "limits": {"perDevice": {"fraction": 0.25}},
                "devicePressure": {"minFree": "10%"},
            },
        }
    )
    assert b.spec.device_pressure is not None and b.spec.device_pressure.min_free_fraction() == 0.1
    with pytest.raises(ValidationError):
        DevicePressure.model_validate({"action": "Throttle"})


def test_the_crds_carry_the_pattern_and_the_rules() -> None:
    for res in crdgen.RESOURCES[:2]:  # budgets and policies
        schema = crdgen.crd(res)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        node = schema["properties"]["spec"]["properties"]["devicePressure"]["properties"]["minFree"]
        assert node["pattern"] == MIN_FREE_PATTERN and node["maxLength"] == 64
        rules = [r["rule"] for r in node["x-kubernetes-validations"]]
        assert len(rules) == 4 and sum("compareTo" in r for r in rules) == 2
        assert node["default"] == "5%"


percent_text = st.builds(
    lambda zeros, whole, frac: f"{'0' * zeros}{whole}{frac}%",
    st.integers(0, 2),
    st.integers(0, 999),
    st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=3).map(lambda d: "." + d)),
).filter(lambda t: re.fullmatch(PERCENT_PATTERN, t) is not None)


@given(percent_text)
@example("50%")
@example("50.000%")
@example("50.001%")
@example("0.001%")
@example("0%")
@example("00.0%")
def test_the_cel_rules_and_the_model_agree_on_every_percentage(text: str) -> None:
    """CEL's ``matches`` is a regex search; the model decides on the decimal."""
    value = Decimal(text[:-1])
    assert (re.search(_ZERO_PERCENT, text) is not None) == (value == 0)
    assert (re.search(_OVER_FIFTY, text) is not None) == (value > 50)
    assert (min_free_problem(text) is None) == (0 < value <= 50)
