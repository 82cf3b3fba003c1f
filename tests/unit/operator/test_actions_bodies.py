"""Request bodies of the actions: annotation, resize and status patches,
Evictions and Events, and API error texts."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client import CoreV1Event, V1Eviction
from kubernetes.client.rest import ApiException

from vramguard_operator.controller.api_calls import annotations_patch
from vramguard_operator.controller.events import budget_object, event_body, pod_object
from vramguard_operator.controller.evictions import eviction_body
from vramguard_operator.controller.kubeapi import api_error_text, merge_patch
from vramguard_operator.controller.resize import resize_patch
from vramguard_operator.engine.types import BudgetRef, ContainerCPU, EventSpec, PodRef

POD = PodRef("ml", "w0", "uid-w0")


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 MergePatch, as the API server applies it."""
    if not isinstance(patch, dict):
        return patch
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def test_annotation_patch_sets_and_removes_with_uid_precondition():
    body = annotations_patch(POD, {"vramguard.io/violation": "x", "vramguard.io/original-cpu": None})
    assert body == {
        "metadata": {
            "uid": "uid-w0",
            "annotations": {"vramguard.io/violation": "x", "vramguard.io/original-cpu": None},
        }
    }


def test_resize_patch_sets_cpu_limit_and_only_given_requests():
    body = resize_patch(POD, [ContainerCPU("main", "100m", "100m"), ContainerCPU("side", "100m")])
    assert body["metadata"] == {"uid": "uid-w0"}
    assert body["spec"]["containers"] == [
        {"name": "main", "resources": {"limits": {"cpu": "100m"}, "requests": {"cpu": "100m"}}},
        {"name": "side", "resources": {"limits": {"cpu": "100m"}}},
    ]


def test_eviction_body_is_a_policy_v1_eviction_with_uid_precondition():
    body = eviction_body(POD)
    model = V1Eviction.from_dict(body)  # the client's own model accepts it
    assert model.api_version == "policy/v1"
    assert model.delete_options.preconditions.uid == "uid-w0"
    assert body["metadata"] == {"name": "w0", "namespace": "ml"}


def test_event_body_names_the_object_and_cuts_long_messages():
    now = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
    spec = EventSpec("Warning", "LimitExceeded", "m" * 5000)
    body = event_body(budget_object(BudgetRef("ml", "train", "uid-b")), spec, now, "host-1", "e.1")
    assert body["involvedObject"] == {
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "GPUMemoryBudget",
        "namespace": "ml",
        "name": "train",
        "uid": "uid-b",
    }
    assert body["source"] == {"component": "vramguard"}
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "LimitExceeded", 1)
    assert len(body["message"]) == 1024
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2024-05-01T10:00:00Z"
    assert CoreV1Event.from_dict(body).involved_object.kind == "GPUMemoryBudget"


def test_object_ref_leaves_out_an_unknown_uid():
    assert "uid" not in budget_object(BudgetRef("ml", "train")).to_api()
    assert pod_object(POD).to_api()["uid"] == "uid-w0"


def test_merge_patch_removes_keys_that_are_gone_and_keeps_unchanged_ones_out():
    current = {
        "observedGeneration": 1,
        "usage": {"vramBytes": 10, "vram": "10"},
        "violations": [{"kind": "PodVRAM"}],
        "openViolations": 1,
    }
    desired = {"observedGeneration": 2, "usage": {"ramBytes": 5}, "openViolations": 1}
    patch = merge_patch(current, desired)
    assert patch == {
        "observedGeneration": 2,
        "usage": {"vramBytes": None, "vram": None, "ramBytes": 5},
        "violations": None,
    }
    assert apply_merge_patch(current, patch) == desired


def test_merge_patch_from_nothing_is_the_desired_object():
    assert merge_patch(None, {"a": {"b": 1}}) == {"a": {"b": 1}}


# Objects without null values: the status never holds nulls (to_api drops them).
no_nulls = st.recursive(
    st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=2), no_nulls, max_size=4),
       st.dictionaries(st.text(max_size=2), no_nulls, max_size=4))
def test_merge_patch_applied_to_current_gives_desired(current, desired):
    assert apply_merge_patch(current, merge_patch(current, desired)) == desired


def test_api_error_text_reads_the_status_body_and_its_causes():
    body = json.dumps({
        "kind": "Status",
        "message": "Pod \"w0\" is invalid: spec: Forbidden: Pod running on node without support for resize",
        "reason": "Invalid",
        "details": {"causes": [{"message": "Forbidden: Pod running on node without support for resize"}]},
        "code": 422,
    })
    err = ApiException(status=422, reason="Unprocessable Entity")
    err.body = body
    assert api_error_text(err) == (
        "HTTP 422 Invalid: Pod \"w0\" is invalid: spec: Forbidden: Pod running on node without "
        "support for resize"
    )
    pdb = ApiException(status=429, reason="Too Many Requests")
    pdb.body = json.dumps({
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {"causes": [{"reason": "DisruptionBudget",
                                "message": "The disruption budget pdb1 needs 1 healthy pods and has 1 currently"}]},
    })
    assert api_error_text(pdb) == (
        "HTTP 429 TooManyRequests: Cannot evict pod as it would violate the pod's disruption "
        "budget. (The disruption budget pdb1 needs 1 healthy pods and has 1 currently)"
    )
    bare = ApiException(status=500, reason="Internal Server Error")
    bare.body = "not json"
    assert api_error_text(bare) == "HTTP 500 Internal Server Error"
