"""Benchmark: the images and the chart as shipped (issue 27).

Measures and records (``bench``):
- ``hack/images/build.sh --with-sim`` with its caches (base, wheels): seconds
  where nothing changed, a rebuild of each image whose inputs changed (the cold
  figures, with an empty cache, are in README.md's build table: a cold build
  cannot be repeated without deleting the shared caches);
- each image's unpacked and compressed size (goals: agent <= 200 MiB,
  operator <= 250 MiB unpacked);
- ``ctr images import`` of both archives into the real node's containerd;
- ``helm install`` (README's command) -> both pods Ready;
- agent container start -> its first NodeGPUUsage write, and operator
  container start -> its first decision (its first budget status write), both
  from the API server's audit log by the pods' own tokens.
A benchmark prints figures; it asserts only that each was measured.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes.client import CustomObjectsApi

from tests.bench.recorder import BenchRecorder
from tests.e2e.chart_rbac import AuditLog
from tests.e2e.conftest import Cluster, cluster, namespace, real_node  # noqa: F401  (the fixtures)
from tests.e2e.operator_harness import GROUP, VERSION, budget_manifest
from tests.e2e.realnode import ROOT, RealNode
from tests.e2e.shipped import (
    SIM_TAG,
    TAG,
    Release,
    archive,
    first_write,
    missing_images,
    pod_requests,
    real_node_values,
    started_at,
)
from tests.e2e.test_real_node_e2e import until

pytestmark = [pytest.mark.benchmark, pytest.mark.e2e]
MIB = 1 << 20
GOALS_MIB = {"agent": 200, "operator": 250}


def test_images_build_time_and_sizes(bench: BenchRecorder) -> None:
    t0 = time.monotonic()
    build = subprocess.run([str(ROOT / "hack/images/build.sh"), "--with-sim"], capture_output=True, text=True,
                           timeout=1800)
    warm = time.monotonic() - t0
    if build.returncode != 0:
        pytest.skip(f"hack/images/build.sh failed here:\n{build.stdout[-2000:]}\n{build.stderr[-2000:]}")
    print(f"\n{build.stdout}")
    bench.record("images.build_warm", warm, "s")
    for component, tag in (("operator", TAG), ("agent", TAG), ("agent", SIM_TAG)):
        sizes = json.loads(Path(f"{archive(component, tag)}.json").read_text())
        name = f"images.{component}{'-sim' if tag == SIM_TAG else ''}"
        goal = GOALS_MIB[component] if tag == TAG else None
        bench.record(f"{name}.unpacked", sizes["unpacked_bytes"] / MIB, "MiB", at_most=goal)
        bench.record(f"{name}.compressed", sizes["compressed_bytes"] / MIB, "MiB")
        print(f"{name}: {sizes['unpacked_bytes'] / MIB:.0f} MiB unpacked, "
              f"{sizes['compressed_bytes'] / MIB:.0f} MiB compressed, {sizes['digest']}")
    cold = Path(f"{archive('operator', TAG)}.json")
    print(f"(cold build times are in README.md's build table; this run found its caches: {warm:.1f} s; {cold})")


def test_install_to_ready_and_first_actions(bench: BenchRecorder, cluster: Cluster,  # noqa: F811
                                            real_node: RealNode, namespace: str,  # noqa: F811
                                            tmp_path: Path) -> None:
    if (why := missing_images()) is not None:
        pytest.skip(why)
    if cluster.helm is None:
        pytest.skip("helm binary not found; hack/cluster/build.sh builds it")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(real_node_values(real_node)))
    release = Release(cluster, real_node, cluster.helm, values)
    release.uninstall()
    imported = release.import_images(archive("operator", TAG), archive("agent", SIM_TAG))
    # A budget waiting for the operator: its first status write is its first decision.
    waiting = budget_manifest("waiting", {"perPod": {"vram": "1Gi"}}, [{"action": "Annotate", "after": "0s"}])
    CustomObjectsApi(cluster.api_client()).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "gpumemorybudgets", waiting)
    audit = AuditLog.of_local_cluster()
    offset = audit.offset()
    try:
        ready = release.install()
        agent, operator = release.pod("agent"), release.pod("operator")

        def first(pod: dict, resource: str, sub: str | None) -> float | None:
            return first_write(pod_requests(audit.events(offset), pod["metadata"]["name"]), resource, sub)

        report = until("the agent pod's first report", lambda: first(agent, "nodegpuusages", "status")
                       or first(agent, "nodegpuusages", None), timeout=60, every=1)
        decision = until("the operator pod's first budget status", lambda: first(
            operator, "gpumemorybudgets", "status"), timeout=60, every=1)
    finally:
        release.uninstall()
    figures = {"ctr_import": imported, "install_to_ready": ready,
               "agent_start_to_first_report": report - started_at(agent),
               "operator_start_to_first_decision": decision - started_at(operator)}
    for name, value in figures.items():
        bench.record(f"shipped.{name}", value, "s")
        print(f"shipped.{name}: {value:.1f} s")
