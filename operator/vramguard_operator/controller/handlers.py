"""kopf handlers of the vramguard operator: thin.

Index handlers keep one parsed entry per object (``indexes``); event handlers
only wake the reconcile loop (``reconcile.Reconciler``), which evaluates and
acts. No handler here patches anything, and none is a change handler
(on.create/update/delete/resume), so kopf stores no progress or diff-base
annotations and adds no finalizers: pods, budgets and reports are read, never
marked by the framework. Every handler is ``async`` so that it runs on the
event loop at once instead of queuing for a worker thread (latency).

Run with ``vramguard operator`` (``runner``), or ``kopf run --standalone -m
vramguard_operator.controller.handlers`` (add ``-m
vramguard_operator.controller.webhooks`` for the admission webhooks): importing
this module registers every handler of the operator, the policy handlers
(implicit budgets, policy status) included, and its settings then come from the
``VRAMGUARD_*`` variables through the same table as the command's flags
(``settings.settings_from_env``); the metrics server is started here then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import kopf

from vramguard_api import BUDGETS, GROUP, POLICIES, REPORTS, VERSION
from vramguard_api.kube import api_client
from vramguard_operator.controller import (
    indexes,
    policy_handlers,  # noqa: F401  (registers the policy handlers)
)
from vramguard_operator.controller.allocation_entries import (
    CLAIMS,
    DRA_GROUP,
    DRA_VERSION,
    SLICES,
    claim_entry,
    slice_entry,
)
from vramguard_operator.controller.api_calls import KubeActions
from vramguard_operator.controller.applier import Applier
from vramguard_operator.controller.events import EventRecorder
from vramguard_operator.controller.metrics import process_metrics, serve_metrics
from vramguard_operator.controller.reconcile import Reconciler
from vramguard_operator.controller.settings import OperatorSettings, settings_of
from vramguard_operator.policy.ratelimit import EvictionLimiter

log = logging.getLogger("vramguard.handlers")

def configure(settings: kopf.OperatorSettings, watch_timeout: float) -> None:
    """kopf settings, explicit because the defaults do not suit this operator."""
    # Watches: without a server-side timeout an idle watch can hang silently on a
    # broken connection; a bounded one is re-established within watch_timeout.
    settings.watching.server_timeout = int(watch_timeout)  # the API wants whole seconds
    settings.watching.client_timeout = watch_timeout + 30
    settings.watching.connect_timeout = 10
    # kopf's own API calls (none from these handlers, but kopf may still make
    # some): fail in seconds, not the 5-minute aiohttp default.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    # vramguard posts its own Events (component vramguard); kopf's log-to-Event
    # posting would add noise on the objects.
    settings.posting.enabled = False
    # Standalone: one replica (the chart's Deployment uses Recreate); peering
    # would need extra RBAC and is not leader election anyway.
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # Scanning stays on (kopf's default): it serves namespace patterns (-n 'ml-*')
    # and CRDs installed after the operator started; it needs list/watch on
    # namespaces and CRDs, which namespace labels need anyway.
    # No change handlers exist, so kopf has no progress to store; should one be
    # added, its state goes to annotations under kopf.vramguard.io on the
    # handled object, never to pods' status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.vramguard.io"
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.vramguard.io"
    )
    # kopf puts a finalizer on objects served by timers or daemons (the policy
    # status timer's GPUMemoryPolicies; never pods): name it after vramguard.
    settings.persistence.finalizer = "vramguard.io/kopf-finalizer"


def operator_settings(memo: kopf.Memo) -> OperatorSettings:
    """The operator's settings (``settings.settings_of``); a bad value in the
    environment stops the operator (``kopf.PermanentError``) with its message."""
    try:
        return settings_of(memo)
    except ValueError as err:
        raise kopf.PermanentError(str(err)) from None


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """Configure kopf and start the reconcile loop (it waits for the indexes,
    which kopf passes to every handler under their handlers' names)."""
    ours = operator_settings(memo)
    cfg = ours.config
    configure(settings, ours.watch_timeout)
    serve_metrics(ours.metrics_port, ours.metrics_address)  # once per process: kopf run has not yet
    metrics = process_metrics()
    api = api_client()
    actions = KubeActions(api, timeout_seconds=cfg.request_timeout)
    limiter = EvictionLimiter(cfg.default_rate_limit, cfg.eviction_retry)
    recorder = EventRecorder(actions.core, timeout_seconds=cfg.request_timeout)
    applier = Applier(actions, recorder, limiter, metrics)
    reconciler = Reconciler(cfg, applier, metrics)

    def read() -> indexes.Snapshot:
        return indexes.snapshot_of(
            kwargs["budget_index"], kwargs["pod_index"], kwargs["report_index"],
            kwargs["policy_index"], kwargs["namespace_index"],
            gpu_pods=kwargs.get("gpu_pod_index"), gpu_nodes=kwargs.get("gpu_node_index"),
            claims=kwargs.get("claim_index"), slices=kwargs.get("slice_index"),
        )

    memo["reconciler"] = reconciler
    memo["reconcile_task"] = asyncio.create_task(reconciler.run(read), name="vramguard-reconcile")
    log.info("vramguard operator started: %s", cfg)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the reconcile loop."""
    task = memo.get("reconcile_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.probe(id="evaluation")
async def evaluation_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """For /healthz: whether evaluations run, and how long ago the last one ended."""
    rec: Reconciler | None = memo.get("reconciler")
    if rec is None:
        return {"ready": False}
    last = rec.last_evaluation
    age = None if last is None else round(time.monotonic() - last, 3)
    return {"ready": rec.ready.is_set(), "evaluations": rec.evaluations, "lastAgeSeconds": age}


# --- indexes ------------------------------------------------------------------------------


@kopf.index("pods")
async def pod_index(body: kopf.Body, namespace: str | None, **_: Any) -> dict[str, Any]:
    """Pods by namespace."""
    return {namespace or "": indexes.pod_entry(body)}


@kopf.index(GROUP, VERSION, BUDGETS)
async def budget_index(body: kopf.Body, namespace: str | None, **_: Any) -> dict[str, Any]:
    """GPUMemoryBudgets by namespace."""
    return {namespace or "": indexes.budget_entry(body)}


@kopf.index(GROUP, VERSION, REPORTS)
async def report_index(body: kopf.Body, **_: Any) -> dict[str, Any]:
    """NodeGPUUsage reports by node."""
    return {indexes.report_node(body): indexes.report_entry(body)}


@kopf.index(GROUP, VERSION, POLICIES)
async def policy_index(body: kopf.Body, name: str, **_: Any) -> dict[str, Any]:
    """GPUMemoryPolicies by name."""
    return {name: indexes.policy_entry(body)}


@kopf.index("namespaces")
async def namespace_index(body: kopf.Body, name: str, **_: Any) -> dict[str, Any]:
    """Namespace labels by name (for policies' namespaceSelector)."""
    return {name: indexes.namespace_entry(body)}


@kopf.index(DRA_GROUP, DRA_VERSION, CLAIMS)
async def claim_index(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[tuple[str, str], Any]:
    """ResourceClaims by (namespace, name), trimmed (``allocation_entries``)."""
    return {(namespace or "", name): claim_entry(body)}


@kopf.index(DRA_GROUP, DRA_VERSION, SLICES)
async def slice_index(body: kopf.Body, name: str, **_: Any) -> dict[str, Any]:
    """ResourceSlices by name, trimmed (``allocation_entries``)."""
    return {name: slice_entry(body)}


# --- events: wake the loop --------------------------------------------------------------
# kopf calls these only once every index holds the initial listing of every
# watched resource, so the first call of any of them means the view is complete.


def _wake(memo: kopf.Memo) -> None:
    rec: Reconciler | None = memo.get("reconciler")
    if rec is not None:
        rec.mark_ready()
        rec.trigger()


@kopf.on.event("pods")
async def pod_event(memo: kopf.Memo, **_: Any) -> None:
    """A pod changed: re-evaluate."""
    _wake(memo)


@kopf.on.event(GROUP, VERSION, BUDGETS)
async def budget_event(memo: kopf.Memo, **_: Any) -> None:
    """A budget changed: re-evaluate."""
    _wake(memo)


@kopf.on.event(GROUP, VERSION, REPORTS)
async def report_event(memo: kopf.Memo, **_: Any) -> None:
    """A node report arrived: re-evaluate at once (the latency target)."""
    _wake(memo)


@kopf.on.event(GROUP, VERSION, POLICIES)
async def policy_event(memo: kopf.Memo, **_: Any) -> None:
    """A policy changed: re-evaluate."""
    _wake(memo)


@kopf.on.event("namespaces")
async def namespace_event(memo: kopf.Memo, **_: Any) -> None:
    """A namespace changed (labels select policies): re-evaluate."""
    _wake(memo)


@kopf.on.event(DRA_GROUP, DRA_VERSION, CLAIMS)
async def claim_event(memo: kopf.Memo, **_: Any) -> None:
    """A ResourceClaim changed (allocated, shared, released): re-evaluate."""
    _wake(memo)


@kopf.on.event(DRA_GROUP, DRA_VERSION, SLICES)
async def slice_event(memo: kopf.Memo, **_: Any) -> None:
    """A ResourceSlice changed (a device published or withdrawn): re-evaluate."""
    _wake(memo)
