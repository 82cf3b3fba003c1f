"""Which pods ``vramguard top`` shows and in what order (pure): ``-l`` (a
label selector in kubectl's syntax) and ``--sort-by`` (column names).

``-l`` takes the string syntax of apimachinery's ``labels.Parse`` (the one
``kubectl get -l`` takes): requirements separated by commas, each ``key``
(exists), ``!key`` (does not exist), ``key=value`` or ``key==value``,
``key!=value`` (absent or another value), ``key in (a,b)``, ``key notin (a,b)``.
It becomes a meta/v1 ``LabelSelector`` (the API's own validation of keys and
values) matched by ``engine.selectors.compile_selector``, the operator's
matcher. The set-based ``key>1``/``key<1`` of node selectors is refused.

The selector is applied to the rows, not to the list call: a budget's total
limits are over every pod it selects, so every pod is read and the table
keeps the matching ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from vramguard_api.explain import closest, validation_error
from vramguard_api.meta import LabelSelector
from vramguard_operator.cli.top.model import STATES, Row
from vramguard_operator.engine.selectors import Matcher, compile_selector

_KEY = r"[^\s=!(),<>]+"
_VALUE = r"[^\s=!(),<>]*"
_FORMS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], dict[str, Any]]], ...] = (
    (re.compile(rf"!\s*({_KEY})"), lambda m: {"key": m[1], "operator": "DoesNotExist"}),
    (re.compile(rf"({_KEY})\s*(==|=)\s*({_VALUE})"), lambda m: {"key": m[1], "operator": "In", "values": [m[3]]}),
    (re.compile(rf"({_KEY})\s*!=\s*({_VALUE})"), lambda m: {"key": m[1], "operator": "NotIn", "values": [m[2]]}),
    (re.compile(rf"({_KEY})\s+(in|notin)\s*\(([^()]*)\)"),
     lambda m: {"key": m[1], "operator": "In" if m[2] == "in" else "NotIn",
                "values": [v.strip() for v in m[3].split(",")]}),
    (re.compile(rf"({_KEY})"), lambda m: {"key": m[1], "operator": "Exists"}),
)
_WANT = "want key, !key, key=value, key!=value, key in (a,b) or key notin (a,b), separated by commas"


def _requirements(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _expression(requirement: str) -> dict[str, Any] | None:
    """A ``matchExpressions`` item in API form for one requirement, None when no form fits."""
    for form, build in _FORMS:
        if match := form.fullmatch(requirement):
            return build(match)
    return None


def parse_label_selector(text: str, field: str = "--selector") -> LabelSelector:
    """The ``LabelSelector`` a kubectl-style selector string stands for (all
    requirements as ``matchExpressions``); ``""`` matches every pod. Raises
    ``ValueError`` naming ``field``, the requirement and what is wanted."""
    if not text.strip():
        return LabelSelector()
    expressions = []
    for part in _requirements(text):
        expression = _expression(part.strip())
        if expression is None:
            raise ValueError(f"{field}: cannot parse {part.strip()!r} in {text!r}; {_WANT}")
        expressions.append(expression)
    try:
        return LabelSelector.model_validate({"matchExpressions": expressions})
    except ValidationError as err:
        raise ValueError(f"{field}: {text!r}: {validation_error(err, LabelSelector)}") from None


def pod_matcher(text: str | None) -> Matcher:
    """A function ``labels -> bool`` for ``-l TEXT`` (None: every pod). Raises
    ``ValueError`` as ``parse_label_selector`` does."""
    if text is None:
        return lambda labels: True
    return compile_selector(parse_label_selector(text), field="--selector")


def select_rows(rows: Sequence[Row], pods: Sequence[Mapping[str, Any]], matches: Matcher) -> list[Row]:
    """The rows whose pod (by namespace and name, in ``pods``, API form) has labels ``matches`` holds for."""
    labels = {(m.get("namespace"), m.get("name")): m.get("labels") or {}
              for m in ((p.get("metadata") or {}) for p in pods)}
    return [r for r in rows if matches(labels.get((r.namespace, r.pod), {}))]


@dataclass(frozen=True, slots=True)
class SortColumn:
    """A column ``--sort-by`` takes: the value a row is ordered by (None: unknown,
    always last) and whether larger values come first (numbers, like ``kubectl
    top --sort-by``), else the text in ascending order."""

    value: Callable[[Row], Any]
    descending: bool


_SEVERITY = {s: len(STATES) - i for i, s in enumerate(STATES)}

SORT_COLUMNS: dict[str, SortColumn] = {
    "namespace": SortColumn(lambda r: r.namespace, False),
    "pod": SortColumn(lambda r: r.pod, False),
    "node": SortColumn(lambda r: r.node, False),
    "vram": SortColumn(lambda r: r.vram_bytes, True),
    "ram": SortColumn(lambda r: r.ram_bytes, True),
    "limit": SortColumn(lambda r: r.binding.limit_bytes if r.binding else None, True),
    "source": SortColumn(lambda r: r.binding.source if r.binding else None, False),
    "use": SortColumn(lambda r: r.pressure, True),
    "trend": SortColumn(lambda r: r.growth_bytes_per_hour, True),
    "state": SortColumn(lambda r: _SEVERITY[r.state], True),
    "diagnosis": SortColumn(lambda r: r.diagnosis, False),
}
"""The columns of the table ``--sort-by`` orders by, by their lower-case header."""


def parse_sort_by(text: str, field: str = "--sort-by") -> tuple[str, ...]:
    """Column names from ``name[,name...]`` (any case; a leading ``-`` reverses
    that column's order), checked against ``SORT_COLUMNS``. Raises
    ``ValueError`` naming ``field``, the unknown name, the closest known one
    and every valid one."""
    names = tuple(n.strip().lower() for n in text.split(","))
    for name in names:
        if name.removeprefix("-") not in SORT_COLUMNS:
            near = closest(name.removeprefix("-"), SORT_COLUMNS)
            hint = f" (did you mean {near}?)" if near else ""
            raise ValueError(f"{field}: unknown column {name!r}{hint}; want one or more of "
                             f"{', '.join(SORT_COLUMNS)}, separated by commas")
    return names


def sort_rows(rows: Sequence[Row], by: Sequence[str]) -> list[Row]:
    """``rows`` ordered by the columns ``by`` (names ``parse_sort_by`` gave), the
    first deciding; ties keep the default order (``Row.sort_key``). Unknown
    values go last whatever the direction."""
    out = sorted(rows, key=Row.sort_key)
    for name in reversed(by):  # stable sorts, least significant first
        column = SORT_COLUMNS[name.removeprefix("-")]
        descending = column.descending != name.startswith("-")
        known = [r for r in out if column.value(r) is not None]
        known.sort(key=column.value, reverse=descending)  # reverse=True stays stable
        out = known + [r for r in out if column.value(r) is None]
    return out
