"""kopf handlers of the vramguard operator: start-up, clean-up and the probe.

kopf runs the process (signals, logging, the liveness endpoint, the admission
webhooks of ``webhooks``); the watches are vramguard's own informers
(``watches``, ``informer``), started here with the reconcile thread, the
status writer and the shard Leases (``assembly.Operator``). No handler here
patches anything and none watches a resource, so kopf stores no progress or
diff-base annotations and adds no finalizers.

Run with ``vramguard operator`` (``runner``), or ``kopf run --standalone -m
vramguard_operator.controller.handlers`` (add ``-m
vramguard_operator.controller.webhooks`` for the admission webhooks):
importing this module registers every handler of the operator, the policy
status writer included, and its settings then come from the ``VRAMGUARD_*``
variables through the same table as the command's flags
(``settings.settings_from_env``; namespaces: ``VRAMGUARD_NAMESPACES``, since
kopf's own ``-n`` no longer limits vramguard's watches); the metrics server is
started here then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf

from vramguard_api.kube import api_client
from vramguard_operator.controller import policy_handlers  # noqa: F401  (registers the policy status writer)
from vramguard_operator.controller.assembly import Operator
from vramguard_operator.controller.metrics import process_metrics, serve_metrics
from vramguard_operator.controller.settings import OperatorSettings, settings_of

log = logging.getLogger("vramguard.handlers")

USER_AGENT = "vramguard-operator"


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings, explicit because the defaults do not suit this operator."""
    # kopf's own API calls (webhook configurations in managed mode): fail in
    # seconds, not the 5-minute aiohttp default.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    # vramguard posts its own Events (component vramguard); kopf's log-to-Event
    # posting would add noise on the objects.
    settings.posting.enabled = False
    # No peering: kopf's peering is a pause by priority, not leader election;
    # vramguard's shards (``shards``) are its own, on Leases.
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # No handler stores progress; should one be added, its state goes to
    # annotations under kopf.vramguard.io on the handled object.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.vramguard.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kopf.vramguard.io")
    settings.persistence.finalizer = "vramguard.io/kopf-finalizer"


def operator_settings(memo: kopf.Memo) -> OperatorSettings:
    """The operator's settings (``settings.settings_of``); a bad value in the
    environment stops the operator (``kopf.PermanentError``) with its message."""
    try:
        return settings_of(memo)
    except ValueError as err:
        raise kopf.PermanentError(str(err)) from None


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf, build the operator's parts and start them; evaluations
    begin once every watched collection is listed."""
    ours = operator_settings(memo)
    configure(settings)
    serve_metrics(ours.metrics_port, ours.metrics_address)  # once per process: kopf run has not yet
    api = await asyncio.to_thread(api_client)
    api.user_agent = USER_AGENT
    try:
        op = Operator(ours, api, process_metrics())
    except ValueError as err:
        raise kopf.PermanentError(str(err)) from None
    op.start()
    memo["operator"] = op
    log.info("vramguard operator started: %s", ours.config)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop deciding, writing and holding shards."""
    op: Operator | None = memo.get("operator")
    if op is not None:
        await asyncio.to_thread(op.stop)


@kopf.on.probe(id="evaluation")
async def evaluation_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """For /healthz: whether evaluations run, and how long ago the last one ended."""
    op: Operator | None = memo.get("operator")
    if op is None:
        return {"ready": False}
    rec = op.reconciler
    last = rec.last_evaluation
    age = None if last is None else round(time.monotonic() - last, 3)
    out: dict[str, Any] = {"ready": rec.ready.is_set(), "evaluations": rec.evaluations, "lastAgeSeconds": age}
    if op.shards is not None:
        out["shards"] = sorted(op.shards.held())
    return out
