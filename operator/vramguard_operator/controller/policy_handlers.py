"""kopf handlers for policies and GPU sharing: thin.

- ``gpu_node_index``: GPU nodes by name (labels and allocatable resources: the
  GFD labels and device-plugin resources that shares come from);
- ``gpu_pod_index``: GPU pods by namespace, trimmed to what shares and implicit
  budgets read (other pods are not indexed);
- ``policy_status_index`` and a status writer started at startup: each
  GPUMemoryPolicy's status (namespaces it applies to, where a stricter policy
  wins), written only when it changes. Not a kopf timer: kopf puts a finalizer
  on the objects its timers serve, and a policy must stay deletable while the
  operator is down.

The indexes are read by the reconcile loop (implicit budgets) and by the
admission webhooks (``webhooks``).
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
from vramguard_operator.controller.index_views import namespaces_of
from vramguard_operator.controller.kubeapi import MERGE_PATCH, merge_patch, plain
from vramguard_operator.engine.budget_status import ConditionSpec, settle_conditions
from vramguard_operator.policy.implicit import ANNOTATION_LIMITS
from vramguard_operator.policy.merge import HELD, policy_status
from vramguard_operator.policy.sharers import grant_annotations, may_use_gpu

GPU_RESOURCE_PREFIXES = ("nvidia.com/", "aliyun.com/")
POLICY_STATUS_INTERVAL = 5.0  # seconds; a policy's namespaces change rarely

log = logging.getLogger("vramguard.policy")


# --- pure entries -------------------------------------------------------------------


def node_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A GPU node's labels and allocatable resources (None for other nodes, which
    are not indexed)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    alloc = dict(status.get("allocatable") or status.get("capacity") or {})
    labels = dict(meta.get("labels") or {})
    gpu = labels.get("nvidia.com/gpu.present") == "true" or any(
        r.startswith(GPU_RESOURCE_PREFIXES) for r in alloc
    )
    if not gpu:
        return None
    return {
        "metadata": {"name": meta.get("name"), "labels": labels},
        "status": {"allocatable": {k: str(v) for k, v in alloc.items()}},
    }


def gpu_pod_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A pod that may use a GPU (``sharers.may_use_gpu``), trimmed to what shares
    and grants read (None for other pods): metadata (name, namespace, uid,
    labels, the annotations grants are read from and ``vramguard.io/limits``),
    ``spec.nodeName``, ``spec.resourceClaims``, containers' names and resources,
    phase and the claims' names in its status."""
    if not may_use_gpu(body):
        return None
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    annotations = dict(meta.get("annotations") or {})
    kept = {**grant_annotations(annotations), **{k: v for k, v in annotations.items() if k == ANNOTATION_LIMITS}}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": kept,
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "resourceClaims": plain(spec.get("resourceClaims") or []),
            "containers": [
                {"name": c.get("name"), "resources": plain(c.get("resources") or {})}
                for c in spec.get("containers") or ()
            ],
        },
        "status": {
            "phase": status.get("phase"),
            "resourceClaimStatuses": plain(status.get("resourceClaimStatuses") or []),
            "extendedResourceClaimStatus": plain(status.get("extendedResourceClaimStatus")),
        },
    }


# --- handlers -----------------------------------------------------------------------


@kopf.index("nodes")
async def gpu_node_index(body: kopf.Body, name: str, **_: Any) -> dict[str, Any] | None:
    """GPU nodes by name."""
    entry = node_entry(body)
    return None if entry is None else {name: entry}


@kopf.index("pods")
async def gpu_pod_index(body: kopf.Body, namespace: str | None, **_: Any) -> dict[str, Any] | None:
    """GPU pods by namespace."""
    entry = gpu_pod_entry(body)
    return None if entry is None else {namespace or "": entry}


@kopf.index(GROUP, VERSION, POLICIES)
async def policy_status_index(body: kopf.Body, name: str, **_: Any) -> dict[str, Any]:
    """GPUMemoryPolicies by name, with generation and status (for the status writer)."""
    return {name: policy_body(body)}


def policy_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A policy trimmed to what its status is computed from."""
    data = plain(body)
    meta = data.get("metadata") or {}
    out = {k: data[k] for k in ("apiVersion", "kind", "spec", "status") if k in data}
    out["metadata"] = {k: meta.get(k) for k in ("name", "uid", "generation")}
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


async def _write_statuses(memo: kopf.Memo, policies: Any, namespaces: Any) -> None:
    # Wait until the indexes hold the initial listings: the reconciler (made by
    # handlers.operator_startup, whichever startup handler kopf runs first)
    # knows when they do.
    while (rec := memo.get("reconciler")) is None:
        await asyncio.sleep(0.05)
    await rec.ready.wait()
    api = await asyncio.to_thread(_api)
    while True:
        bodies = [b for store in policies.values() for b in store]
        patches = desired_statuses(bodies, namespaces_of(namespaces), datetime.now(UTC))
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
        await asyncio.sleep(POLICY_STATUS_INTERVAL)


@kopf.on.startup()
async def policy_status_startup(memo: kopf.Memo, **kwargs: Any) -> None:
    """Start the policy status writer: every few seconds, each policy's status
    is computed from the indexes and written when it differs. A loop of its own
    rather than a kopf timer, because kopf puts a finalizer on the objects its
    timers serve: a policy could not be deleted while the operator is down."""
    task = asyncio.create_task(
        _write_statuses(memo, kwargs["policy_status_index"], kwargs["namespace_index"]),
        name="vramguard-policy-status",
    )
    memo["policy_status_task"] = task


@kopf.on.cleanup()
async def policy_status_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the policy status writer."""
    task = memo.get("policy_status_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
