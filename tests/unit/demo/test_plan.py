"""The demo runner's pure parts (hack/demo/plan.py): the scenario, the agents'
scenario written from it, the kubelet stand-in's patch and the summary."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from vramguard_sim.gpumem import OOMKill
from vramguard_sim.scenario import Scenario
from vramguard_sim.simgpu import SimOOMKill

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "hack" / "demo" / "scenario.yaml"

_spec = importlib.util.spec_from_file_location("demo_plan", ROOT / "hack" / "demo" / "plan.py")
assert _spec is not None and _spec.loader is not None
P = importlib.util.module_from_spec(_spec)
sys.modules["demo_plan"] = P  # dataclasses look their module up while the class is made
_spec.loader.exec_module(P)


def api_pod(name: str, ns: str, labels: dict[str, str], uid: str | None = None, phase: str = "Running",
            owner: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "labels": labels, **meta}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "metadata": metadata,
        "spec": {"nodeName": "n1", "containers": [
            {"name": "main", "image": "img:1",
             "resources": {"limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "4", "memory": "8Gi"}}}]},
        "status": {"phase": phase, "startTime": "2026-11-30T12:00:00Z",
                   "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": "2026-11-30T12:00:01Z"}}}]},
    }


def demo_pods() -> list[dict[str, Any]]:
    """One running pod for each pod of the real demo scenario, labelled as its select says."""
    sc = P.load_scenario(SCENARIO)
    return [api_pod(f"{p.id}-pod", p.namespace, dict(p.labels)) for p in sc.pods]


def test_the_demo_scenario_loads_and_its_agent_scenario_is_valid_for_the_agent():
    sc = P.load_scenario(SCENARIO)
    assert sc.node_names == ["gpu-h100-ts", "gpu-a100-mig", "gpu-a10-vgpu"]
    assert sc.speed > 1 and sc.short_duration_s < sc.duration_s <= 600
    ids = {p.id for p in sc.pods}
    assert set().union(*sc.expect.values()) == ids  # every pod has an expected outcome
    assert sc.saved_from_oom == {"chat"}
    resolved = P.resolve(sc, demo_pods())
    agents = Scenario.model_validate(resolved.agent_scenario)  # the agent's own model accepts it
    names = {(p.namespace, p.name) for n in agents.nodes for p in n.pods}
    assert names == {(p.namespace, f"{p.id}-pod") for p in sc.pods}
    assert set(resolved.by_uid.values()) == ids


def test_resolve_needs_exactly_one_running_pod_per_select():
    sc = P.load_scenario(SCENARIO)
    pods = demo_pods()
    chat = next(p for p in pods if p["metadata"]["name"] == "chat-pod")
    with pytest.raises(LookupError, match="pod chat: .*found none"):
        P.resolve(sc, [p for p in pods if p is not chat])
    twin = copy.deepcopy(chat)
    twin["metadata"].update(name="chat-twin", uid="uid-twin")
    with pytest.raises(LookupError, match=r"pod chat: .*\['chat-pod', 'chat-twin'\]"):
        P.resolve(sc, [*pods, twin])
    twin["metadata"]["deletionTimestamp"] = "2026-11-30T12:00:00Z"  # a terminating pod does not count
    assert P.resolve(sc, [*pods, twin]).pods["chat"]["metadata"]["name"] == "chat-pod"
    pending = copy.deepcopy(chat)
    pending["status"]["phase"] = "Pending"
    with pytest.raises(LookupError):
        P.resolve(sc, [p if p is not chat else pending for p in pods])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["nodes"][0]["pods"][1].update(id=d["nodes"][0]["pods"][0]["id"]), "duplicate pod ids"),
        (lambda d: d["expect"]["evicted"].append("nobody"), "expect.evicted: unknown pod ids"),
        (lambda d: d["objects"][1]["metadata"].update(namespace="elsewhere"), "namespace 'elsewhere'"),
        (lambda d: d["nodes"][0]["pods"][0].pop("select"), "needs id and select.namespace"),
    ],
)
def test_scenario_errors_name_the_field(tmp_path, edit, message):
    import yaml

    data = yaml.safe_load(SCENARIO.read_text())
    edit(data)
    bad = tmp_path / "s.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message):
        P.load_scenario(bad)


def test_kubelet_stand_in_reports_resources_and_follows_a_resize():
    pod = api_pod("w0", "ns", {})
    patch = P.kubelet_status_patch(pod)
    assert patch is not None
    (status,) = patch["status"]["containerStatuses"]
    assert status["resources"] == {"limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "4", "memory": "8Gi"}}
    assert status["state"] == {"running": {"startedAt": "2026-11-30T12:00:01Z"}}
    pod["status"]["containerStatuses"] = patch["status"]["containerStatuses"]
    assert P.kubelet_status_patch(pod) is None  # already reported
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "500m"  # a pods/resize
    resized = P.kubelet_status_patch(pod)
    assert resized is not None and resized["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"] == "500m"
    pod["status"]["phase"] = "Succeeded"
    assert P.kubelet_status_patch(pod) is None


def event(uid: str, reason: str, component: str = "vramguard", kind: str = "Pod", t: str = "2026-11-30T12:00:10Z",
          message: str = "m") -> dict[str, Any]:
    return {"metadata": {"name": f"{uid}.{reason}", "uid": f"e-{uid}-{reason}"},
            "involvedObject": {"kind": kind, "uid": uid, "name": uid},
            "reason": reason, "message": message, "source": {"component": component},
            "firstTimestamp": t, "lastTimestamp": t, "count": 1}


def test_outcomes_from_vramguard_events_and_the_check():
    sc = P.load_scenario(SCENARIO)
    pods = demo_pods()
    resolved = P.resolve(sc, pods)
    uid = {pid: p["metadata"]["uid"] for pid, p in resolved.pods.items()}
    replacement = api_pod("embedder-new", "vg-demo-serving", {"app": "embedder"}, uid="uid-new",
                          owner={"kind": "ReplicaSet", "name": "embedder-5d4f"}, creationTimestamp="2026-11-30T12:01:00Z")
    replacement["metadata"]["labels"]["pod-template-hash"] = "5d4f"
    events = [
        event(uid["embedder"], "LeakDetected", t="2026-11-30T12:00:40Z"),
        event(uid["embedder"], "Evicting", t="2026-11-30T12:01:00Z"),
        event(uid["finetune"], "LimitExceeded"),
        event(uid["finetune"], "Throttled", t="2026-11-30T12:00:30Z"),
        event(uid["finetune"], "DevicePressure", t="2026-11-30T12:00:45Z"),
        event(uid["sdxl"], "AboveWarningThreshold"),
        event(uid["chat"], "Killing", component="kubelet"),  # not vramguard's
        event("budget-uid", "Evicting", kind="GPUMemoryBudget"),  # the budget's copy
    ]
    seen = {p["metadata"]["uid"]: p for p in [*pods, replacement]}
    results = {r.id: r for r in P.outcomes(resolved, events, seen, sc)}
    assert results["embedder"].outcomes == ["annotated", "evicted"]
    assert [e.reason for e in results["embedder"].events] == ["LeakDetected", "Evicting"]
    assert results["finetune"].outcomes == ["annotated", "throttled", "evicted"]
    assert results["sdxl"].outcomes == ["leftAlone"] and results["chat"].events == []
    new = results["embedder~new"]
    assert new.outcomes == ["leftAlone"] and new.workload == "Deployment embedder"
    mismatch = P.check(sc.expect, list(results.values()))
    assert mismatch["evicted"] == (["sweep-2"], [])  # sweep-2 was expected to be evicted
    assert mismatch["annotated"] == (["rerank", "sweep-0", "sweep-1", "sweep-2"], [])
    assert mismatch["leftAlone"] == ([], ["rerank", "sweep-0", "sweep-1", "sweep-2"])
    summary = P.summary_json(list(results.values()), mismatch, {"wallSeconds": 90})
    assert summary["outcomes"]["evicted"] == ["embedder", "finetune"] and summary["wallSeconds"] == 90
    assert summary["mismatch"]["evicted"] == {"missing": ["sweep-2"], "unexpected": []}


def test_workload_of():
    rs = api_pod("chat-7d9f-x", "ns", {"pod-template-hash": "7d9f"}, owner={"kind": "ReplicaSet", "name": "chat-7d9f"})
    assert P.workload_of(rs) == "Deployment chat"
    assert P.workload_of(api_pod("w", "ns", {}, owner={"kind": "StatefulSet", "name": "db"})) == "StatefulSet db"
    assert P.workload_of(api_pod("sdxl-0", "ns", {})) == "Pod sdxl-0"


def test_budget_only_events_leave_out_the_copies_of_pod_events():
    pod_copy = event("uid-w0", "LimitExceeded", message="budget ns/b: total ... Annotated.")
    budget_copy = {**event("budget-uid", "LimitExceeded", kind="GPUMemoryBudget", message=pod_copy["message"]),
                   "involvedObject": {"kind": "GPUMemoryBudget", "uid": "budget-uid", "name": "sweep"}}
    recovered = {**event("budget-uid", "Recovered", kind="GPUMemoryBudget", t="2026-11-30T12:01:00Z",
                         message="budget ns/sweep: total VRAM back under 60Gi"),
                 "involvedObject": {"kind": "GPUMemoryBudget", "uid": "budget-uid", "name": "sweep"}}
    other = {**recovered, "source": {"component": "someone-else"}, "reportingComponent": "someone-else"}
    (only,) = P.budget_only_events([pod_copy, budget_copy, recovered, other])
    assert only[0] == "sweep" and only[1].reason == "Recovered" and only[1].message.endswith("under 60Gi")


_oom_spec = importlib.util.spec_from_file_location("demo_oom", ROOT / "hack" / "demo" / "oom.py")
assert _oom_spec is not None and _oom_spec.loader is not None
OOM = importlib.util.module_from_spec(_oom_spec)
sys.modules["demo_oom"] = OOM
_oom_spec.loader.exec_module(OOM)


def test_without_vramguard_the_fine_tune_takes_chats_room_and_chat_dies():
    """The demo's own scenario on the simulated GPUs with nobody acting: the
    neighbour within its share is the one killed, within the short run."""
    sc = P.load_scenario(SCENARIO)
    resolved = P.resolve(sc, demo_pods())
    names = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": i for i, p in resolved.pods.items()}
    step = sc.sample_interval_s * sc.speed
    without = OOM.without_vramguard(resolved.agent_scenario, sc.short_duration_s * sc.speed, step)
    assert [names[f"{u.kill.namespace}/{u.kill.pod}"] for u in without][:1] == ["chat"]
    first = without[0]
    assert first.kill.kill.held_bytes + first.kill.kill.requested_bytes <= (81559 - 579) * 2**20 // 4  # within its share
    text = OOM.describe(first, names)
    assert text.startswith("chat is killed by CUDA out of memory after") and "finetune held" in text
    lines = OOM.summarize(without, names)  # one line per pod, its restarts' kills after the first
    assert len(lines) == len({(u.kill.namespace, u.kill.pod) for u in without}) and lines[0].startswith(text)
    again = [u for u in without if u.kill.pod == first.kill.pod][1:]
    assert ("killed again" in lines[0]) == bool(again)
    if len(again) > 1:
        assert f"killed again {len(again)} times: " in lines[0]


def test_a_crash_loop_is_summarized_by_its_start_and_end():
    kills = [OOM.Unguarded(SimOOMKill(60.0 * m, "n1", "ns", "chat-1", "server",
                                      OOMKill("GPU-1", 7, "ns/chat-1", 15 * 2**30, 2**29, 2**20), None), ())
             for m in (73, 77, 80, 84, 87, 92, 99)]
    (line,) = OOM.summarize(kills, {"ns/chat-1": "chat"})
    assert line.startswith("chat is killed by CUDA out of memory after 1h13m")
    assert line.endswith("; restarted, killed again 6 times: 1h17m, 1h20m, 1h24m, ..., 1h39m")
    (two,) = OOM.summarize(kills[:2], {"ns/chat-1": "chat"})
    assert two.endswith("; restarted, killed again at 1h17m")


def test_kills_in_the_agents_logs(tmp_path):
    log = tmp_path / "agent-n1.log"
    log.write_text(
        "2026-12-01 10:00:00,000 WARNING vramguard.agent.sim: node n1 t=3540s: pod ns/chat-7d9f container server "
        "(pid 20002) killed by CUDA out of memory on GPU-1: held 16Gi, an allocation of 1Gi failed with 0 free; "
        "the container restarts at t=3550s\nother line\n"
    )
    [kill] = OOM.kills_in_logs([log, tmp_path / "missing.log"])
    assert (kill.node, kill.namespace, kill.pod, kill.t_s) == ("n1", "ns", "chat-7d9f", 3540.0)


def test_saved_means_killed_without_never_killed_with_and_running_at_the_end():
    assert OOM.saved(["chat"], ["chat", "finetune"], [], ["chat", None]) == (["chat"], [])
    assert OOM.saved(["chat"], ["finetune"], [], ["chat"]) == ([], ["chat"])  # not killed without: nothing saved
    assert OOM.saved(["chat"], ["chat"], ["chat"], ["chat"]) == ([], ["chat"])  # killed during the run too
    assert OOM.saved(["chat"], ["chat"], [], []) == ([], ["chat"])  # evicted, or gone, at the end


def test_the_run_without_vramguard_is_judged_by_the_one_classifier_with_the_live_shares():
    sc = P.load_scenario(SCENARIO)
    resolved = P.resolve(sc, demo_pods())
    without = OOM.without_vramguard(resolved.agent_scenario, sc.short_duration_s * sc.speed,
                                    sc.sample_interval_s * sc.speed)
    device = without[0].kill.kill.device
    judged = OOM.judged_without(without, {device: (81559 - 579) * 2**20 // 4})  # the node's share: 4 replicas
    assert (judged[0].kind, judged[0].blame) == ("GPUOutOfMemory", "Innocent")  # chat, within its share
    assert OOM.innocent(judged) >= 1 and sum(OOM.counts(judged).values()) == len(without)
    unknown = OOM.judged_without(without[:1], {})  # no share known: no blame either way
    assert (unknown[0].kind, unknown[0].blame) == ("GPUOutOfMemory", "Unknown")
    tiny = OOM.judged_without(without[:1], {device: 2**20})  # it wanted more than a 1Mi share: its own
    assert tiny[0].blame == "Own"


def test_the_live_report_reads_the_records_as_vramguard_oom_does_and_says_when_it_cannot():
    from tests.unit.agent.stubapi import StubAPI, status_body
    from tests.unit.operator.test_oom_publisher import NODE, TORCH, pod, report_body

    stub = StubAPI()
    try:
        victim = pod("victim", "c" * 64, "Error", 1, TORCH)
        pods = {"items": [victim, pod("done", "d" * 64, "Completed", 0, None)]}
        stub.respond("GET", r"/nodegpuusages$", *[(200, {"items": [report_body()]})] * 2)  # two reads
        stub.respond("GET", r"/api/v1/pods$", *[(200, pods)] * 2)
        stub.respond("GET", r"/api/v1/nodes$", *[(200, {"items": [NODE]})] * 2)
        lines, body = OOM.live_report(stub.api_client(), [], ["ml"])
        assert lines[0].startswith("Innocent OOM kills") and "with vramguard 1 (live" in lines[0]
        assert "without 0 (the same scenario replayed" in lines[0]
        assert lines[3] == "vramguard oom:" and "ml" in lines[5] and "victim" in lines[5] and "Innocent" in lines[5]
        assert body["live"]["byVerdict"] == {"GPUOutOfMemory/Innocent": 1}  # the normal exit is no OOM kill
        assert [r["pod"] for r in body["live"]["records"]] == ["victim"]
        lines, body = OOM.live_report(stub.api_client(), [], ["vg-demo"])  # another namespace's kill is not the demo's
        assert "with vramguard 0 (live" in lines[0] and lines[-1] == "    No OOM kills found."
        stub.respond("GET", r"/nodegpuusages$", (403, status_body(403, "Forbidden")))
        lines, body = OOM.live_report(stub.api_client(), [], ["ml"])
        assert lines[0].startswith("OOM records: cannot read the cluster:") and "error" in body
    finally:
        stub.close()
