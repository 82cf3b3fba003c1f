"""Label keys and values, validated as the core API validates a LabelSelector
(apimachinery ``metav1/validation.ValidateLabelSelector``).

:func:`is_label_key` and :func:`is_label_value` decide as apimachinery's
``content.IsLabelKey`` (``IsQualifiedName``) and ``content.IsLabelValue``; the
CEL rules call those very functions in the API server through Kubernetes'
format library (``format.qualifiedName()``, ``format.labelValue()``). Both say
the same words: the API server refuses a message built from the library's list
of reasons (its estimated cost is unbounded), so the message names the key or
value and states the rule.
"""

from __future__ import annotations

import re
from typing import Any

from .bounds import cel_string

LABEL_KEY_MAX = 317
"""Longest label key: a 253-character DNS subdomain prefix, '/', a 63-character name."""
LABEL_VALUE_MAX = 63
"""Longest label value."""

# apimachinery's regular expressions (api/validate/content: kube.go, dns.go)
_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_NAME = re.compile(_NAME_FMT, re.ASCII)
_VALUE = re.compile(f"({_NAME_FMT})?", re.ASCII)
_DNS_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(_DNS_LABEL_FMT + r"(\." + _DNS_LABEL_FMT + ")*", re.ASCII)

KEY_FORM = (
    "an optional prefix (a lowercase DNS subdomain of at most 253 characters) and '/', then a name of 1 to 63 "
    "characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric (e.g. app, "
    "example.com/my-name)"
)
VALUE_FORM = (
    "empty, or at most 63 characters: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric "
    "(e.g. my-value, 1.0)"
)
KEY_RULE = "is not a valid label key: " + KEY_FORM
VALUE_RULE = "is not a valid label value: " + VALUE_FORM


def is_label_key(key: str) -> bool:
    """Whether ``key`` is a label key (a qualified name), as apimachinery's
    ``content.IsLabelKey`` decides (lengths count bytes, as Go's ``len`` does)."""
    parts = key.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix.encode()) > 253 or not _SUBDOMAIN.fullmatch(prefix):
            return False
    name = parts[-1]
    return 0 < len(name.encode()) <= 63 and _NAME.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a label value, as apimachinery's ``content.IsLabelValue`` decides."""
    return len(value.encode()) <= LABEL_VALUE_MAX and _VALUE.fullmatch(value) is not None


def _quoted(text: str) -> str:
    # A map key has no length bound of its own: never echo a huge one.
    return f'"{text}"' if len(text) <= LABEL_KEY_MAX else f'"{text[:60]}..." ({len(text)} characters)'


def key_problem(key: str) -> str | None:
    """The message for an invalid label key, as the CEL rules word it; None when valid."""
    return None if is_label_key(key) else f"label key {_quoted(key)} {KEY_RULE}"


def value_problem(value: str) -> str | None:
    """The message for an invalid label value, as the CEL rules word it; None when valid."""
    return None if is_label_value(value) else f"label value {_quoted(value)} {VALUE_RULE}"


def check_label_key(key: str) -> str:
    """Pydantic validator: ``key`` unchanged, or ``ValueError`` saying why it is not a label key."""
    problem = key_problem(key)
    if problem is not None:
        raise ValueError(problem)
    return key


def check_label_value(value: str) -> str:
    """Pydantic validator: ``value`` unchanged, or ``ValueError`` saying why it is not a label value."""
    problem = value_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _bad_key(k: str) -> str:
    # size() first: a longer key is invalid anyway, and validate() never runs on it
    return f"({k}.size() > {LABEL_KEY_MAX} || format.qualifiedName().validate({k}).hasValue())"


_KEY_TAIL = cel_string('" ' + KEY_RULE)
_VALUE_TAIL = cel_string('" ' + VALUE_RULE)

LABEL_KEY_RULES: list[Any] = [
    {
        "rule": f"!{_bad_key('self')}",
        "message": f"must be a valid label key: {KEY_FORM}",
        "messageExpression": f"'label key \"' + self + {_KEY_TAIL}",
    }
]
"""On a string field holding one label key (a requirement's key, maxLength 317)."""

MATCH_LABELS_KEY_RULES: list[Any] = [
    {
        "rule": f"!self.exists(k, {_bad_key('k')})",
        "message": f"every key must be a valid label key: {KEY_FORM}",
        "messageExpression": f"'label key \"' + self.filter(k, {_bad_key('k')})[0] + {_KEY_TAIL}",
    }
]
"""On a matchLabels map: every key (map keys have no schema of their own). The
message echoes the first bad key; a huge one exceeds its cost and "message" is used."""

LABEL_VALUE_RULES: list[Any] = [
    {
        "rule": "!format.labelValue().validate(self).hasValue()",
        "message": f"must be a valid label value: {VALUE_FORM}",
        "messageExpression": f"'label value \"' + self + {_VALUE_TAIL}",
    }
]
"""On a string field holding one label value (maxLength 63)."""

REQUIREMENT_RULES: list[Any] = [
    {
        "rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
        "message": "values must be specified when operator is In or NotIn",
        "messageExpression": "'values must be specified when operator is ' + self.operator + ' (key ' + self.key + ')'",
        "fieldPath": ".values",
    },
    {
        "rule": "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
        "message": "values may not be specified when operator is Exists or DoesNotExist",
        "messageExpression": "'values may not be specified when operator is ' + self.operator "
        "+ ' (key ' + self.key + ')'",
        "fieldPath": ".values",
    },
]
"""On a LabelSelectorRequirement: the operator decides whether values may be given."""


def requirement_problem(operator: str, values: list[str] | None, key: str) -> str | None:
    """The message REQUIREMENT_RULES give, or None."""
    if operator in ("In", "NotIn") and not values:
        return f"values must be specified when operator is {operator} (key {key})"
    if operator in ("Exists", "DoesNotExist") and values:
        return f"values may not be specified when operator is {operator} (key {key})"
    return None
