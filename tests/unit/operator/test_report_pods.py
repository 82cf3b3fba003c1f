"""Node reports naming pod uids that are not pods on their node: flagged after
a grace period, once per change, never for a pod the cache has on the node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from vramguard_operator.plan.cache import ClusterCache
from vramguard_operator.plan.changes import Change
from vramguard_operator.plan.entries import pod_cache_entry, report_entry
from vramguard_operator.plan.report_pods import UnknownPodsFlag, UnknownReportPods

from .test_cache import pod_body, put

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
GRACE = 30.0


def report(c: ClusterCache, node: str, uids: list[str], rv: str = "1") -> None:
    body: dict[str, Any] = {
        "metadata": {"name": node, "uid": f"r-{node}", "resourceVersion": rv}, "spec": {"nodeName": node},
        "status": {"sampleTime": "2024-05-01T10:00:00Z",
                   "pods": [{"uid": u, "namespace": "ml", "name": u, "attribution": "Measured"} for u in uids]},
    }
    c.apply(Change("reports", node, None, report_entry(body)))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_an_unknown_uid_is_flagged_after_the_grace_period_once() -> None:
    c, u = ClusterCache(), UnknownReportPods(GRACE)
    put(c, "pods", "uid-a", pod_body("a", "x", node="n1"), pod_cache_entry)
    report(c, "n1", ["uid-a", "ghost"])
    assert u.update(c, at(0)) == {}  # within the grace: the agent and the API race
    assert u.update(c, at(29)) == {}
    changes = u.update(c, at(30))
    assert changes == {"n1": UnknownPodsFlag(1, "1 pod uids are not pods on this node: ghost")}
    assert u.update(c, at(60)) == {}  # unchanged: no second Event
    assert u.flagged == {"n1": changes["n1"]}


def test_a_pod_known_on_the_node_is_never_flagged_and_the_flag_clears_when_it_appears() -> None:
    c, u = ClusterCache(), UnknownReportPods(GRACE)
    report(c, "n1", ["uid-a"])
    u.update(c, at(0))
    assert u.update(c, at(31)) == {"n1": UnknownPodsFlag(1, "1 pod uids are not pods on this node: uid-a")}
    put(c, "pods", "uid-a", pod_body("a", "x", node="n1"), pod_cache_entry)
    assert u.update(c, at(32)) == {"n1": None}
    assert u.flagged == {}


def test_a_pod_on_another_node_is_unknown_on_this_one() -> None:
    c, u = ClusterCache(), UnknownReportPods(GRACE)
    put(c, "pods", "uid-a", pod_body("a", "x", node="n2"), pod_cache_entry)
    report(c, "n1", ["uid-a"])
    u.update(c, at(0))
    assert u.update(c, at(30))["n1"] == UnknownPodsFlag(1, "1 pod uids are not pods on this node: uid-a")


def test_a_pod_just_deleted_gets_the_grace_from_its_deletion() -> None:
    """The report names the pod until the agent's next sample."""
    c, u = ClusterCache(), UnknownReportPods(GRACE)
    put(c, "pods", "uid-a", pod_body("a", "x", node="n1"), pod_cache_entry)
    report(c, "n1", ["uid-a"])
    assert u.update(c, at(0)) == {}
    put(c, "pods", "uid-a", None, pod_cache_entry)
    assert u.update(c, at(100)) == {}  # first seen unknown now
    report(c, "n1", [], rv="2")  # the next sample drops it
    assert u.update(c, at(120)) == {}
    assert u.update(c, at(200)) == {}


def test_a_uid_that_leaves_the_report_starts_its_grace_again() -> None:
    c, u = ClusterCache(), UnknownReportPods(GRACE)
    report(c, "n1", ["ghost"])
    u.update(c, at(0))
    report(c, "n1", [], rv="2")
    u.update(c, at(20))
    report(c, "n1", ["ghost"], rv="3")
    assert u.update(c, at(40)) == {}  # named again at 40: not 40 s on end
    assert set(u.update(c, at(70))) == {"n1"}


def test_a_changed_set_is_a_new_flag_and_a_report_gone_clears_it() -> None:
    c, u = ClusterCache(), UnknownReportPods(GRACE)
    report(c, "n1", ["g1"])
    u.update(c, at(0))
    first = u.update(c, at(30))["n1"]
    report(c, "n1", ["g1", "g2"], rv="2")
    assert u.update(c, at(31)) == {}  # g2 is within its grace: the flag is unchanged
    second = u.update(c, at(61))["n1"]
    assert first is not None and second is not None
    assert (first.count, second.count) == (1, 2) and "g1, g2" in second.message
    c.apply(Change("reports", "n1", None, None))
    assert u.update(c, at(62)) == {"n1": None}
    assert u.update(c, at(63)) == {}


def test_nodes_are_judged_apart() -> None:
    c, u = ClusterCache(), UnknownReportPods(GRACE)
    put(c, "pods", "uid-a", pod_body("a", "x", node="n1"), pod_cache_entry)
    report(c, "n1", ["uid-a"])
    report(c, "n2", ["ghost"])
    u.update(c, at(0))
    assert set(u.update(c, at(30))) == {"n2"}


def test_pods_of_namespaces_the_cache_does_not_hold_are_not_judged() -> None:
    """``--namespace ml-*`` or another replica's shard: the cache has no pods there."""
    c, u = ClusterCache(), UnknownReportPods(GRACE, judged=lambda ns: ns.startswith("ml"))
    body: dict[str, Any] = {
        "metadata": {"name": "n1", "uid": "r-n1", "resourceVersion": "1"}, "spec": {"nodeName": "n1"},
        "status": {"sampleTime": "2024-05-01T10:00:00Z", "pods": [
            {"uid": "elsewhere", "namespace": "web", "name": "w", "attribution": "Measured"},
            {"uid": "ghost", "namespace": "ml-a", "name": "g", "attribution": "Measured"}]},
    }
    c.apply(Change("reports", "n1", None, report_entry(body)))
    u.update(c, at(0))
    assert u.update(c, at(30)) == {"n1": UnknownPodsFlag(1, "1 pod uids are not pods on this node: ghost")}
