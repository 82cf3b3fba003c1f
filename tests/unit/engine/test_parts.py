"""The engine's parts: label selectors, the state annotation, throttle plans, PodFacts."""

from __future__ import annotations

import json

import pytest

from vramguard_api.meta import LabelSelector
from vramguard_api.policy import GPUMemoryPolicy
from vramguard_operator.engine.records import merge_records, records_from_annotation, records_to_annotation
from vramguard_operator.engine.selectors import compile_selector
from vramguard_operator.engine.throttle import parse_original, plan_restore, plan_throttle
from vramguard_operator.engine.types import (
    ContainerFacts,
    EffectivePolicy,
    PodFacts,
    ViolationKey,
    ViolationRecord,
)

from .builders import at, stale_selector

SELECTORS = [
    # selector, labels, matches
    ({}, {}, True),
    ({}, {"a": "1"}, True),
    ({"matchLabels": {"app": "x"}}, {"app": "x", "b": "2"}, True),
    ({"matchLabels": {"app": "x"}}, {"app": "y"}, False),
    ({"matchLabels": {"app": "x"}}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, {"tier": "b"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, {"tier": "c"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "a"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "b"}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "1"}, False),
    ({"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"app": "x"}, False),
    (
        {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
        {"app": "x", "gpu": "1"},
        True,
    ),
]


@pytest.mark.parametrize(("selector", "labels", "matches"), SELECTORS)
def test_label_selector(selector, labels, matches):
    assert compile_selector(LabelSelector.model_validate(selector))(labels) is matches


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ({"key": "k", "operator": "In", "values": []}, "needs values"),
        ({"key": "k", "operator": "NotIn"}, "needs values"),
        ({"key": "k", "operator": "Exists", "values": ["v"]}, "takes no values"),
    ],
)
def test_invalid_selector(expr, message):
    with pytest.raises(ValueError, match=rf"spec.selector.matchExpressions\[0\]: .*{message}"):
        compile_selector(stale_selector(expr))


@pytest.mark.parametrize(
    "expr",
    [
        {"key": "k", "operator": "In", "values": []},
        {"key": "k", "operator": "Exists", "values": ["v"]},
        {"key": "a b", "operator": "Exists"},
        {"key": "k", "operator": "In", "values": ["x y"]},
    ],
)
def test_the_model_rejects_what_the_api_server_rejects(expr):
    with pytest.raises(ValueError, match="matchExpressions"):
        LabelSelector.model_validate({"matchExpressions": [expr]})


def test_state_annotation_round_trip_and_format():
    recs = [
        ViolationRecord(
            ViolationKey("ml", "b", "DeviceVRAM", "p", "GPU-1"), "u", at(0), at(60), "Throttle", at(360), 5, 4
        ),
        ViolationRecord(ViolationKey("ml", "b", "TotalVRAM"), "u", at(0), at(0), "Annotate", at(0)),
    ]
    text = records_to_annotation(recs)
    assert " " not in text  # compact
    data = json.loads(text)
    assert data[0] == {
        "budget": "b",
        "budgetUID": "u",
        "kind": "DeviceVRAM",
        "device": "GPU-1",
        "since": "2024-05-01T10:00:00Z",
        "openedAt": "2024-05-01T10:01:00Z",
        "step": "Throttle",
        "stepTime": "2024-05-01T10:06:00Z",
        "observedBytes": 5,
        "limitBytes": 4,
    }
    back, problems = records_from_annotation(text, "ml", "p")
    assert problems == [] and sorted(back, key=lambda r: r.key.kind) == recs


def test_merge_keeps_earliest_times_and_furthest_step():
    key = ViolationKey("ml", "b", "PodVRAM", "p")
    a = ViolationRecord(key, "u", at(10), at(20), "Annotate", at(20), 1, 2)
    b = ViolationRecord(key, "", at(0), at(30), "Throttle", at(330))
    m = merge_records(a, b)
    assert (m.since, m.opened_at, m.step, m.step_time, m.budget_uid) == (at(0), at(20), "Throttle", at(330), "u")
    assert (m.observed_bytes, m.limit_bytes) == (1, 2)
    assert merge_records(b, a) == m


def test_throttle_plan():
    p = PodFacts(
        "ml",
        "p",
        "u",
        containers=(
            ContainerFacts("main", cpu_limit="4", cpu_request="2"),
            ContainerFacts("small", cpu_limit="50m", cpu_request="50m"),
            ContainerFacts("side", cpu_limit="1", cpu_request="50m"),
            ContainerFacts("free"),
            ContainerFacts("restarts", cpu_limit="2", cpu_request="2", cpu_resize_restart=True),
        ),
    )
    plan = plan_throttle(p, "100m", None)
    # main's request stays below its limit (a Burstable pod must not become Guaranteed)
    assert [(c.name, c.limit, c.request) for c in plan.resize] == [("main", "100m", "99m"), ("side", "100m", None)]
    assert plan.original == {"main": {"limit": "4", "request": "2"}, "side": {"limit": "1", "request": "50m"}}
    assert plan.impossible_reason is None
    throttled = PodFacts(
        "ml", "p", "u", containers=(ContainerFacts("main", "100m", "99m"), ContainerFacts("side", "0.1", "50m"))
    )
    restore = plan_restore(plan.original, throttled, ["100m"])
    assert [(c.name, c.limit, c.request) for c in restore] == [("main", "4", "2"), ("side", "1", "50m")]
    # only containers still at a target vramguard set are put back
    raised = PodFacts("ml", "p", "u", containers=(ContainerFacts("main", "100m"), ContainerFacts("side", "2")))
    assert [c.name for c in plan_restore(plan.original, raised, ["100m", "250m"])] == ["main"]
    assert plan_restore(plan.original, throttled, []) == ()


def test_throttle_plan_keeps_each_containers_qos_shape():
    guaranteed = PodFacts("ml", "p", "u", containers=(ContainerFacts("main", cpu_limit="2", cpu_request="2"),))
    assert [(c.limit, c.request) for c in plan_throttle(guaranteed, "500m", None).resize] == [("500m", "500m")]
    burstable = PodFacts("ml", "p", "u", containers=(ContainerFacts("main", cpu_limit="2", cpu_request="500m"),))
    assert [(c.limit, c.request) for c in plan_throttle(burstable, "500m", None).resize] == [("500m", "499m")]
    tiny = plan_throttle(burstable, "1m", None)
    assert tiny.resize == () and "no room for a request below the limit" in tiny.impossible_reason


def test_throttle_plan_keeps_first_originals_and_explains_impossible():
    p = PodFacts("ml", "p", "u", containers=(ContainerFacts("main", cpu_limit="100m", cpu_request="100m"),))
    plan = plan_throttle(p, "100m", {"main": {"limit": "4", "request": "4"}})
    assert plan.resize == () and plan.impossible_reason is None
    assert plan.original == {"main": {"limit": "4", "request": "4"}}
    none = PodFacts("ml", "p", "u", containers=(ContainerFacts("a"), ContainerFacts("b", "1", "1", True)))
    reason = plan_throttle(none, "100m", None).impossible_reason
    assert "a: no CPU limit" in reason and "b: resizePolicy cpu RestartContainer" in reason
    assert parse_original("not json") is None and parse_original('{"c": {"limit": 3}}') == {}
    # entries that are not CPU quantities are never restored
    assert parse_original('{"a": {"limit": "x"}, "b": {"limit": "2", "request": "-1"}}') == {
        "b": {"limit": "2", "request": None}
    }
    assert parse_original("[" * 100_000) is None


def test_pod_facts_from_api():
    body = {
        "metadata": {
            "namespace": "ml",
            "name": "p",
            "uid": "u",
            "labels": {"a": "b"},
            "annotations": {"x": "y"},
            "deletionTimestamp": "2024-05-01T10:00:00Z",
        },
        "spec": {
            "nodeName": "n",
            "containers": [
                {
                    "name": "c",
                    "resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}},
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}],
                }
            ],
        },
        "status": {"phase": "Running"},
    }
    f = PodFacts.from_api(body)
    assert (f.namespace, f.name, f.uid, f.node_name, f.phase, f.terminating) == ("ml", "p", "u", "n", "Running", True)
    assert f.containers == (ContainerFacts("c", "2", "1", True),)
    assert f.labels == {"a": "b"} and f.annotations == {"x": "y"}
    with pytest.raises(ValueError, match="metadata.uid"):
        PodFacts.from_api({"metadata": {"namespace": "ml", "name": "p"}})


def test_effective_policy_from_policy():
    assert EffectivePolicy.from_policy(None) == EffectivePolicy()
    pol = GPUMemoryPolicy.model_validate({"spec": {"mode": "DryRun", "exemptNamespaces": ["a", "b"]}})
    assert EffectivePolicy.from_policy(pol) == EffectivePolicy("DryRun", frozenset({"a", "b"}))
