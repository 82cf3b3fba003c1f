"""Admission webhooks (kopf), thin adapters over the pure checks.

- ``validate-budget`` (GPUMemoryBudget CREATE/UPDATE, failurePolicy Fail):
  rejects a budget above its policies' ceilings (``validation.check_budget``);
  warnings (a ceiling that applies to a level the budget leaves unset, units
  that cannot be compared) go back to the client.
- ``validate-pod`` (Pod CREATE, failurePolicy Ignore): rejects a new pod of a
  job whose total budget is throttled (``validation.validate_pod``).
- ``mutate-pod`` (Pod CREATE, failurePolicy Ignore): where a policy opts in
  (``injectFrameworkCaps``), injects framework memory caps into GPU pods
  (``mutation``).

The ids are the URL paths the Helm chart's webhook configurations call
(``/validate-budget``, ``/validate-pod``, ``/mutate-pod``). Pod webhooks use
failurePolicy Ignore so that an operator outage never blocks pod creation.

Two ways to run (``WebhookConfig``):

- in the cluster (the chart): the chart owns the webhook configurations, and
  the TLS files come from a mounted Secret (the chart's, or cert-manager's);
- managed (``managed=True``, for development and the end-to-end tests): kopf
  creates and maintains ``ValidatingWebhookConfiguration`` and
  ``MutatingWebhookConfiguration`` ``vramguard.io`` pointing at ``host:port``,
  with a CA and certificate generated into the TLS directory (``certs``).

The handlers read the operator's watched objects (``watches``: policies,
namespaces, budgets, reports, GPU nodes) through copies of the informers'
stores (``assembly.Operator.store``). The mutating webhook also labels every
GPU pod ``vramguard.io/gpu-pod: "true"``, the label the operator's pod watch
selects (docs/operator.md, "Which pods are watched").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import jsonpatch
import kopf

from vramguard_api import BUDGETS, GROUP, VERSION
from vramguard_operator.controller import handlers  # noqa: F401  (registers the parts read here)
from vramguard_operator.controller.certs import TLSFiles, ensure_certificates
from vramguard_operator.controller.handlers import operator_settings
from vramguard_operator.controller.settings import WebhookConfig
from vramguard_operator.plan.entries import plain
from vramguard_operator.plan.index_views import budgets_of, labels_of, nodes_of, policies_of
from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.mutation import admission_limit, gpu_pod_label_ops, mutate_pod
from vramguard_operator.policy.request import PodGPURequest
from vramguard_operator.policy.sharers import may_use_gpu
from vramguard_operator.policy.shares import candidate_nodes
from vramguard_operator.policy.termination import termination_message_ops
from vramguard_operator.policy.validation import check_budget, format_errors, throttled_jobs, validate_pod

MANAGED_NAME = "vramguard.io"

log = logging.getLogger("vramguard.webhooks")


def configure_admission(settings: kopf.OperatorSettings, cfg: WebhookConfig) -> TLSFiles:
    """Point kopf's admission server at ``cfg``: the TLS files (generated when
    the directory is vramguard's, read when it is cert-manager's or the
    chart's), and managed webhook configurations when ``cfg.managed``."""
    tls = ensure_certificates(cfg.tls_dir, cfg.hosts())
    settings.admission.server = kopf.WebhookServer(
        addr=cfg.addr,
        port=cfg.port,
        host=cfg.host,
        certfile=str(tls.cert),
        pkeyfile=str(tls.key),
        cafile=None if tls.ca is None else str(tls.ca),
    )
    settings.admission.managed = MANAGED_NAME if cfg.managed else None
    how = "generated" if tls.issued else ("kept" if tls.managed else "read")
    log.info(
        "webhooks on https://%s:%d (certificate %s in %s; configurations %s)",
        cfg.host, cfg.port, how, cfg.tls_dir, "managed by kopf" if cfg.managed else "external",
    )
    return tls


@kopf.on.startup()
async def webhook_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure the admission server from the operator's settings
    (``--webhook-port`` and the ``VRAMGUARD_WEBHOOK_*`` variables). Without a
    port, kopf refuses to start (its admission handlers need a server)."""
    cfg = operator_settings(memo).webhook
    if cfg is None:
        log.error("admission webhooks are loaded but not configured: set VRAMGUARD_WEBHOOK_PORT")
        return
    configure_admission(settings, cfg)


# --- handlers -------------------------------------------------------------------------


@kopf.on.validate(GROUP, VERSION, BUDGETS, id="validate-budget", operations=["CREATE", "UPDATE"])
async def validate_budget_webhook(
    body: kopf.Body,
    warnings: list[str],
    memo: kopf.Memo,
    old: kopf.Body | None = None,
    **_: Any,
) -> None:
    """Reject a budget above its policies' ceilings (an UPDATE that leaves the
    spec as it was is admitted, with the same warnings)."""
    obj = plain(body)
    ns = (obj.get("metadata") or {}).get("namespace") or ""
    result = check_budget(obj, policies_of(_store(memo, "policies")), labels_of(_store(memo, "namespaces"), ns))
    warnings.extend(result.warnings)
    unchanged = old is not None and plain(old).get("spec") == obj.get("spec")
    if result.errors and not unchanged:
        name = (obj.get("metadata") or {}).get("name") or ""
        raise kopf.AdmissionError(format_errors("GPUMemoryBudget", name, result.errors), code=422)


@kopf.on.validate("pods", id="validate-pod", operations=["CREATE"], ignore_failures=True)
async def validate_pod_webhook(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Reject a new pod of a job whose total budget is throttled."""
    pod = plain(body)
    ns = (pod.get("metadata") or {}).get("namespace") or ""
    merged = merge(policies_of(_store(memo, "policies")), ns, labels_of(_store(memo, "namespaces"), ns))
    if merged.exempt:
        return
    reason = validate_pod(pod, throttled_jobs(budgets_of(_store(memo, "budgets"), ns)))
    if reason is not None:
        raise kopf.AdmissionError(reason, code=403)


def _apply_ops(ops: list[dict[str, Any]], raw: Any) -> None:
    jsonpatch.JsonPatch(ops).apply(raw, in_place=True)


@kopf.on.mutate("pods", id="mutate-pod", operations=["CREATE"], ignore_failures=True)
async def mutate_pod_webhook(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Label a GPU pod for the operator's pod watch, and inject framework
    memory caps into it where a policy opts in."""
    pod = plain(body)
    if not may_use_gpu(pod):  # GPU resources, a sharer's annotations or a ResourceClaim
        return
    req = PodGPURequest.from_api(pod)
    ops = gpu_pod_label_ops(pod)
    ns = (pod.get("metadata") or {}).get("namespace") or ""
    merged = merge(policies_of(_store(memo, "policies")), ns, labels_of(_store(memo, "namespaces"), ns))
    record = None
    fallback = merged.termination_message_fallback
    if not merged.exempt and req.is_gpu_pod and (fallback is None or fallback.value):  # docs/oom.md
        ops += termination_message_ops(pod, req.gpu_containers)
    if not merged.exempt and merged.inject_framework_caps is not None and req.is_gpu_pod:
        nodes = candidate_nodes(pod, nodes_of(_store(memo, "nodes"), _store(memo, "reports")))
        limit, facts = admission_limit(req, nodes, merged)
        caps, record = mutate_pod(pod, limit, facts, req.gpu_containers)
        ops += caps
    if ops:
        patch.fns.append(functools.partial(_apply_ops, ops))
    if record is not None:
        log.info("pod %s/%s: injected %s", ns, _pod_name(pod), record)


def _store(memo: kopf.Memo, kind: str) -> dict[Any, Any]:
    op = memo.get("operator")
    return {} if op is None else op.store(kind)


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or f"{meta.get('generateName') or ''}*")
