"""Issue 17 end to end on the local cluster: a step and its Events survive the
operator being killed at each point between a state write and its Events; a
control-plane outage across a step's due time leaves every step done once, in
order, with its Events; hostile objects are contained to themselves while a
canary budget elsewhere is still enforced.

The operator runs as a subprocess with a state key (``--state-key-file``) and
without the chart's annotation guard (the guard itself is tested in
tests/e2e/test_chart_e2e.py): pods here accept any annotation, as on a cluster
without the guard, and the operator must not obey forged state. Test names
start with ``test_hard_`` so that their namespaces are the only ones watched.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .hardening_harness import PodHistory, Publisher, etcd_pid, event_counts, in_order, state_key_file
from .operator_harness import (
    GI,
    GROUP,
    VERSION,
    OperatorProcess,
    Usage,
    budget_manifest,
    condition,
    create_gpu_nodes,
    delete_nodes,
    events_about,
    get_budget,
    pod_manifest,
    run_pods,
    wait_for,
)

STEPS = ("LimitExceeded", "Throttled", "Evicting")


@pytest.fixture(scope="module")
def api(cluster: Any) -> tuple[client.CoreV1Api, client.CustomObjectsApi]:
    a = cluster.api_client()
    return client.CoreV1Api(a), client.CustomObjectsApi(a)


@pytest.fixture(scope="module")
def nodes(api: Any) -> Iterator[list[str]]:
    core, custom = api
    names = [f"vg-hard-{uuid.uuid4().hex[:5]}-{i}" for i in range(3)]
    create_gpu_nodes(core, names)
    yield names
    delete_nodes(core, custom, names)


@pytest.fixture(scope="module")
def key_file() -> Iterator[str]:
    path = state_key_file()
    yield path
    os.unlink(path)


def operator(cluster: Any, key_file: str, crash_at: str | None = None, **flags: str) -> OperatorProcess:
    settings = {"evaluation-period": "1s", "debounce": "10ms", "freshness": "30s", "request-timeout": "3s",
                "eviction-retry": "2s", "eviction-rate-per-minute": "120", "eviction-burst": "20",
                "watch-timeout": "60s", "state-key-file": key_file, **flags}
    env = {"VRAMGUARD_CRASH_AT": crash_at} if crash_at else {}
    return OperatorProcess(cluster.kubeconfig, ["t-test-hard-*"], [f"--{k}={v}" for k, v in settings.items()], env)


def create_budget(custom: client.CustomObjectsApi, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", manifest)


def pod_or_none(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    try:
        return core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def finish(op: OperatorProcess) -> None:
    op.stop()
    print(f"--- operator log ({op.log}) ---\n{op.tail(60)}")


# --- crash points -----------------------------------------------------------------------------

LADDER = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "5s", "cpuLimit": "100m"},
          {"action": "Evict", "after": "10s"}]
# (the point, the how-manieth time it is reached): each between a state write and its Events
ESCALATION_POINTS = [
    "after-annotation-patch", "after-pod-event", "after-budget-event", "before-explained", "before-status",
    "after-annotation-patch:2", "after-resize", "after-pod-event:3", "before-explained:2",
    "before-eviction", "after-eviction",
]
RECOVERY_POINTS = ["after-restore-resize", "after-recovered-event"]


def crashed(op: OperatorProcess, timeout: float = 45) -> int:
    status = wait_for(lambda: op.exited(), timeout, "the operator to kill itself at its crash point", interval=0.2)
    assert status == -signal.SIGKILL, op.tail()
    return status


def steps_in_order(history: PodHistory, name: str, want: list[str | None]) -> None:
    """The pod's record went through ``want`` (the last step of each version),
    never back; the CPU was lowered before the pod was terminating."""
    seen = [v.steps[-1] if v.steps else None for v in history.of(name) if not v.deleted]
    reached = [s for i, s in enumerate(seen) if s is not None and (i == 0 or s != seen[i - 1])]
    assert reached == want, seen
    throttled = [i for i, v in enumerate(history.of(name)) if v.cpu_limit == "100m"]
    terminating = [i for i, v in enumerate(history.of(name)) if v.terminating or v.deleted]
    if "Evict" in want or terminating:
        assert throttled and terminating and throttled[0] < terminating[0], history.of(name)


@pytest.mark.parametrize("point", ESCALATION_POINTS)
def test_hard_crash_during_the_ladder(cluster: Any, api: Any, nodes: list[str], namespace: str, key_file: str,
                                      point: str) -> None:
    core, custom = api
    node = nodes[0]
    budget = create_budget(custom, namespace, budget_manifest("train", {"perPod": {"vram": "10Gi"}}, LADDER))
    w0 = run_pods(core, namespace, [pod_manifest("w0", node, {"app": "train"})])["w0"]
    first = operator(cluster, key_file, crash_at=point)
    with PodHistory(core, namespace) as history, Publisher(custom, node, lambda: [Usage(w0, 12 * GI)]):
        time.sleep(2)  # a fresh report before the operator starts
        first.start(may_exit=True)  # it may reach its crash point before its liveness endpoint answers
        crashed(first)
        again = operator(cluster, key_file)
        again.start()
        try:
            wait_for(lambda: pod_or_none(core, namespace, "w0") is None, 40, "w0 evicted after the restart")
            for uid in (w0.metadata.uid, budget["metadata"]["uid"]):
                wait_for(lambda u=uid: all(r in event_counts(core, namespace, u) for r in STEPS), 15,
                         "every step's Event")
            time.sleep(2)  # anything posted twice would show by now
        finally:
            finish(first)
            finish(again)
    for uid in (w0.metadata.uid, budget["metadata"]["uid"]):
        counts = event_counts(core, namespace, uid)
        assert {r: counts.get(r) for r in STEPS} == {r: [1] for r in STEPS}, counts  # each once, counted once
        assert "ActionFailed" not in counts, counts
        assert in_order(core, namespace, uid, STEPS)
    steps_in_order(history, "w0", ["Annotate", "Throttle"])


@pytest.mark.parametrize("point", RECOVERY_POINTS)
def test_hard_crash_during_a_recovery(cluster: Any, api: Any, nodes: list[str], namespace: str, key_file: str,
                                      point: str) -> None:
    core, custom = api
    node = nodes[0]
    ladder = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "2s", "cpuLimit": "100m"}]
    budget = create_budget(custom, namespace, budget_manifest("infer", {"perPod": {"vram": "10Gi"}}, ladder))
    r0 = run_pods(core, namespace, [pod_manifest("r0", node, {"app": "infer"}, cpu="1500m")])["r0"]
    usage = {"vram": 12 * GI}
    first = operator(cluster, key_file, crash_at=point)
    with PodHistory(core, namespace) as history, Publisher(custom, node, lambda: [Usage(r0, usage["vram"])]):
        time.sleep(2)
        first.start(may_exit=True)
        again = operator(cluster, key_file)
        try:
            wait_for(lambda: (p := pod_or_none(core, namespace, "r0")) and
                     p.spec.containers[0].resources.limits["cpu"] == "100m", 20, "r0 throttled")
            wait_for(lambda: "Throttled" in event_counts(core, namespace, r0.metadata.uid), 10, "Throttled")
            usage["vram"] = 1 * GI  # back under the limit: the violation closes, the CPU comes back
            crashed(first)
            again.start()
            wait_for(lambda: not (pod_or_none(core, namespace, "r0").metadata.annotations or {}).get(
                "vramguard.io/violations"), 30, "the record removed after the restart")
            for uid in (r0.metadata.uid, budget["metadata"]["uid"]):
                wait_for(lambda u=uid: "Recovered" in event_counts(core, namespace, u), 10, "Recovered Events")
            time.sleep(2)
        finally:
            finish(first)
            finish(again)
    pod = pod_or_none(core, namespace, "r0")
    assert pod.spec.containers[0].resources.limits["cpu"] == "1500m"
    assert not [k for k in pod.metadata.annotations or {} if k.startswith("vramguard.io/")]
    for uid in (r0.metadata.uid, budget["metadata"]["uid"]):
        counts = event_counts(core, namespace, uid)
        want = ("LimitExceeded", "Throttled", "Recovered")
        assert {r: counts.get(r) for r in want} == {r: [1] for r in want}, counts
        assert in_order(core, namespace, uid, want)
    restored = [v.cpu_limit for v in history.of("r0")]
    assert restored.count("1500m") >= 1 and restored[-1] == "1500m"


# --- a control-plane outage -------------------------------------------------------------------


def test_hard_outage_across_a_steps_due_time(cluster: Any, api: Any, nodes: list[str], namespace: str,
                                             key_file: str) -> None:
    """etcd stopped (SIGSTOP) for 8 s across the Throttle's due time: the API
    server answers nothing, writes time out (some may land later). Afterwards
    every step happened once, in order, each with its Events. (Eight seconds
    stay under the controller-manager's leader-election renew deadline.)"""
    pid = etcd_pid()
    if pid is None:
        pytest.skip("the local cluster's etcd pid is unknown (KWOK_WORKDIR, VG_CLUSTER_NAME)")
    core, custom = api
    node = nodes[1]
    ladder = [{"action": "Annotate", "after": "0s"}, {"action": "Throttle", "after": "8s", "cpuLimit": "100m"},
              {"action": "Evict", "after": "16s"}]
    budget = create_budget(custom, namespace, budget_manifest("train", {"perPod": {"vram": "10Gi"}}, ladder))
    w0 = run_pods(core, namespace, [pod_manifest("w0", node, {"app": "train"})])["w0"]
    op = operator(cluster, key_file)
    with PodHistory(core, namespace) as history, Publisher(custom, node, lambda: [Usage(w0, 12 * GI)]) as pub:
        time.sleep(2)
        op.start()
        try:
            wait_for(lambda: "LimitExceeded" in event_counts(core, namespace, w0.metadata.uid), 20, "Annotate")
            time.sleep(4)  # the Throttle is due 8 s after the violation opened
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(8)
            finally:
                os.kill(pid, signal.SIGCONT)
            wait_for(lambda: pod_or_none(core, namespace, "w0") is None, 60, "w0 evicted after the outage")
            for uid in (w0.metadata.uid, budget["metadata"]["uid"]):
                wait_for(lambda u=uid: all(r in event_counts(core, namespace, u) for r in STEPS), 20,
                         "every step's Event")
            time.sleep(2)
        finally:
            finish(op)
    # the outage was real: the API server did not answer the agent, and the step's write timed out
    assert pub.slowest >= 5, pub.slowest
    assert "timed out" in op.log.read_text(errors="replace")
    for uid in (w0.metadata.uid, budget["metadata"]["uid"]):
        counts = event_counts(core, namespace, uid)
        assert {r: counts.get(r) for r in STEPS} == {r: [1] for r in STEPS}, counts
        assert in_order(core, namespace, uid, STEPS)
    steps_in_order(history, "w0", ["Annotate", "Throttle"])


# --- hostile objects and a canary ---------------------------------------------------------------


def loosened(crd: dict[str, Any]) -> dict[str, Any]:
    """The budget CRD as an older version without the bounds: any spec is stored."""
    out = json.loads(json.dumps(crd))
    for key in ("status", "managedFields", "resourceVersion", "uid", "creationTimestamp", "generation"):
        out.pop(key, None)
        out["metadata"].pop(key, None)
    for v in out["spec"]["versions"]:
        schema = v["schema"]["openAPIV3Schema"]["properties"]
        schema["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return out


def test_hard_hostile_objects_are_contained_and_a_canary_is_enforced(cluster: Any, api: Any, nodes: list[str],
                                                                     namespace: str, key_file: str) -> None:
    core, custom = api
    bad_node, conflict_node, good_node = nodes
    canary_ns = namespace[:55] + "-canary"
    cluster.kubectl("create", "namespace", canary_ns)
    crd_name = "gpumemorybudgets.vramguard.io"
    original = json.loads(cluster.kubectl("get", "crd", crd_name, "-o", "json").stdout)
    fake_report = f"{conflict_node}-second"
    op = operator(cluster, key_file)
    try:
        # 1. rejected at the door: the API server names the field and the bound
        bad = budget_manifest("huge", {"perPod": {"vram": "1e400"}}, LADDER)
        with pytest.raises(ApiException) as refused:
            create_budget(custom, namespace, bad)
        assert refused.value.status == 422 and "spec.limits.perPod.vram" in refused.value.body
        assert "1e400 is above the maximum of 8Pi" in refused.value.body
        # 2. stored under an older CRD without the bounds: contained to itself
        cluster.kubectl("replace", "-f", "-", input=json.dumps(loosened(original)))
        try:
            wait_for(lambda: _stored(custom, namespace, bad), 20, "the budget stored under the older CRD")
        finally:
            restore = {**original, "metadata": {"name": crd_name}}
            restore.pop("status", None)
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(restore))
        # every budget of the test's namespace enforces: the held one must not block them
        create_budget(custom, namespace, budget_manifest("train", {"perPod": {"vram": "10Gi"}}, LADDER))
        canary = create_budget(custom, canary_ns, budget_manifest("canary", {"perPod": {"vram": "10Gi"}}, LADDER))
        pods = run_pods(core, namespace, [
            pod_manifest("dup", bad_node, {"app": "train"}),          # its report lists a pod twice
            pod_manifest("twice", conflict_node, {"app": "train"}),   # two reports claim its node
            pod_manifest("cheap", good_node, {"app": "train"}, cpu="100m"),  # forged original CPU
            pod_manifest("evict", good_node, {"app": "train"}),       # forged Evict step
            pod_manifest("junk", good_node, {"app": "train"}),        # malformed record
            _full(pod_manifest("full", good_node, {"app": "train"})),  # no room for the record
        ])
        c0 = run_pods(core, canary_ns, [pod_manifest("c0", good_node, {"app": "canary"})])["c0"]
        forged = {
            "cheap": {"vramguard.io/original-cpu": '{"main":{"limit":"64","request":"64"}}',
                      "vramguard.io/violations": _record("Throttle")},
            "evict": {"vramguard.io/violations": _record("Evict")},
            "junk": {"vramguard.io/violations": '[{"budget":'},
        }
        for name, ann in forged.items():
            core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": ann}})
        _second_report(custom, fake_report, conflict_node)
        good = [Usage(pods["cheap"], 1 * GI), Usage(pods["evict"], 12 * GI), Usage(pods["junk"], 12 * GI),
                Usage(pods["full"], 12 * GI), Usage(c0, 12 * GI)]
        with (Publisher(custom, good_node, lambda: good),
              Publisher(custom, bad_node, lambda: [Usage(pods["dup"], 12 * GI), Usage(pods["dup"], 1 * GI)]),
              Publisher(custom, conflict_node, lambda: [Usage(pods["twice"], 12 * GI)])):
            op.start()
            _check_contained(core, custom, namespace, canary_ns, canary, pods, c0, bad_node, conflict_node)
    finally:
        finish(op)
        for name in ("huge",):
            try:
                custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", name)
            except ApiException:
                pass
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, "nodegpuusages", fake_report)
        except ApiException:
            pass
        cluster.kubectl("delete", "namespace", canary_ns, "--wait=false", check=False)


def _check_contained(core: Any, custom: Any, namespace: str, canary_ns: str, canary: dict[str, Any],
                     pods: dict[str, Any], c0: Any, bad_node: str, conflict_node: str) -> None:
    # the canary elsewhere, and the over-limit pods on believed nodes, are enforced
    for ns, name, uid in ((canary_ns, "c0", c0.metadata.uid), (namespace, "evict", pods["evict"].metadata.uid),
                          (namespace, "junk", pods["junk"].metadata.uid)):
        wait_for(lambda n=ns, u=uid: "Throttled" in event_counts(core, n, u), 30, f"{name} throttled")
    wait_for(lambda: "Throttled" in event_counts(core, canary_ns, canary["metadata"]["uid"]), 10, "canary's copy")
    # the budget stored under the older CRD: held, naming the field and the value
    held = wait_for(lambda: (c := condition(get_budget(custom, namespace, "huge"), "Ready")) and
                    c["status"] == "False" and c, 20, "the older budget held")
    assert held["reason"] == "InvalidSpec" and "perPod.vram" in held["message"] and "1e400" in held["message"]
    huge_uid = get_budget(custom, namespace, "huge")["metadata"]["uid"]
    wait_for(lambda: "InvalidSpec" in event_counts(core, namespace, huge_uid), 10, "InvalidSpec Event")
    # the reports not believed: nothing done on their nodes' pods, the reason in DataStale and an Event
    stale = condition(get_budget(custom, namespace, "train"), "DataStale")
    assert stale["status"] == "True" and stale["reason"] == "ReportInvalid", stale
    assert bad_node in stale["message"] and "listed more than once" in stale["message"]
    assert conflict_node in stale["message"] and "2 NodeGPUUsage objects report this node" in stale["message"]
    wait_for(lambda: events_about(core, "default", _report_uid(custom, bad_node), "ReportInvalid"), 10,
             "ReportInvalid Event on the report")
    for name in ("dup", "twice"):
        p = core.read_namespaced_pod(name, namespace)
        assert not [k for k in p.metadata.annotations or {} if k.startswith("vramguard.io/")], name
    # the forged original CPU: never obeyed, reported, replaced
    cheap = pods["cheap"]
    wait_for(lambda: "StateRejected" in event_counts(core, namespace, cheap.metadata.uid), 10, "StateRejected")
    p = wait_for(lambda: (q := core.read_namespaced_pod("cheap", namespace)) and
                 "vramguard.io/original-cpu" not in (q.metadata.annotations or {}) and q, 10, "forgery removed")
    assert p.spec.containers[0].resources.limits["cpu"] == "100m"
    # the forged Evict step: the ladder ran anyway (Annotate, then Throttle)
    assert "StateRejected" in event_counts(core, namespace, pods["evict"].metadata.uid)
    assert in_order(core, namespace, pods["evict"].metadata.uid, STEPS[:2])
    # no room for the record: no step counts, nothing is done, the refusal is explained and retried
    full = pods["full"].metadata.uid
    failed = wait_for(lambda: events_about(core, namespace, full, "ActionFailed"), 10, "ActionFailed on full")
    assert "recording it on pod full failed" in failed[0].message and "Too long" in failed[0].message
    wait_for(lambda: (events_about(core, namespace, full, "ActionFailed")[0].count or 0) >= 2, 10, "a retry")
    assert set(event_counts(core, namespace, full)) == {"ActionFailed"}
    p = core.read_namespaced_pod("full", namespace)
    assert p.spec.containers[0].resources.limits["cpu"] == "2"
    assert not [k for k in p.metadata.annotations if k.startswith("vramguard.io/")]
    entry = [v for v in get_budget(custom, namespace, "train")["status"]["violations"] if v["pod"] == "full"]
    assert [(v.get("step"), v.get("nextStep")) for v in entry] == [(None, "Annotate")]


def _full(manifest: dict[str, Any]) -> dict[str, Any]:
    """A pod whose annotations leave no room for the operator's record (the API
    server allows 256 KiB of them in all)."""
    key = "example.com/blob"
    manifest["metadata"]["annotations"] = {key: "x" * (262144 - len(key) - 100)}
    return manifest


def _record(step: str) -> str:
    return json.dumps([{"budget": "train", "budgetUID": "forged", "kind": "PodVRAM",
                        "since": "2024-01-01T00:00:00Z", "openedAt": "2024-01-01T00:00:00Z", "step": step,
                        "stepTime": "2024-01-01T00:00:00Z"}])


def _stored(custom: Any, namespace: str, manifest: dict[str, Any]) -> bool:
    try:
        create_budget(custom, namespace, manifest)
    except ApiException as err:
        return err.status == 409
    return True


def _second_report(custom: Any, name: str, node: str) -> None:
    custom.create_cluster_custom_object(GROUP, VERSION, "nodegpuusages", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeGPUUsage", "metadata": {"name": name},
        "spec": {"nodeName": node}})


def _report_uid(custom: Any, node: str) -> str:
    return custom.get_cluster_custom_object(GROUP, VERSION, "nodegpuusages", node)["metadata"]["uid"]
