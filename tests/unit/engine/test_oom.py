"""End record + pod + shares -> finding, Event and metric labels (engine/oom.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from vramguard_api.ends import EndRecord
from vramguard_operator.engine.oom import budget_event, finding, pod_event, ram_limit, terminated

GIB = 1 << 30
DEV = "GPU-1"
CID = "a" * 64
TORCH = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22 GiB"


def record(held: int, neighbours: list[tuple[str, int]], **kw: Any) -> EndRecord:
    return EndRecord.model_validate({
        "id": 7, "time": datetime(2026, 1, 1, tzinfo=UTC), "kind": "ContainerEnd", "podUID": "u1",
        "namespace": "ml", "name": "victim", "containerID": CID, "containerName": "main",
        "devices": [{"uuid": DEV, "podBytes": held, "freeBytes": GIB // 2, "usableBytes": 22 * GIB,
                     "neighbours": [{"uid": n, "namespace": "ml", "name": n, "usedBytes": b} for n, b in neighbours]}],
        **kw,
    })


def pod(reason: str, exit_code: int, message: str | None = None, memory: str | None = "2Gi") -> dict[str, Any]:
    term = {"reason": reason, "exitCode": exit_code, "containerID": f"containerd://{CID}"}
    if message:
        term["message"] = message
    limits = {"memory": memory} if memory else {}
    return {"metadata": {"namespace": "ml", "name": "victim", "uid": "u1"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"containerStatuses": [{"name": "main", "containerID": "containerd://" + "b" * 64,
                                              "state": {"running": {}},
                                              "lastState": {"terminated": term}}]}}


def test_an_innocent_gpu_oom_names_the_device_its_share_and_the_neighbour_above_its_share():
    f = finding(record(4 * GIB, [("greedy", 16 * GIB), ("small", 2 * GIB)]), pod("Error", 1, TORCH), {DEV: 11 * GIB})
    assert (f.verdict.kind, f.verdict.blame, f.labels) == ("GPUOutOfMemory", "Innocent", ("ml", "GPUOutOfMemory",
                                                                                            "Innocent"))
    event = pod_event(f)
    assert event is not None and (event.type, event.reason) == ("Warning", "GPUOutOfMemory")
    for text in (DEV, "512Mi free of 22Gi", "innocent", "within its share of 11Gi", "ml/greedy held 16Gi, 5Gi above",
                 "PyTorch said"):
        assert text in event.message, text
    assert "ml/small" not in event.message
    other = budget_event(f, "ml/team-a")
    assert other is not None and other.message.startswith("budget ml/team-a: pod ml/victim:")
    assert other.key != event.key


def test_own_when_it_grew_past_its_share():
    f = finding(record(10 * GIB, [("other", 5 * GIB)]), pod("Error", 1, TORCH), {DEV: 11 * GIB})
    assert f.verdict.blame == "Own"
    event = pod_event(f)
    assert event is not None and "above its share of 11Gi" in event.message


def test_oomkilled_is_host_ram_with_its_limit_and_vram_named_as_not_the_cause():
    f = finding(record(4 * GIB, [], ramWorkingSetBytes=2 * GIB), pod("OOMKilled", 137), {DEV: 11 * GIB})
    event = pod_event(f)
    assert event is not None and event.reason == "HostOutOfMemory"
    assert "not VRAM" in event.message and "against a limit of 2Gi" in event.message
    assert f.labels == ("ml", "HostOutOfMemory", "NotApplicable")


def test_a_normal_exit_has_no_event():
    f = finding(record(4 * GIB, []), pod("Completed", 0), {DEV: 11 * GIB})
    assert f.verdict.kind == "NotMemory" and pod_event(f) is None and budget_event(f, "b") is None


def test_a_gone_pod_is_judged_on_the_record_alone():
    f = finding(record(4 * GIB, [], oomKillsBefore=0, oomKillsAfter=1), None, {})
    assert f.verdict.kind == "HostOutOfMemory" and f.who == "ml/victim"
    assert finding(record(4 * GIB, []), None, {}).verdict.kind == "NotMemory"


def test_terminated_matches_the_container_id_and_limits_parse():
    r = record(GIB, [])
    assert terminated(pod("Error", 1), r) is not None
    assert terminated(pod("Error", 1), r.model_copy(update={"container_id": "c" * 64})) is None
    assert ram_limit(pod("Error", 1), "main") == 2 * GIB
    assert ram_limit(pod("Error", 1, memory="lots"), "main") is None
    assert ram_limit(pod("Error", 1, memory=None), "main") is None
