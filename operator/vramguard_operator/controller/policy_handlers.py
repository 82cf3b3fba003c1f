"""The GPUMemoryPolicy status writer: each policy's status (the namespaces it
applies to, where a stricter policy wins), computed from the watched policies
and namespaces (``watches``) and written only when it changes. Not a kopf
timer: kopf puts a finalizer on the objects its timers serve, and a policy
must stay deletable while the operator is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from vramguard_api import GROUP, POLICIES, VERSION
from vramguard_api import conditions as C
from vramguard_api.kube import api_client
from vramguard_api.policy import GPUMemoryPolicy, GPUMemoryPolicyStatus
from vramguard_operator.controller.kubeapi import MERGE_PATCH, merge_patch
from vramguard_operator.engine.budget_status import ConditionSpec, settle_conditions
from vramguard_operator.plan.entries import plain
from vramguard_operator.plan.index_views import namespaces_of
from vramguard_operator.policy.merge import HELD, policy_status

POLICY_STATUS_INTERVAL = 5.0  # seconds; a policy's namespaces change rarely

log = logging.getLogger("vramguard.policy")


def policy_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A policy trimmed to what its status is computed from."""
    data = plain(body)
    meta = data.get("metadata") or {}
    out = {k: data[k] for k in ("apiVersion", "kind", "spec", "status") if k in data}
    out["metadata"] = {k: meta.get(k) for k in ("name", "uid", "generation", "resourceVersion")}
    return out


def desired_statuses(
    bodies: list[Mapping[str, Any]], namespaces: Mapping[str, Mapping[str, str]], now: datetime
) -> dict[str, dict[str, Any]]:
    """Status merge patches by policy name, for the policies whose status differs
    from the desired one. A policy that does not parse gets Ready=False with
    reason InvalidSpec naming the field (it holds every namespace in DryRun)."""
    parsed: list[tuple[GPUMemoryPolicy, Mapping[str, Any]]] = []
    out = {}
    for body in bodies:
        try:
            parsed.append((GPUMemoryPolicy.model_validate(body), body))
        except ValidationError as err:
            name, patch = invalid_status_patch(body, err, now)
            if patch:
                out[name] = patch
    every = [p for p, _ in parsed]
    for policy, body in parsed:
        desired = policy_status(policy, every, namespaces, now).to_api()
        patch = merge_patch(body.get("status"), desired)
        if patch:
            out[policy.metadata.name or ""] = patch
    return out


def invalid_status_patch(
    body: Mapping[str, Any], err: ValidationError, now: datetime
) -> tuple[str, dict[str, Any]]:
    """The policy's name and the status patch of a policy whose spec does not
    parse: Ready=False, reason InvalidSpec, the first error with its field."""
    meta = body.get("metadata") or {}
    name, gen = str(meta.get("name") or ""), meta.get("generation")
    first = err.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "spec"
    text = f"GPUMemoryPolicy {name}: {where}: {first['msg']}"
    previous = None
    with contextlib.suppress(ValidationError, TypeError):
        previous = GPUMemoryPolicyStatus.model_validate(body.get("status") or {}).conditions
    wanted = [ConditionSpec(C.READY, "False", C.REASON_INVALID_SPEC, f"{text}; {HELD}")]
    desired = GPUMemoryPolicyStatus(
        observedGeneration=gen,
        conditions=settle_conditions(wanted, previous, gen, now),
        matchedNamespaces=0,
    ).to_api()
    patch = merge_patch(body.get("status"), desired)
    if patch:  # logged when the status changes, not on every pass
        log.warning("%s; %s", text, HELD)
    return name, patch


def _api() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client())


async def _write_statuses(memo: kopf.Memo) -> None:
    # Wait until the watches hold the initial listings (the reconciler knows).
    while (op := memo.get("operator")) is None:
        await asyncio.sleep(0.05)
    while not op.reconciler.ready.is_set():
        await asyncio.sleep(0.2)
    api = await asyncio.to_thread(_api)
    while True:
        if op.leads():  # one replica writes them (with shards: the holder of shard 0)
            await _write_once(api, op)
        await asyncio.sleep(POLICY_STATUS_INTERVAL)


async def _write_once(api: client.CustomObjectsApi, op: Any) -> None:
    bodies = list(op.store("policies").values())
    patches = desired_statuses(bodies, namespaces_of(op.store("namespaces")), datetime.now(UTC))
    for name, patch in patches.items():
        try:
            await asyncio.to_thread(
                api.patch_cluster_custom_object_status,
                GROUP, VERSION, POLICIES, name, {"status": patch},
                _content_type=MERGE_PATCH,
            )
        except ApiException as err:
            if err.status != 404:  # a deleted policy needs no status
                log.warning("status of GPUMemoryPolicy %s: %s %s", name, err.status, err.reason)


@kopf.on.startup()
async def policy_status_startup(memo: kopf.Memo, **_: Any) -> None:
    """Start the policy status writer: every few seconds, each policy's status
    is computed from the watched policies and namespaces and written when it
    differs. A loop of its own rather than a kopf timer, because kopf puts a
    finalizer on the objects its timers serve: a policy could not be deleted
    while the operator is down."""
    memo["policy_status_task"] = asyncio.create_task(_write_statuses(memo), name="vramguard-policy-status")


@kopf.on.cleanup()
async def policy_status_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the policy status writer."""
    task = memo.get("policy_status_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
