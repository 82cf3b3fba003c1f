"""meta/v1 LabelSelector matching, compiled once per selector.

Semantics (apimachinery ``metav1.LabelSelectorAsSelector``): ``matchLabels``
and ``matchExpressions`` are ANDed; ``In``: the label exists and its value is
one of ``values``; ``NotIn``: the label is absent or its value is not one of
``values``; ``Exists``/``DoesNotExist``: presence of the key. An empty selector
matches everything. (A nil selector, which matches nothing in the API, cannot
occur here: ``spec.selector`` is required.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from vramguard_api.meta import LabelSelector

Matcher = Callable[[Mapping[str, str]], bool]


def compile_selector(selector: LabelSelector, field: str = "spec.selector") -> Matcher:
    """Return a function ``labels -> bool`` equivalent to ``selector``.

    Raises ``ValueError`` naming ``field`` when an ``In``/``NotIn`` requirement
    has no values or an ``Exists``/``DoesNotExist`` requirement has some (the
    API server rejects both too).
    """
    required = dict(selector.match_labels or {})
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for i, req in enumerate(selector.match_expressions or ()):
        values = frozenset(req.values or ())
        where = f"{field}.matchExpressions[{i}]"
        if req.operator in ("In", "NotIn") and not values:
            raise ValueError(f"{where}: operator {req.operator} needs values (key {req.key!r})")
        if req.operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{where}: operator {req.operator} takes no values (key {req.key!r})")
        checks.append(_requirement(req.key, req.operator, values))
    items = tuple(required.items())

    def matches(labels: Mapping[str, str]) -> bool:
        for key, value in items:
            if labels.get(key) != value:
                return False
        return all(check(labels) for check in checks)

    return matches


def _requirement(key: str, operator: str, values: frozenset[str]) -> Callable[[Mapping[str, str]], bool]:
    if operator == "In":
        return lambda labels: key in labels and labels[key] in values
    if operator == "NotIn":
        return lambda labels: key not in labels or labels[key] not in values
    if operator == "Exists":
        return lambda labels: key in labels
    if operator == "DoesNotExist":
        return lambda labels: key not in labels
    raise ValueError(f"unknown label selector operator {operator!r}")
