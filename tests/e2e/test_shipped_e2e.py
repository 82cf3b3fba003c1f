"""The chart as shipped (issue 27): the images built by hack/images/build.sh,
imported into the real node's containerd, installed with the README's
``helm install`` (only image, pull-policy and placement values changed, plus
the test-only ``agent.simulatedDriverDir``), run the operator and the agent as
real containers on real-node-1 under the chart's securityContext.

Every fact is read from a source vramguard's code does not touch: the
kubelet's pod status, the kernel (/proc of the containers' host PIDs, cgroup
files), containerd's task list, the API server's audit log (who made each
request, with the token of which pod), the simulated driver's own state.
Skipped, saying why, where the real node or the image archives are missing.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from .chart_rbac import AuditLog
from .conftest import Cluster
from .operator_harness import GROUP, VERSION, budget_manifest, events_about
from .realnode import RealNode, cpu_quota_us, pod
from .shipped import (
    CHART,
    NAMESPACE,
    SIM_TAG,
    TAG,
    Release,
    archive,
    missing_images,
    pod_requests,
    real_node_values,
)
from .test_real_node_e2e import run_pod, until

pytestmark = pytest.mark.e2e
GIB = 1 << 30
UID = 65532  # the chart's runAsUser and the images' USER
LADDER = [{"action": "Annotate", "after": "0s"},
          {"action": "Throttle", "after": "1s", "cpuLimit": "100m"},
          {"action": "Evict", "after": "6s"}]


@pytest.fixture(scope="module")
def release(cluster: Cluster, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """Both images imported and the chart installed on the real node; uninstalled afterwards."""
    if (why := missing_images()) is not None:
        pytest.skip(why)
    if not real_node.simgpu_socket.is_socket():
        pytest.skip(f"no simulated GPU driver at {real_node.simgpu_socket}: the agent pod would have no GPU to read")
    if cluster.helm is None:
        pytest.skip("helm binary not found; hack/cluster/build.sh builds it")
    values = tmp_path_factory.mktemp("shipped") / "real-node-values.yaml"
    values.write_text(yaml.safe_dump(real_node_values(real_node)))
    r = Release(cluster, real_node, cluster.helm, values)
    r.uninstall()  # left over from an interrupted run
    r.timings["import_s"] = r.import_images(archive("operator", TAG), archive("agent", SIM_TAG))
    audit = AuditLog.of_local_cluster()
    r.timings["audit_offset"] = audit.offset()
    try:
        r.timings["install_s"] = r.install()
    except AssertionError as err:
        logs = r.logs()
        r.uninstall()  # a release whose webhooks do not answer would block every budget write
        pytest.fail(f"{err}\n{logs}")
    yield r
    r.uninstall()


def test_both_pods_are_ready_through_the_charts_probes_as_confined_containers(release: Release) -> None:
    for component, image in (("operator", f"vramguard/operator:{TAG}"), ("agent", f"vramguard/agent:{SIM_TAG}")):
        obj = release.pod(component)
        status = obj["status"]
        assert obj["spec"]["nodeName"] == release.node.name
        ready = {c["type"]: c["status"] for c in status["conditions"]}
        assert ready["Ready"] == "True", f"{component}: {status}"
        (container,) = status["containerStatuses"]
        assert container["ready"] and container["restartCount"] == 0, f"{component}: {container}\n{release.logs()}"
        assert container["image"].endswith(image)
        # The kernel's view of the container's process: the chart's non-root user,
        # no privileges to gain, no capabilities, a read-only root filesystem.
        pid = release.host_pid(obj)
        proc = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert [int(u) for u in proc["Uid"].split()] == [UID] * 4
        assert proc["NoNewPrivs"].strip() == "1" and int(proc["CapEff"], 16) == 0
        root = next(line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                    if line.split()[4] == "/")
        assert "ro" in root[5].split(","), f"{component}: root mount {root}"
    # hostPID: the agent is in the node's PID namespace, this test's (NVML reports host PIDs).
    agent_pid = release.host_pid(release.pod("agent"))
    assert Path(f"/proc/{agent_pid}/ns/pid").readlink() == Path("/proc/self/ns/pid").readlink()


def node_report(release: Release) -> dict[str, Any]:
    out = release.cluster.kubectl("get", "nodegpuusage", release.node.name, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def test_the_agent_pod_reports_its_node_and_attributes_a_real_workload(
    release: Release, namespace: str
) -> None:
    obj, host_pid = run_pod(release.cluster, release.node, namespace,
                            pod(release.node, "trainer", ["/bin/simcuda", "--every", "200ms", "1Gi"], gpu=True))
    uid = obj["metadata"]["uid"]
    container_id = obj["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]

    def attributed() -> dict[str, Any] | None:
        pods = {p["uid"]: p for p in (node_report(release).get("status") or {}).get("pods", [])}
        found = pods.get(uid)
        return found if found and found.get("vramBytes") == GIB else None

    found = until("the agent pod's report to attribute the trainer's 1 GiB", attributed, timeout=60, every=1)
    assert (found["namespace"], found["name"]) == (namespace, "trainer")
    containers = {c["containerID"]: c for c in found["containers"]}
    assert (containers[container_id].get("name"), containers[container_id]["vramBytes"]) == ("main", GIB)
    report = node_report(release)
    assert report["status"]["agent"]["backend"] == "nvml"  # NVML calls, answered by the simulated driver
    assert host_pid not in {u["pid"] for u in report["status"].get("unattributed", [])}
    # Written with the agent pod's own token (the API server's audit log).
    agent = release.pod("agent")["metadata"]["name"]
    events = pod_requests(AuditLog.of_local_cluster().events(int(release.timings["audit_offset"])), agent)
    refs = [(e["verb"], e.get("objectRef") or {}) for e in events]
    writes = {(verb, ref.get("subresource"), ref.get("name")) for verb, ref in refs
              if ref.get("resource") == "nodegpuusages" and verb in ("create", "update", "patch")}
    assert writes and {name for _, _, name in writes} == {release.node.name}, writes


def test_the_operator_pod_annotates_throttles_and_evicts_through_a_budget(
    release: Release, namespace: str
) -> None:
    api = release.cluster.api_client()
    core, custom = CoreV1Api(api), CustomObjectsApi(api)
    obj, host_pid = run_pod(release.cluster, release.node, namespace,
                            pod(release.node, "hog", ["/bin/simcuda", "--every", "200ms", "2Gi"], gpu=True,
                                cpu=("50m", "500m"), labels={"app": "hog"}))
    uid = obj["metadata"]["uid"]
    assert cpu_quota_us(host_pid) == 50000
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets",
                                           budget_manifest("hog", {"perPod": {"vram": "1Gi"}}, LADDER))
    until("the operator pod's annotation on the hog",
          lambda: "vramguard.io/violations" in (core.read_namespaced_pod("hog", namespace).metadata.annotations or {}),
          timeout=60, every=0.5)
    # Throttle: pods/resize to 100m, which the kubelet writes to the container's CFS quota.
    until("the hog's CPU quota at 100m (10000 us per 100 ms) in the kernel",
          lambda: cpu_quota_us(host_pid) == 10000, timeout=60, every=0.5)
    # Evict: the kubelet ends the container (SIGTERM; simcuda frees its memory and exits).
    until("the hog evicted and its process ended", lambda: not Path(f"/proc/{host_pid}").exists(), timeout=90, every=1)
    # Each action explained by an Event, reported by the operator pod.
    mine = [e for e in events_about(core, namespace, uid) if e.reporting_component == "vramguard"]
    assert mine and {e.reporting_instance for e in mine} == {release.pod("operator")["metadata"]["name"]}, mine
    # Done by the operator pod's token (the audit log): the resize and the eviction.
    operator = release.pod("operator")["metadata"]["name"]
    events = pod_requests(AuditLog.of_local_cluster().events(int(release.timings["audit_offset"])), operator)
    refs = [(e.get("objectRef") or {}, e["verb"], e["responseStatus"]["code"]) for e in events]
    done = {(ref.get("subresource"), verb) for ref, verb, code in refs
            if ref.get("resource") == "pods" and ref.get("name") == "hog" and code < 300}
    assert {("resize", "patch"), ("eviction", "create")} <= done, done


def test_the_webhooks_are_served_by_the_operator_pod(release: Release, namespace: str) -> None:
    custom = CustomObjectsApi(release.cluster.api_client())
    policy = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUMemoryPolicy", "metadata": {"name": namespace},
              "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                       "ceilings": {"perPod": {"vram": "40Gi"}}}}
    custom.create_cluster_custom_object(GROUP, VERSION, "gpumemorypolicies", policy)
    try:
        until("the policy's status", lambda: (custom.get_cluster_custom_object(
            GROUP, VERSION, "gpumemorypolicies", namespace).get("status") or {}).get("namespaces") == [namespace],
            timeout=60, every=0.5)
        with pytest.raises(ApiException) as err:  # the API server calls the operator pod's webhook
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets",
                                                   budget_manifest("too-big", {"perPod": {"vram": "50Gi"}}, LADDER))
        assert 'GPUMemoryBudget "too-big" is invalid' in json.loads(err.value.body)["message"], err.value.body
    finally:
        release.cluster.kubectl("delete", "gpumemorypolicy", namespace, "--ignore-not-found", check=False)


def scrape(pod_obj: dict[str, Any], port: int) -> str:
    with urllib.request.urlopen(f"http://{pod_obj['status']['podIP']}:{port}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def test_both_pods_serve_their_documented_metrics(release: Release) -> None:
    def sampled() -> str | None:
        text = scrape(release.pod("agent"), 9400)
        return text if "vramguard_agent_samples_total" in text else None

    agent = until("the agent pod's samples counted", sampled, timeout=30, every=1)
    assert "vramguard_agent_report_writes_total" in agent
    operator = scrape(release.pod("operator"), 9090)
    assert "vramguard_actions_total" in operator or "vramguard_status_writes_total" in operator


def test_no_request_of_either_pod_was_refused(release: Release) -> None:
    """The chart's RBAC is enough for what both containers did (the audit log, by pod-bound token)."""
    events = AuditLog.of_local_cluster().events(int(release.timings["audit_offset"]))
    for component in ("operator", "agent"):
        mine = pod_requests(events, release.pod(component)["metadata"]["name"])
        assert mine, f"no request of the {component} pod in the audit log"
        refused = [(e["verb"], e.get("objectRef"), e.get("requestURI")) for e in mine if e["responseStatus"]["code"] == 403]
        assert not refused, f"{component}: {refused}"


def test_helm_upgrade_to_a_new_image_tag_keeps_a_budgets_escalation_state(
    release: Release, namespace: str
) -> None:
    api = release.cluster.api_client()
    core, custom = CoreV1Api(api), CustomObjectsApi(api)
    run_pod(release.cluster, release.node, namespace,
            pod(release.node, "held", ["/bin/simcuda", "--every", "200ms", "2Gi"], gpu=True, labels={"app": "held"}))
    ladder = [{"action": "Annotate", "after": "0s"}, {"action": "Evict", "after": "30m"}]
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets",
                                           budget_manifest("held", {"perPod": {"vram": "1Gi"}}, ladder))

    def state() -> tuple[str, list[tuple[Any, ...]]] | None:
        annotation = (core.read_namespaced_pod("held", namespace).metadata.annotations or {}).get(
            "vramguard.io/violations")
        status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "gpumemorybudgets", "held")
        open_ = [(v.get("pod"), v.get("step"), v.get("openedAt"))
                 for v in (status.get("status") or {}).get("violations") or () if v.get("step")]
        return (annotation, open_) if annotation and open_ else None

    before = until("the held pod annotated and its violation open", state, timeout=60, every=0.5)
    old_pods = {c: release.pod(c)["metadata"]["uid"] for c in ("operator", "agent")}
    # A new tag of the same images, as a new release of them would be.
    sock = str(release.node.state / "run/containerd.sock")
    for image, tag in (("operator", TAG), ("agent", SIM_TAG)):
        release.run(release.node.ctr, "--address", sock, "-n", "k8s.io", "images", "tag", "--force",
                    f"docker.io/vramguard/{image}:{tag}", f"docker.io/vramguard/{image}:{tag}-next")
    release.run(release.helm, "upgrade", "vramguard", str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout",
                "5m", "--values", str(release.values), "--set", f"operator.image.tag={TAG}-next",
                "--set", f"agent.image.tag={SIM_TAG}-next")
    # As after install (README): helm's --wait lets a DaemonSet be maxUnavailable short.
    release.run("kubectl", "-n", NAMESPACE, "rollout", "status", "daemonset/vramguard-agent", "--timeout", "2m")
    for component in ("operator", "agent"):
        new = release.pod(component)
        assert new["metadata"]["uid"] != old_pods[component]
        # (the pod's status names the image by its first tag; both tags are one image)
        assert new["spec"]["containers"][0]["image"].endswith("-next") and new["status"]["containerStatuses"][0]["ready"]
    time.sleep(15)  # the new operator has evaluated (5 s period) and would have written any change
    assert state() == before


def test_helm_uninstall_leaves_nothing(release: Release) -> None:
    pids = [release.host_pid(release.pod(c)) for c in ("operator", "agent")]
    release.uninstall()
    left = release.cluster.kubectl(
        "get", "clusterrole,clusterrolebinding,validatingwebhookconfiguration,mutatingwebhookconfiguration,"
        "validatingadmissionpolicy,validatingadmissionpolicybinding", "-l", "app.kubernetes.io/instance=vramguard",
        "-o", "name").stdout.split()
    assert left == []
    assert release.cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0
    until("the containers' processes to end", lambda: not any(Path(f"/proc/{p}").exists() for p in pids),
          timeout=60, every=0.5)
