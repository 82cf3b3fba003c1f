"""The API calls that carry out decisions, with the synchronous kubernetes
client (the reconciler runs them in a worker thread): pod annotations, pod
resize, pod eviction and budget status. Each returns the object the API
server returned (a JSON dict) and raises one of ``kubeapi.API_ERRORS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from vramguard_api import BUDGETS, GROUP, VERSION
from vramguard_operator.controller.evictions import eviction_body
from vramguard_operator.controller.kubeapi import MERGE_PATCH, STRATEGIC_MERGE_PATCH, response_json, to_model
from vramguard_operator.controller.resize import resize_patch
from vramguard_operator.engine.types import BudgetRef, ContainerCPU, PodRef


def annotations_patch(ref: PodRef, annotations: Mapping[str, str | None]) -> dict[str, Any]:
    """JSON merge patch setting (``None``: removing) pod annotations.

    ``metadata.uid`` makes it conditional: the API server refuses to change a
    uid, so a pod deleted and recreated under the same name is left alone."""
    return {"metadata": {"uid": ref.uid, "annotations": dict(annotations)}}


class KubeActions:
    """The API calls of the actions, each returning the object the API server
    returned (a JSON dict) and raising ``ApiException`` on a refusal (a
    network error when there is no answer)."""

    def __init__(self, api: client.ApiClient, timeout_seconds: float = 10.0) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        # Short request timeouts: a hung call must not stall every later decision.
        self.timeout = timeout_seconds

    def patch_pod_annotations(self, ref: PodRef, annotations: Mapping[str, str | None]) -> dict[str, Any]:
        """Merge-patch the pod's annotations (uid precondition); returns the pod."""
        resp = self.core.patch_namespaced_pod(
            ref.name,
            ref.namespace,
            annotations_patch(ref, annotations),
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )
        return response_json(resp)

    def resize_pod(self, ref: PodRef, containers: Sequence[ContainerCPU]) -> dict[str, Any]:
        """Change CPU limits/requests in place through ``pods/resize``; returns the pod."""
        resp = self.core.patch_namespaced_pod_resize(
            ref.name,
            ref.namespace,
            resize_patch(ref, containers),
            _content_type=STRATEGIC_MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )
        return response_json(resp)

    def evict_pod(self, ref: PodRef) -> None:
        """Create a policy/v1 Eviction (HTTP 429 when a PodDisruptionBudget refuses)."""
        self.core.create_namespaced_pod_eviction(
            ref.name,
            ref.namespace,
            to_model(client.V1Eviction, eviction_body(ref)),
            _preload_content=False,
            _request_timeout=self.timeout,
        )

    def patch_budget_status(self, ref: BudgetRef, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a GPUMemoryBudget's status subresource; returns the budget."""
        resp = self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            ref.namespace,
            BUDGETS,
            ref.name,
            {"status": dict(patch)},
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )
        return response_json(resp)
