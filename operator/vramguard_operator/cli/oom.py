"""``vramguard oom``: recent OOM kills on the cluster's GPU nodes, with kind, verdict and blame.

Reads every node report's end records (the agents keep the unacknowledged ones
and the most recent acknowledged ones, ``vramguard_api.ends``), the pods they
name and the GPU nodes, and judges each record as the operator does
(``engine.oom.finding``): the same verdicts as the Events. Ends that are not
memory kills are left out. A table (newest first), or ``--json`` (one object
per line); ``--since`` keeps the recent ones. Exit status: 0, 1 on a cluster
that cannot be read, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from vramguard_api.cliargs import duration_arg
from vramguard_api.ends import ends_of
from vramguard_api.oom import MEMORY_KINDS
from vramguard_api.units import format_bytes
from vramguard_api.usage import NodeGPUUsage
from vramguard_operator.controller import cluster_reads
from vramguard_operator.controller.oom_reads import OOMRead, read_oom
from vramguard_operator.engine.oom import Finding, finding
from vramguard_operator.policy.node import NodeFacts
from vramguard_operator.policy.pressure import device_shares

COLUMNS = ("TIME", "NAMESPACE", "POD", "CONTAINER", "KIND", "VERDICT", "DEVICE", "FREE", "HELD", "SHARE",
           "NEIGHBOURS ABOVE SHARE")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``vramguard oom``."""
    parser.add_argument("-n", "--namespace", help="only this namespace (default: every namespace)")
    parser.add_argument("--since", metavar="DURATION", type=duration_arg("--since"),
                        help="only OOM kills this recent (e.g. 1h)")
    parser.add_argument("--json", action="store_true", help="one JSON object per OOM kill, one per line")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context")


def run(args: argparse.Namespace) -> int:
    """Read the cluster, print the OOM kills."""
    try:
        api = cluster_reads.api_client(args.kubeconfig, args.context)
        read = read_oom(api, args.namespace)
    except Exception as err:  # noqa: BLE001 - configuration and API errors alike: one line
        print(f"vramguard oom: cannot read the cluster: {err}", file=sys.stderr)
        return 1
    now = datetime.now(UTC)
    found = select(judge(read), args.namespace, None if args.since is None else now - timedelta(seconds=args.since))
    print("\n".join(to_json(f) for f in found) if args.json else table(found))
    return 0


def judge(read: OOMRead) -> list[Finding]:
    """Every end record of the reports, judged (newest first)."""
    pods = {(p.get("metadata") or {}).get("uid"): p for p in read.pods}
    nodes = _nodes(read)
    out = []
    for body, report in _reports(read):
        out += [finding(r, pods.get(r.pod_uid), _shares(report, nodes)) for r in ends_of(body)]
    return sorted(out, key=lambda f: f.record.time, reverse=True)


def shares(read: OOMRead) -> dict[str, int]:
    """Each device's share (bytes, by UUID) as ``judge`` uses it: the node's
    share of the device (``policy.pressure.device_shares``)."""
    nodes = _nodes(read)
    return {uuid: share for _, report in _reports(read) for uuid, share in _shares(report, nodes).items()}


def _nodes(read: OOMRead) -> dict[str, dict[str, Any]]:
    return {str((n.get("metadata") or {}).get("name") or ""): n for n in read.nodes}


def _reports(read: OOMRead) -> list[tuple[dict[str, Any], NodeGPUUsage]]:
    out = []
    for body in read.reports:
        try:
            out.append((body, NodeGPUUsage.model_validate(body)))
        except ValueError:
            continue  # a report that does not parse: the operator reports it as a problem
    return out


def _shares(report: NodeGPUUsage, nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    node = (report.spec.node_name if report.spec else None) or report.metadata.name or ""
    return device_shares({node: NodeFacts.from_api(nodes[node], report)}) if node in nodes else {}


def select(found: Iterable[Finding], namespace: str | None, since: datetime | None) -> list[Finding]:
    """The memory kills, of ``namespace`` (None: all), at or after ``since``."""
    return [f for f in found if f.verdict.kind in MEMORY_KINDS and (namespace is None or f.namespace == namespace)
            and (since is None or f.record.time >= since)]


def _row(f: Finding) -> tuple[str, ...]:
    d, v = f.device, f.verdict
    above = ", ".join(f"{n.name} +{format_bytes(n.over_bytes)}" for n in v.neighbours_above_share) or "-"
    return (f"{f.record.time:%Y-%m-%d %H:%M:%S}", f.namespace or "-", f.name or f.record.pod_uid,
            f.record.container_name or "-", f.verdict.kind, v.blame or "-", d.uuid if d else "-",
            format_bytes(d.free_bytes if d else None), format_bytes((d.pod_bytes or d.process_bytes) if d else None),
            format_bytes(f.share_bytes), above)


def table(found: list[Finding]) -> str:
    """The table (``No OOM kills found.`` when empty)."""
    if not found:
        return "No OOM kills found."
    rows = [COLUMNS, *(_row(f) for f in found)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def to_json(f: Finding) -> str:
    """One OOM kill as a JSON object."""
    d, v = f.device, f.verdict
    out: dict[str, Any] = {
        "time": f.record.time.isoformat(), "id": f.record.id, "namespace": f.namespace, "pod": f.name,
        "podUID": f.record.pod_uid, "container": f.record.container_name, "kind": v.kind, "verdict": v.blame,
        "confidence": v.confidence, "because": list(v.because),
        "device": d.uuid if d else None, "freeBytes": d.free_bytes if d else None,
        "heldBytes": (d.pod_bytes or d.process_bytes) if d else None, "shareBytes": f.share_bytes,
        "neighboursAboveShare": [{"name": n.name, "heldBytes": n.held_bytes, "shareBytes": n.share_bytes}
                                 for n in v.neighbours_above_share],
    }
    return json.dumps(out)
