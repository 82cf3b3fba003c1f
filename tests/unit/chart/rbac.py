"""The pieces of the chart's RBAC proof (``tests/e2e/test_chart_e2e.py``): what
a rendered chart grants a ServiceAccount, what that ServiceAccount really asked
the API server for (read from the API server's audit log), and the comparison
of the two.

A permission is a ``Call``: API group, resource (``pods/eviction`` for a
subresource, as RBAC spells it) and verb. Audit events are the JSON lines of
the kube-apiserver's log backend, ``audit.k8s.io/v1`` ``Event`` objects
(https://kubernetes.io/docs/reference/config-api/apiserver-audit.v1/); their
``verb`` is the RBAC verb of the request (``get``, ``list``, ``watch``,
``create``, ``update``, ``patch``, ``delete``, ``deletecollection``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


@dataclass(frozen=True, order=True)
class Call:
    """One permission: ``group`` ("" for the core group), ``resource`` (plural,
    ``resource/subresource`` for a subresource) and ``verb``."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}" + (f" ({self.group})" if self.group else "")


def service_account(namespace: str, name: str) -> str:
    """The user name the API server gives a ServiceAccount's tokens."""
    return f"system:serviceaccount:{namespace}:{name}"


# --- what the chart grants --------------------------------------------------------------


def rules_of(role: Mapping[str, Any]) -> set[Call]:
    """Every ``Call`` a Role or ClusterRole's rules grant, expanded. Raises
    ``ValueError`` naming the role on a rule this proof cannot compare: a
    wildcard, ``resourceNames`` (a grant narrower than a resource) or
    ``nonResourceURLs``."""
    name = role.get("metadata", {}).get("name", "?")
    out: set[Call] = set()
    for rule in role.get("rules") or ():
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            raise ValueError(f"{role.get('kind')} {name}: rule {rule} names resources or URLs")
        calls = {Call(g, r, v) for g in rule.get("apiGroups", [""]) for r in rule.get("resources", [])
                 for v in rule["verbs"]}
        if any("*" in (c.group, c.resource, c.verb) for c in calls):
            raise ValueError(f"{role.get('kind')} {name}: rule {rule} uses '*'")
        out |= calls
    return out


def grants(objs: Iterable[Mapping[str, Any]], namespace: str, name: str) -> set[Call]:
    """What the rendered objects ``objs`` grant the ServiceAccount ``namespace``/``name``:
    the rules of every ClusterRole or Role that a ClusterRoleBinding or RoleBinding
    among ``objs`` binds to it (a RoleBinding's grants hold in its namespace only;
    this proof does not tell namespaces apart). Raises ``ValueError`` when a
    binding names a role that ``objs`` do not hold (a role from elsewhere cannot
    be proven) or a rule ``rules_of`` refuses."""
    objs = list(objs)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("ClusterRole", "Role")}
    out: set[Call] = set()
    for b in objs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                   and s.get("namespace", b["metadata"].get("namespace")) == namespace
                   for s in b.get("subjects") or ()):
            continue
        ref = b["roleRef"]
        key = (ref["kind"], None if ref["kind"] == "ClusterRole" else b["metadata"].get("namespace"), ref["name"])
        if key not in roles:
            raise ValueError(f"{b['kind']} {b['metadata']['name']} binds {ref['kind']} {ref['name']}, "
                             "which the chart does not hold")
        out |= rules_of(roles[key])
    return out


# --- what a ServiceAccount used -----------------------------------------------------------


def credential_id(token: str) -> str:
    """The credential id the API server records for a ServiceAccount token
    (``JTI=<the token's jti claim>``, user info extra ``authentication.kubernetes.io/credential-id``),
    which tells one token's requests apart from another's of the same account.
    Raises ``ValueError`` on a token that is not a JWT with a ``jti``."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return f"JTI={claims['jti']}"
    except (IndexError, ValueError, KeyError) as err:
        raise ValueError(f"not a ServiceAccount token with a jti claim: {err}") from err


@dataclass
class Usage:
    """What one account asked for: each ``Call`` with the HTTP codes it got,
    and the requests without a resource (discovery: ``/api``, ``/apis``, ``/version``)."""

    calls: dict[Call, set[int]] = field(default_factory=dict)
    non_resource: set[str] = field(default_factory=set)

    def denied(self) -> dict[Call, set[int]]:
        """The calls the API server refused with 403 Forbidden (RBAC or admission)."""
        return {c: codes for c, codes in self.calls.items() if 403 in codes}


def usage(events: Iterable[Mapping[str, Any]], username: str, credentials: Iterable[str] = ()) -> Usage:
    """The requests of ``username`` among audit ``events``; with ``credentials``,
    only those made with one of these credential ids (``credential_id``)."""
    wanted = set(credentials)
    out = Usage()
    for ev in events:
        user = ev.get("user") or {}
        if user.get("username") != username:
            continue
        if wanted and not wanted & set((user.get("extra") or {}).get(CREDENTIAL_ID) or ()):
            continue
        ref = ev.get("objectRef")
        if not ref or "resource" not in ref:
            out.non_resource.add(ev.get("requestURI", "").split("?")[0])
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        call = Call(ref.get("apiGroup", ""), resource, ev["verb"])
        code = (ev.get("responseStatus") or {}).get("code")
        out.calls.setdefault(call, set()).update({code} if code else set())
    return out


def read_events(path: Path, offset: int = 0) -> Iterator[dict[str, Any]]:
    """The audit events of a log-backend file from byte ``offset`` on (a line
    the API server is still writing is left out)."""
    with path.open("rb") as f:
        f.seek(offset)
        for line in f:
            if line.endswith(b"\n"):
                yield json.loads(line)


# --- the comparison ---------------------------------------------------------------------------


def compare(granted: set[Call], used: Usage, exceptions: Mapping[Call, str]) -> list[str]:
    """What is wrong with a grant, one sentence each; empty when the grant is
    exactly what was used, plus ``exceptions`` (calls that may go unused, each
    with its reason) — and nothing was refused:

    - granted but never used, and not an exception (an over-grant);
    - used but not granted (it must then have been refused);
    - refused with 403 (RBAC or an admission policy said no);
    - an exception that is not granted at all (the list went stale)."""
    problems = [f"granted but never used: {c}" for c in sorted(granted - set(used.calls) - set(exceptions))]
    problems += [f"used but not granted: {c} (HTTP {sorted(used.calls[c])})"
                 for c in sorted(set(used.calls) - granted)]
    problems += [f"refused (403): {c}" for c in sorted(used.denied())]
    problems += [f"exception for {c} ({why}) but the chart does not grant it"
                 for c, why in sorted(exceptions.items()) if c not in granted]
    return problems
