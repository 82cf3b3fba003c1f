"""Label keys, values and selector requirements are validated as the core API
validates a LabelSelector (apimachinery's IsLabelKey/IsLabelValue and
ValidateLabelSelectorRequirement); the cases are apimachinery's own test
cases (content/kube_test.go) and the issue's."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from vramguard_api.labels import KEY_RULE, VALUE_RULE, is_label_key, is_label_value
from vramguard_api.meta import LabelSelector

VALID_KEYS = [
    "simple",
    "now-with-dashes",
    "1-starts-with-num",
    "1234",
    "simple/simple",
    "now-with-dashes/simple",
    "now-with-dashes/now-with-dashes",
    "now.with.dots/simple",
    "now-with.dashes-and.dots/simple",
    "1-num.2-num/3-num",
    "1234/5678",
    "1.2.3.4/5678",
    "Uppercase_Is_OK_123",
    "example.com/Uppercase_Is_OK_123",
    "requests.storage-foo",
    "a" * 63,
    "a" * 253 + "/" + "b" * 63,
]
INVALID_KEYS = [
    "nospecialchars%^=@",
    "cantendwithadash-",
    "-cantstartwithadash-",
    "only/one/slash",
    "Example.com/abc",
    "example_com/abc",
    "example.com/",
    "/simple",
    "a" * 64,
    "a" * 254 + "/abc",
    "",
    "a b",
    "-a",
    "a/",
    "ü",
]
VALID_VALUES = ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", "a" * 63, "", "A.b_c-D"]
INVALID_VALUES = [
    "nospecialchars%^=@",
    "Tama-nui-te-rā.is.Māori.sun",
    "\\backslashes\\are\\bad",
    "-starts-with-dash",
    "ends-with-dash-",
    ".starts.with.dot",
    "ends.with.dot.",
    "a" * 64,
    "x y",
    "x/y",
]


@pytest.mark.parametrize("key", VALID_KEYS)
def test_valid_keys(key):
    assert is_label_key(key)
    LabelSelector.model_validate({"matchLabels": {key: "v"}, "matchExpressions": [{"key": key, "operator": "Exists"}]})


@pytest.mark.parametrize("key", INVALID_KEYS)
def test_invalid_keys_are_refused_in_both_places_naming_the_key(key):
    assert not is_label_key(key)
    for doc, loc in (
        ({"matchLabels": {key: "v"}}, ("matchLabels",)),
        ({"matchExpressions": [{"key": key, "operator": "Exists"}]}, ("matchExpressions", 0, "key")),
    ):
        if loc[-1] == "key" and len(key) > 317:
            continue  # maxLength says so first
        with pytest.raises(ValidationError) as err:
            LabelSelector.model_validate(doc)
        (e,) = err.value.errors()
        assert e["loc"] == loc and e["msg"] == f'Value error, label key "{key}" {KEY_RULE}'


def test_a_huge_key_is_not_echoed():
    with pytest.raises(ValidationError) as err:
        LabelSelector.model_validate({"matchLabels": {"k" * 100_000: "v"}})
    assert "(100000 characters)" in str(err.value) and len(str(err.value)) < 1000


@pytest.mark.parametrize("value", VALID_VALUES)
def test_valid_values(value):
    assert is_label_value(value)
    LabelSelector.model_validate(
        {"matchLabels": {"k": value}, "matchExpressions": [{"key": "k", "operator": "In", "values": [value]}]}
    )


@pytest.mark.parametrize("value", INVALID_VALUES)
def test_invalid_values_are_refused_in_both_places(value):
    assert not is_label_value(value)
    for doc, loc in (
        ({"matchLabels": {"k": value}}, ("matchLabels", "k")),
        (
            {"matchExpressions": [{"key": "k", "operator": "In", "values": [value]}]},
            ("matchExpressions", 0, "values", 0),
        ),
    ):
        with pytest.raises(ValidationError) as err:
            LabelSelector.model_validate(doc)
        (e,) = err.value.errors()
        assert e["loc"] == loc
        assert e["msg"] == f'Value error, label value "{value}" {VALUE_RULE}' or "at most 63" in e["msg"]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ({"key": "k", "operator": "In"}, "values must be specified when operator is In (key k)"),
        ({"key": "k", "operator": "NotIn", "values": []}, "values must be specified when operator is NotIn (key k)"),
        (
            {"key": "k", "operator": "Exists", "values": ["v"]},
            "values may not be specified when operator is Exists (key k)",
        ),
        (
            {"key": "k", "operator": "DoesNotExist", "values": ["v"]},
            "values may not be specified when operator is DoesNotExist (key k)",
        ),
    ],
)
def test_operator_and_values(expr, message):
    with pytest.raises(ValidationError) as err:
        LabelSelector.model_validate({"matchExpressions": [expr]})
    assert err.value.errors()[0]["msg"] == f"Value error, {message}"
    # the empty list is no value at all, as the core API counts it
    LabelSelector.model_validate({"matchExpressions": [{"key": "k", "operator": "Exists", "values": []}]})


def test_too_many_match_labels():
    with pytest.raises(ValidationError, match="at most 64 items"):
        LabelSelector.model_validate({"matchLabels": {f"k{i}": "v" for i in range(65)}})
