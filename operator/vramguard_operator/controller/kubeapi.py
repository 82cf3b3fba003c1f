"""What every API call of the controller shares: the content types, the errors
a call can end with and their texts, JSON merge patches, and plain copies of
kopf bodies. Pure except for the error types' import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes.client.rest import ApiException

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

NETWORK_ERRORS: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)
"""Errors of a request that got no answer from the API server (connection
refused or reset, timeouts: urllib3's errors and ``OSError``, which covers
``socket.timeout``). The actions treat them as a 5xx: logged, counted
``failed``, retried by a later evaluation; never raised."""
API_ERRORS: tuple[type[Exception], ...] = (ApiException, *NETWORK_ERRORS)
"""A refusal by the API server (``ApiException``) or no answer at all."""

M = TypeVar("M")


def merge_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``current`` into ``desired``:
    changed keys with their new values (objects recursively), removed keys as
    ``None``; lists and scalars are replaced whole. Empty exactly when there
    is nothing to change, so the status writers write only when it is not."""
    cur = current or {}
    patch: dict[str, Any] = {k: None for k in cur if k not in desired}
    for key, want in desired.items():
        have = cur.get(key)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            sub = merge_patch(have, want)
            if sub:
                patch[key] = sub
        elif have != want or key not in cur:
            patch[key] = want
    return patch


def api_error_text(err: ApiException) -> str:
    """``"HTTP 422 Invalid: <message>"`` from an API error (its Status body when
    it has one)."""
    reason, message = err.reason or "", ""
    try:
        status = json.loads(err.body or "")
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict):
        reason = status.get("reason") or reason
        message = status.get("message") or ""
        causes = (status.get("details") or {}).get("causes") or ()
        extra = "; ".join(c.get("message", "") for c in causes if c.get("message"))
        if extra and extra not in message:
            message = f"{message} ({extra})" if message else extra
    text = f"HTTP {err.status} {reason}".strip()
    return f"{text}: {message}" if message else text


def error_text(err: Exception) -> str:
    """``api_error_text`` for an API error; ``"<type>: <message>"`` (cut to 300
    characters) for a network error."""
    if isinstance(err, ApiException):
        return api_error_text(err)
    return f"{type(err).__name__}: {err}"[:300]


def error_status(err: Exception) -> int | None:
    """The HTTP status of an API error; None for a request with no answer."""
    return err.status if isinstance(err, ApiException) else None


def to_model(cls: type[M], body: Mapping[str, Any]) -> M:
    """The kubernetes client's model of a request body (its typed API methods
    validate their arguments). Raises ``ValueError`` for an empty body."""
    model = cls.from_dict(dict(body))  # type: ignore[attr-defined]
    if model is None:
        raise ValueError(f"{cls.__name__}: empty body")
    return model


def response_json(resp: Any) -> dict[str, Any]:
    """The JSON object of a response read with ``_preload_content=False``
    (``{}`` when empty or not an object)."""
    data = json.loads(resp.data or b"{}")
    return data if isinstance(data, dict) else {}
