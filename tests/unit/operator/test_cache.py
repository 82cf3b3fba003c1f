"""The reconcile thread's cache: which budgets select which pods, what a change
marks, and the echo of the operator's own writes marking nothing."""

from __future__ import annotations

from typing import Any

from vramguard_operator.plan.cache import ClusterCache
from vramguard_operator.plan.changes import Change
from vramguard_operator.plan.entries import budget_entry, pod_cache_entry, report_entry

from ..engine.builders import budget

STATE = '[{"budget":"old","budgetUID":"u-old","kind":"PodVRAM","since":"2024-05-01T10:00:00Z"}]'


def pod_body(name: str, app: str, rv: str = "1", node: str = "n1", annotations: dict[str, str] | None = None,
             ns: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": rv,
                         "labels": {"app": app}, "annotations": annotations or {}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": {"phase": "Running"}}


def budget_body(name: str, app: str, rv: str = "1", generation: int = 1, status: Any = None) -> dict[str, Any]:
    body = budget(name=name, uid=f"b-{name}", generation=generation, per_pod={"vram": "10Gi"},
                  selector={"matchLabels": {"app": app}}).to_api()
    body["metadata"]["resourceVersion"] = rv
    if status is not None:
        body["status"] = status
    return body


def put(c: ClusterCache, kind: str, key: Any, body: dict[str, Any] | None, parse: Any) -> None:
    c.apply(Change(kind, key, None, None if body is None else parse(body)))


def test_selection_follows_pod_labels_and_budget_selectors() -> None:
    c = ClusterCache()
    put(c, "budgets", ("ml", "x"), budget_body("x", "x"), budget_entry)
    put(c, "pods", "uid-a", pod_body("a", "x"), pod_cache_entry)
    put(c, "pods", "uid-b", pod_body("b", "y"), pod_cache_entry)
    put(c, "pods", "uid-c", pod_body("c", "x", ns="other"), pod_cache_entry)  # another namespace
    assert c.selects[("ml", "x")] == {"uid-a"}
    c.take_dirt()
    put(c, "pods", "uid-b", pod_body("b", "x", rv="2"), pod_cache_entry)
    assert c.selects[("ml", "x")] == {"uid-a", "uid-b"}
    dirt = c.take_dirt()
    assert dirt.pods == {"uid-b"} and not dirt.budgets  # the budget comes with the pod's closure
    put(c, "budgets", ("ml", "x"), budget_body("x", "y", rv="2", generation=2), budget_entry)
    assert c.selects[("ml", "x")] == set()
    dirt = c.take_dirt()
    assert dirt.budgets == {("ml", "x")} and dirt.pods == {"uid-a", "uid-b"}  # no longer selected


def test_a_pod_leaving_a_budget_marks_the_budget() -> None:
    c = ClusterCache()
    put(c, "budgets", ("ml", "x"), budget_body("x", "x"), budget_entry)
    put(c, "pods", "uid-a", pod_body("a", "x"), pod_cache_entry)
    c.take_dirt()
    put(c, "pods", "uid-a", pod_body("a", "z", rv="2"), pod_cache_entry)
    dirt = c.take_dirt()
    assert dirt.budgets == {("ml", "x")} and dirt.pods == {"uid-a"}
    put(c, "pods", "uid-a", None, pod_cache_entry)
    assert c.take_dirt().budgets == set()  # it selected nothing by then


def test_deleted_pods_mark_the_budgets_they_were_in_or_held_state_for() -> None:
    c = ClusterCache()
    put(c, "budgets", ("ml", "x"), budget_body("x", "x"), budget_entry)
    put(c, "pods", "uid-a", pod_body("a", "x", annotations={"vramguard.io/violations": STATE}), pod_cache_entry)
    assert c.recorded[("ml", "old")] == {"uid-a"}
    c.take_dirt()
    c.apply(Change("pods", "uid-a", None, None))
    assert c.take_dirt().budgets == {("ml", "x"), ("ml", "old")}
    assert "uid-a" not in c.pods and not c.recorded and not c.selects


def test_the_echo_of_an_own_write_marks_nothing() -> None:
    c = ClusterCache()
    put(c, "pods", "uid-a", pod_body("a", "x"), pod_cache_entry)
    c.take_dirt()
    written = pod_cache_entry(pod_body("a", "x", rv="5", annotations={"vramguard.io/violation": "v"}))
    c.record_pod(written)  # the API server's answer
    assert c.pods["uid-a"] is written and not c.take_dirt()
    c.apply(Change("pods", "uid-a", None, pod_cache_entry(pod_body("a", "x", rv="3"))))  # a lagging watch
    assert c.pods["uid-a"] is written and not c.take_dirt()
    c.apply(Change("pods", "uid-a", None, pod_cache_entry(
        pod_body("a", "x", rv="5", annotations={"vramguard.io/violation": "v"}))))  # the echo
    assert not c.take_dirt()
    c.apply(Change("pods", "uid-a", None, pod_cache_entry(pod_body("a", "y", rv="6"))))  # someone else
    assert c.take_dirt().pods == {"uid-a"}


def test_a_budget_status_echo_marks_nothing_a_foreign_one_is_read_back() -> None:
    c = ClusterCache()
    put(c, "budgets", ("ml", "x"), budget_body("x", "x"), budget_entry)
    c.take_dirt()
    mine = budget_entry(budget_body("x", "x", status={"matchedPods": 3})).value.budget
    assert mine is not None and mine.status is not None
    c.set_status(("ml", "x"), mine.status, mine.status.to_api())
    put(c, "budgets", ("ml", "x"), budget_body("x", "x", rv="2", status={"matchedPods": 3}), budget_entry)
    assert not c.take_dirt() and c.status_of(("ml", "x")) is mine.status
    put(c, "budgets", ("ml", "x"), budget_body("x", "x", rv="3", status={"matchedPods": 9}), budget_entry)
    assert c.take_dirt().budgets == {("ml", "x")}
    st = c.status_of(("ml", "x"))
    assert st is not None and st.matched_pods == 9


def test_a_pod_seen_by_both_pod_watches_goes_only_when_both_let_it_go() -> None:
    c = ClusterCache()
    entry = pod_cache_entry(pod_body("a", "x"))
    c.apply(Change("pods-unlabelled", "uid-a", None, entry))
    c.apply(Change("pods", "uid-a", None, pod_cache_entry(pod_body("a", "x", rv="2"))))  # labelled now
    c.apply(Change("pods-unlabelled", "uid-a", entry, None))  # the old watch lets it go
    assert "uid-a" in c.pods
    c.apply(Change("pods", "uid-a", None, None))
    assert "uid-a" not in c.pods


def test_a_report_marks_the_pods_on_its_node_and_those_it_names() -> None:
    c = ClusterCache()
    put(c, "pods", "uid-a", pod_body("a", "x", node="n1"), pod_cache_entry)
    put(c, "pods", "uid-b", pod_body("b", "x", node="n2"), pod_cache_entry)
    c.take_dirt()
    body = {"metadata": {"name": "n1", "uid": "r", "resourceVersion": "3"}, "spec": {"nodeName": "n1"},
            "status": {"sampleTime": "2024-05-01T10:00:00Z",
                       "pods": [{"uid": "uid-b", "namespace": "ml", "name": "b", "attribution": "Measured"}]}}
    c.apply(Change("reports", "n1", None, report_entry(body)))
    dirt = c.take_dirt()
    assert dirt.pods == {"uid-a", "uid-b"} and dirt.nodes == {"n1"}


def test_a_pod_leaving_a_shared_claim_marks_the_pods_still_sharing_it() -> None:
    """The claim's budget spans its pods: one going changes what the others' budget counts."""
    c = ClusterCache()
    for name in ("a", "b", "c"):
        body = pod_body(name, "x", node=f"n-{name}")  # each on its own node (a pod going marks its node's others)
        body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c1" if name != "c" else "c2"}]
        put(c, "pods", f"uid-{name}", body, pod_cache_entry)
    c.take_dirt()
    moved = pod_body("b", "x", rv="2", node="n-b")
    moved["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c2"}]
    put(c, "pods", "uid-b", moved, pod_cache_entry)
    assert c.take_dirt().pods == {"uid-a", "uid-b"}  # c1's pod counted it; c2's come with it (the closure)
    put(c, "pods", "uid-c", None, pod_cache_entry)
    dirt = c.take_dirt()
    assert dirt.pods == {"uid-b"} and dirt.gone == {"uid-c"}


def test_a_pod_going_marks_the_other_pods_of_its_node() -> None:
    """The device-pressure rule judges their devices without it (a pod it chose
    is gone: the next is chosen now, as a pass over everything would)."""
    c = ClusterCache()
    for name, node in (("a", "n1"), ("b", "n1"), ("c", "n2")):
        put(c, "pods", f"uid-{name}", pod_body(name, "x", node=node), pod_cache_entry)
    c.take_dirt()
    put(c, "pods", "uid-a", None, pod_cache_entry)
    dirt = c.take_dirt()
    assert dirt.pods == {"uid-b"} and dirt.gone == {"uid-a"}


def test_two_reports_claiming_one_node_make_it_unknown_until_one_goes() -> None:
    c = ClusterCache()

    def rep(name: str, rv: str) -> Any:
        return report_entry({"metadata": {"name": name, "uid": f"r-{name}", "resourceVersion": rv},
                             "spec": {"nodeName": "n1"}, "status": {"sampleTime": "2024-05-01T10:00:00Z"}})

    c.apply(Change("reports", ("n1", "n1"), None, rep("n1", "3")))
    assert c.unknown_nodes() == {} and c.report("n1") is not None
    c.apply(Change("reports", ("n1", "fake"), None, rep("fake", "4")))
    assert c.unknown_nodes() == {"n1": "2 NodeGPUUsage objects report this node (fake, n1)"}
    c.apply(Change("reports", ("n1", "fake"), None, None))
    assert c.unknown_nodes() == {} and c.report("n1").metadata.name == "n1"  # type: ignore[union-attr]
