"""Attribution of host pids to pods from /proc/<pid>/cgroup: every fixture case, and
generated variants of each kind of case (hypothesis)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from vramguard_agent.cgroups import Attribution, NotInPod, attribute_pid, parse_proc_cgroup

ROOT = Path(__file__).resolve().parents[3]
# A copy of the shared fixture (shared/fixtures/cgroup/cases.yaml), so that a clone tests alone.
CASES_FILE = Path(__file__).with_name("cgroup_cases.yaml")
SHARED_CASES = ROOT.parent / "shared" / "fixtures" / "cgroup" / "cases.yaml"
CASES = yaml.safe_load(CASES_FILE.read_text())


@pytest.mark.skipif(not SHARED_CASES.exists(), reason="no shared fixtures next to this checkout")
def test_fixture_copy_is_current():
    assert CASES_FILE.read_text() == SHARED_CASES.read_text()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_fixture_case(case):
    found = parse_proc_cgroup(case["cgroup"])
    expect = case["expect"]
    if expect is None:
        assert isinstance(found, NotInPod)
        assert found.reason.startswith("not in a pod")
        assert found.to_json()["pod_uid"] is None
        return
    assert isinstance(found, Attribution)
    assert found.to_json() == {k: expect[k] for k in ("pod_uid", "container_id", "runtime", "qos")}
    assert found.static_pod == bool(expect.get("static_pod", False))


# --- generated variants --------------------------------------------------------

hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)
hex32 = st.text("0123456789abcdef", min_size=32, max_size=32)
uuids = st.uuids(version=4).map(str)
qos_levels = st.sampled_from(["guaranteed", "burstable", "besteffort"])
V1_CONTROLLERS = ["hugetlb", "devices", "memory", "net_cls,net_prio", "perf_event", "freezer", "cpu,cpuacct", "pids"]


@dataclass(frozen=True)
class Variant:
    text: str
    uid: str
    container_id: str
    runtime: str
    qos: str | None


def _systemd_pod_path(uid: str, qos: str, kind: bool) -> list[str]:
    prefix = "kubelet-" if kind else ""
    level = "" if qos == "guaranteed" else f"-{qos}"
    segments = [f"{prefix}kubepods.slice"]
    if qos != "guaranteed":
        segments.append(f"{prefix}kubepods{level}.slice")
    segments.append(f"{prefix}kubepods{level}-pod{uid.replace('-', '_')}.slice")
    return segments


def _cgroupfs_pod_path(uid: str, qos: str) -> list[str]:
    return ["kubepods", *([] if qos == "guaranteed" else [qos]), f"pod{uid}"]


def _lines(version: str, path: str, other: str | None = None) -> str:
    if version == "v2":
        return f"0::{path}\n"
    lines = [f"{13 - i}:{c}:{path}" for i, c in enumerate(V1_CONTROLLERS)]
    lines += ["3:rdma:/", "2:misc:/", f"1:name=systemd:{other or path}"]
    if version == "hybrid":
        lines.append(f"0::{other or path}")
    return "\n".join(lines) + "\n"


@st.composite
def pod_variants(draw) -> Variant:
    """A /proc/<pid>/cgroup of a container process, in any layout the kubelet produces."""
    uid = draw(st.one_of(uuids, hex32))
    cid = draw(hex64)
    qos = draw(qos_levels)
    version = draw(st.sampled_from(["v1", "v2", "hybrid"]))
    driver = draw(st.sampled_from(["systemd", "cgroupfs"]))
    if driver == "cgroupfs":
        segments, runtime = [*_cgroupfs_pod_path(uid, qos), cid], "unknown"
        expected_qos: str | None = qos
    else:
        kind = draw(st.booleans())
        runtime = draw(st.sampled_from(["containerd", "cri-o", "docker"]))
        scope = {
            "containerd": f"cri-containerd-{cid}.scope",
            "cri-o": draw(st.sampled_from([f"crio-{cid}.scope", f"crio-{cid}"])),
            "docker": f"docker-{cid}.scope",
        }[runtime]
        segments = [*_systemd_pod_path(uid, qos, kind), scope]
        if kind:
            node = draw(hex64)
            segments = ["system.slice", f"docker-{node}.scope", "kubelet.slice", *segments]
        expected_qos = qos
    # The reader may sit in a cgroup namespace: the path is then relative, "/.."-prefixed.
    cut = draw(st.integers(0, 2))
    if cut:
        keep = segments[-3:] if driver == "systemd" else segments[-(1 + cut) :]
        if driver == "cgroupfs" and keep[0] not in ("kubepods", "burstable", "besteffort"):
            expected_qos = None  # the QoS directory is above the namespace root
        segments = ["..", *(".." for _ in range(cut - 1)), *keep]
    path = "/" + "/".join(segments)
    return Variant(_lines(version, path), uid, cid, runtime, expected_qos)


@st.composite
def colon_variants(draw) -> Variant:
    """containerd + systemd driver on cgroup v1 shown in runc's 'slice:prefix:id' form."""
    uid, cid, qos = draw(uuids), draw(hex64), draw(qos_levels)
    level = "" if qos == "guaranteed" else f"-{qos}"
    name = f"kubepods{level}-pod{uid.replace('-', '_')}.slice:cri-containerd:{cid}"
    under_service = f"/system.slice/containerd.service/{name}"
    return Variant(_lines("v1", f"/{name}", under_service), uid, cid, "containerd", qos)


host_paths = st.one_of(
    uuids.map(lambda u: f"/user.slice/user-1000.slice/user@1000.service/tmux-spawn-{u}.scope"),
    hex64.map(lambda h: f"/docker/{h}"),
    hex64.map(lambda h: f"/system.slice/docker-{h}.scope"),
    hex64.map(lambda h: f"/machine.slice/libpod-{h}.scope"),
    uuids.map(lambda u: f"/user.slice/pod{u}/x"),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=5, max_size=30).map(lambda t: f"/docker/buildkit/{t}"),
    st.sampled_from(["/", "/init.scope", "/system.slice/kubelet.service", "/kubepods.slice"]),
)


@settings(max_examples=300, deadline=None)
@given(pod_variants())
def test_generated_pod_variants(variant):
    found = parse_proc_cgroup(variant.text)
    assert isinstance(found, Attribution), variant.text
    assert found.pod_uid == variant.uid
    assert found.container_id == variant.container_id
    assert found.runtime == variant.runtime
    assert found.qos == variant.qos
    assert found.static_pod == ("-" not in variant.uid)


@settings(max_examples=100, deadline=None)
@given(colon_variants())
def test_generated_colon_form(variant):
    found = parse_proc_cgroup(variant.text)
    assert isinstance(found, Attribution)
    assert (found.pod_uid, found.container_id, found.runtime, found.qos) == (
        variant.uid,
        variant.container_id,
        "containerd",
        variant.qos,
    )


@settings(max_examples=200, deadline=None)
@given(host_paths, st.sampled_from(["v1", "v2", "hybrid"]))
def test_generated_host_processes_are_not_in_a_pod(path, version):
    found = parse_proc_cgroup(_lines(version, path))
    assert isinstance(found, NotInPod)
    assert found.reason.startswith("not in a pod")


def test_pod_without_container_segment_is_attributed_to_the_pod_only():
    uid = str(uuid.uuid4())
    found = parse_proc_cgroup(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice\n")
    assert isinstance(found, Attribution)
    assert (found.pod_uid, found.container_id, found.qos) == (uid, None, "guaranteed")


def test_crio_conmon_belongs_to_the_pod_not_a_container():
    uid, cid = str(uuid.uuid4()), "a" * 64
    text = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice/crio-conmon-{cid}.scope\n"
    found = parse_proc_cgroup(text)
    assert isinstance(found, Attribution)
    assert (found.pod_uid, found.container_id, found.runtime) == (uid, None, "cri-o")


def test_v1_line_naming_a_container_wins_over_one_naming_only_the_pod():
    uid, cid = str(uuid.uuid4()), "b" * 64
    text = f"12:memory:/kubepods/burstable/pod{uid}\n11:cpu:/kubepods/burstable/pod{uid}/{cid}\n"
    found = parse_proc_cgroup(text)
    assert isinstance(found, Attribution) and found.container_id == cid


def test_malformed_lines_are_skipped_and_the_rest_used():
    uid, cid = str(uuid.uuid4()), "c" * 64
    text = f"garbage line\n12:memory\n0::/kubepods/besteffort/pod{uid}/{cid}\n"
    found = parse_proc_cgroup(text)
    assert isinstance(found, Attribution) and (found.pod_uid, found.qos) == (uid, "besteffort")


def test_only_malformed_lines_give_a_reason_naming_the_problem():
    found = parse_proc_cgroup("this is not a cgroup file\n")
    assert isinstance(found, NotInPod)
    assert "no valid 'ID:controllers:path' line" in found.reason
    assert "this is not a cgroup file" in found.reason
    assert isinstance(parse_proc_cgroup(""), NotInPod)


# --- reading /proc and the attribute command -----------------------------------


def _proc(tmp_path: Path, pid: int, text: str) -> Path:
    (tmp_path / str(pid)).mkdir(parents=True)
    (tmp_path / str(pid) / "cgroup").write_text(text)
    return tmp_path


def test_attribute_pid_reads_the_proc_root(tmp_path):
    case = CASES[3]
    _proc(tmp_path, 4242, case["cgroup"])
    found = attribute_pid(4242, tmp_path)
    assert isinstance(found, Attribution) and found.pod_uid == case["expect"]["pod_uid"]
    with pytest.raises(FileNotFoundError):
        attribute_pid(4243, tmp_path)


def _attribute_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT / 'api'}:{ROOT / 'agent'}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "vramguard_agent", "attribute", *args], capture_output=True, text=True, env=env
    )


def test_attribute_command_exit_codes(tmp_path):
    pod_case = next(c for c in CASES if c["name"] == "kind-nested-in-docker-node")
    host_case = next(c for c in CASES if c["name"] == "negative-user-session-uuid")
    _proc(tmp_path, 100, pod_case["cgroup"])
    _proc(tmp_path, 101, host_case["cgroup"])

    out = _attribute_cli("100", "--proc-root", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {k: pod_case["expect"][k] for k in ("pod_uid", "container_id", "runtime", "qos")}

    out = _attribute_cli("101", "--proc-root", str(tmp_path))
    assert out.returncode == 0
    body = json.loads(out.stdout)
    assert body["pod_uid"] is None and body["reason"].startswith("not in a pod")

    out = _attribute_cli("102", "--proc-root", str(tmp_path))
    assert out.returncode != 0
    assert "cannot read" in out.stderr and out.stdout == ""
