"""terminationMessagePolicy: FallbackToLogsOnError for GPU containers (policy/termination.py)
and its policy switch (terminationMessageFallback; unset: on)."""

from __future__ import annotations

import jsonpatch

from vramguard_operator.policy.merge import merge
from vramguard_operator.policy.termination import FALLBACK, termination_message_ops

from .builders import policy


def pod(*containers: dict) -> dict:
    return {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": list(containers)}}


def test_default_and_unset_policies_are_replaced_an_explicit_choice_is_kept():
    p = pod({"name": "train", "terminationMessagePolicy": "File"}, {"name": "side"},
            {"name": "done", "terminationMessagePolicy": FALLBACK})
    ops = termination_message_ops(p)
    patched = jsonpatch.apply_patch(p, ops)
    assert [c.get("terminationMessagePolicy") for c in patched["spec"]["containers"]] == [FALLBACK] * 3
    assert len(ops) == 2


def test_only_the_gpu_containers_when_named():
    p = pod({"name": "train"}, {"name": "sidecar"})
    assert termination_message_ops(p, ["train"]) == [
        {"op": "add", "path": "/spec/containers/0/terminationMessagePolicy", "value": FALLBACK}]


def test_the_policy_switch_unset_on_false_off_first_policy_that_says():
    assert merge([], "ml", {}).termination_message_fallback is None  # no policy: on
    off = merge([policy("a", terminationMessageFallback=False)], "ml", {}).termination_message_fallback
    assert off is not None and off.value is False and off.source == "policy/a"
    both = merge([policy("a"), policy("b", terminationMessageFallback=True)], "ml", {}).termination_message_fallback
    assert both is not None and both.value is True
