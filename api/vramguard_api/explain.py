"""One-line explanations of bad input, shared by every command, the webhooks
and the operator's status conditions: the field, the value, what is wanted,
and a hint where one is likely.

- ``units.quantity_hint("20GB")`` -> ``write 20G (10^9 bytes) or 20Gi (2^30 bytes)``:
  the mistakes people make with Kubernetes quantities (a ``B``, a space,
  lower case, a sign), also in every quantity flag's message;
- ``closest(name, known)``: the nearest known name to a typo (difflib's
  ratio, as Python's own "did you mean" uses a similar edit distance);
- ``validation_error(err, model)``: a pydantic ``ValidationError`` as one
  line, preferring an unknown key (with the closest known one) over the
  "Field required" it causes, and replacing a pattern's regular expression
  with what the pattern means.

Pure (pydantic only); no kopf, no I/O.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from .units import DURATION_PATTERN, QUANTITY_PATTERN, quantity_hint

_WANT_QUANTITY = "want a Kubernetes quantity such as 40Gi, 512Mi or 20G"
_WANT_DURATION = "want a Go duration such as 30s, 10m or 1h30m"


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name nearest to ``name`` (difflib ratio at least 0.6), or None."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def _pattern_want(pattern: str, value: Any) -> str:
    """What a pattern stands for, in words, with a hint for ``value``."""
    if pattern == QUANTITY_PATTERN:
        hint = quantity_hint(str(value))
        return _WANT_QUANTITY + (f"; {hint}" if hint else "")
    if pattern == DURATION_PATTERN:
        hint = f"; write {value}s or {value}m" if re.fullmatch(r"[0-9]+(\.[0-9]+)?", str(value)) else ""
        return _WANT_DURATION + hint
    return f"want text matching {pattern}"


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _schema_at(schema: dict[str, Any], loc: Sequence[Any]) -> dict[str, Any] | None:
    """The JSON Schema node at ``loc`` (aliases, list indices), $refs and Optionals resolved."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while True:
            if "$ref" in node:
                node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
            elif "anyOf" in node:
                typed = [n for n in node["anyOf"] if n.get("type") != "null"]
                node = typed[0] if len(typed) == 1 else node
                if len(typed) != 1:
                    return node
            else:
                return node

    node = resolve(schema)
    for part in loc:
        if isinstance(part, int):
            node = resolve(node.get("items", {}))
        elif part in node.get("properties", {}):
            node = resolve(node["properties"][part])
        elif isinstance(node.get("additionalProperties"), dict):
            node = resolve(node["additionalProperties"])
        else:
            return None
    return node


def _what(e: dict[str, Any], schema: dict[str, Any]) -> str:
    """One pydantic error as ``value: what is wanted[; hint]`` (without its path)."""
    loc, kind, value = e["loc"], e["type"], e.get("input")
    if kind == "extra_forbidden":
        parent = _schema_at(schema, loc[:-1]) or {}
        near = closest(str(loc[-1]), parent.get("properties", {}))
        known = ", ".join(sorted(parent.get("properties", {})))
        return "unknown field" + (f"; did you mean {near}?" if near else f" (known: {known})")
    node = _schema_at(schema, loc) or {}
    pattern = node.get("pattern")
    if kind == "string_pattern_mismatch" and pattern is not None:
        return f"{value!r}: {_pattern_want(pattern, value)}"
    if kind == "string_type" and pattern is not None and isinstance(value, int | float):
        return f"{value!r} is a number, not a string: {_pattern_want(pattern, value)}"
    if kind == "missing":
        return "required field missing"
    shown = "" if value is None or isinstance(value, dict | list) else f"{value!r}: "
    if kind in ("literal_error", "enum"):
        names = re.findall(r"'([^']*)'", str((e.get("ctx") or {}).get("expected", "")))
        near = closest(str(value), names) or closest(str(value).lower(), {n.lower(): n for n in names})
        hint = f"; did you mean {near}?" if near else ""
        return f"{shown}want one of {', '.join(names)}{hint}"
    return f"{shown}{str(e['msg']).removeprefix('Value error, ')}"


def explain_errors(err: ValidationError, model: type[BaseModel]) -> list[tuple[str, str, Any]]:
    """Every error of a pydantic ``ValidationError`` on ``model`` as (path, what is wrong with a
    hint, the value given), unknown keys first, without the "required" error a typo of a known
    key also causes."""
    errors: list[dict[str, Any]] = [dict(e) for e in err.errors(include_url=False)]
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    schema = model.model_json_schema(by_alias=True)
    typos = set()
    for e in errors:
        if e["type"] == "extra_forbidden":
            parent = (_schema_at(schema, e["loc"][:-1]) or {}).get("properties", {})
            typos.add((*e["loc"][:-1], closest(str(e["loc"][-1]), parent)))
    kept = [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in typos)]
    return [(_path(e["loc"]) or "(top)", _what(e, schema), e.get("input")) for e in kept]


def validation_error(err: ValidationError, model: type[BaseModel]) -> str:
    """A pydantic error on ``model`` as one line naming the field, the value and what is
    wanted. An unknown key comes first (a typo such as ``limts`` also makes ``limits``
    "required"); pydantic's documentation links are never shown."""
    errors = explain_errors(err, model)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{errors[0][0]}: {errors[0][1]}{more}"
