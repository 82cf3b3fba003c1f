#!/usr/bin/env python3
"""A stand-in DRA driver for the local cluster: it publishes ResourceSlices for
simulated GPU nodes, as a GPU DRA driver's kubelet plugin would, so that the
real kube-scheduler allocates ResourceClaims on kwok nodes.

The devices copy NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu,
cmd/gpu-kubelet-plugin: deviceinfo.go, mig.go, consumable_shares.go with
``--consumable-shares=memory``): attributes ``type`` (``gpu`` or ``mig``),
``uuid``, ``productName`` (and ``parentUUID``, ``profile`` for MIG devices);
capacity ``memory`` in bytes with a request policy (default the whole device,
at least 1Mi, steps of 1Mi); ``allowMultipleAllocations: true``. A GPU in MIG
mode is published as its MIG devices only. The driver is called
``gpu.vramguard.test`` (``.test`` is reserved for testing) with DeviceClasses
``gpu.vramguard.test`` and ``mig.vramguard.test`` (dra-deviceclasses.yaml).

UUIDs are those the simulated agent reports: the scenario's ``uuids``, else
``vramguard_sim.simbackend.gpu_uuid``/``mig_uuid`` of the node, GPU index and MIG
slot. Devices come from an agent scenario (``--scenario``) or from the fake
nodes' GPU feature discovery labels (``--nodes hack/cluster/gpu-nodes.yaml``;
MIG devices largest profile first, as the demo scenario lists them).

  dra_driver.py slices --nodes hack/cluster/gpu-nodes.yaml | kubectl apply -f -
  dra_driver.py publish --scenario S.yaml [--node N]     # writes them itself
  dra_driver.py withdraw --node N --device gpu-1          # the device vanishes
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "api"), str(ROOT / "agent"), str(ROOT / "sim")]

from vramguard_sim.scenario import Scenario, load_scenario  # noqa: E402
from vramguard_sim.simbackend import gpu_uuid, mig_uuid  # noqa: E402

DRIVER = "gpu.vramguard.test"
MIB = 1024 * 1024
_MIG_LABEL = re.compile(r"^nvidia\.com/mig-(\d+)g\.(\d+)gb\.count$")


@dataclass(frozen=True, slots=True)
class Device:
    """One published device: its name in the slice, UUID, memory (bytes), product,
    and for a MIG device its parent's UUID and profile."""

    name: str
    uuid: str
    memory: int
    product: str
    parent: str | None = None
    profile: str | None = None


def devices_from_scenario(scenario: Scenario) -> dict[str, list[Device]]:
    """Devices by node, from an agent scenario (the simulated agent's UUIDs)."""
    out: dict[str, list[Device]] = {}
    for node in scenario.nodes:
        devices = out.setdefault(node.name, [])
        for index, (spec, given) in enumerate(zip(node.gpu_list(), node.gpu_uuids(), strict=True)):
            parent = given or gpu_uuid(node.name, index)
            if spec.mig is None:
                devices.append(Device(f"gpu-{index}", parent, spec.memory, spec.model))
                continue
            for slot, m in enumerate(spec.mig):
                name = f"gpu-{index}-mig-{m.profile.replace('.', '')}-{slot}"
                devices.append(Device(name, mig_uuid(node.name, index, slot), m.memory, spec.model, parent, m.profile))
    return out


def devices_from_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, list[Device]]:
    """Devices by node, from GPU feature discovery labels: ``nvidia.com/gpu.count``
    GPUs of ``nvidia.com/gpu.memory`` MiB, or under the mixed MIG strategy the
    ``nvidia.com/mig-<profile>.count`` MIG devices of ``.memory`` MiB on GPU 0."""
    out: dict[str, list[Device]] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name, labels = meta.get("name") or "", meta.get("labels") or {}
        if labels.get("nvidia.com/gpu.present") != "true":
            continue
        product = labels.get("nvidia.com/gpu.product", "")
        migs = sorted(
            ((int(m.group(1)), int(m.group(2)), k) for k in labels if (m := _MIG_LABEL.match(k))), reverse=True
        )
        if labels.get("nvidia.com/mig.strategy") == "mixed" and migs:
            devices, slot = [], 0
            for _, _, key in migs:
                profile = key.removeprefix("nvidia.com/mig-").removesuffix(".count")
                memory = int(labels[f"nvidia.com/mig-{profile}.memory"]) * MIB
                for _ in range(int(labels[key])):
                    dev_name = f"gpu-0-mig-{profile.replace('.', '')}-{slot}"
                    devices.append(Device(dev_name, mig_uuid(name, 0, slot), memory, product, gpu_uuid(name, 0), profile))
                    slot += 1
            out[name] = devices
            continue
        count, memory = int(labels.get("nvidia.com/gpu.count", "1")), int(labels["nvidia.com/gpu.memory"]) * MIB
        out[name] = [Device(f"gpu-{i}", gpu_uuid(name, i), memory, product) for i in range(count)]
    return out


def device_entry(d: Device) -> dict[str, Any]:
    """A ResourceSlice device (resource.k8s.io/v1) as NVIDIA's driver publishes one."""
    attrs: dict[str, Any] = {
        "type": {"string": "mig" if d.parent else "gpu"},
        "uuid": {"string": d.uuid},
        "productName": {"string": d.product},
    }
    if d.parent:
        attrs["parentUUID"] = {"string": d.parent}
        attrs["profile"] = {"string": d.profile}
    memory = f"{d.memory // MIB}Mi"
    policy = {"default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}
    return {
        "name": d.name,
        "attributes": attrs,
        "capacity": {"memory": {"value": memory, "requestPolicy": policy}},
        "allowMultipleAllocations": True,
    }


def resource_slice(node: str, devices: Sequence[Device], generation: int = 1) -> dict[str, Any]:
    """The one ResourceSlice of ``node``'s pool (the pool is named after the node)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}", "labels": {"app.kubernetes.io/managed-by": "vramguard-test-driver"}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device_entry(d) for d in devices],
        },
    }


# --- writing to the cluster ---------------------------------------------------------


def publish(api: Any, slices: Iterable[Mapping[str, Any]]) -> None:
    """Create or replace each slice (``api``: a kubernetes.client.ApiClient)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom = client.CustomObjectsApi(api)
    for s in slices:
        name = s["metadata"]["name"]
        try:
            current = custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)
        except ApiException as err:
            if err.status != 404:
                raise
            custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", dict(s))
            continue
        body = {**s, "metadata": {**s["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        custom.replace_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name, body)


def withdraw(api: Any, node: str, device: str) -> dict[str, Any]:
    """Republish ``node``'s pool without ``device`` (a new generation, as a driver
    does when a device disappears); returns the new slice."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    current = custom.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", f"{node}-{DRIVER}")
    spec = current["spec"]
    kept = [d for d in spec["devices"] if d["name"] != device]
    if len(kept) == len(spec["devices"]):
        raise KeyError(f"node {node} publishes no device {device}")
    spec["devices"] = kept
    spec["pool"]["generation"] = int(spec["pool"]["generation"]) + 1
    return custom.replace_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", current["metadata"]["name"], current)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["slices", "publish", "withdraw"])
    p.add_argument("--scenario", type=Path, help="an agent scenario (vramguard-agent --scenario)")
    p.add_argument("--nodes", type=Path, help="Node manifests with GFD labels (hack/cluster/gpu-nodes.yaml)")
    p.add_argument("--node", action="append", help="only these nodes (repeatable); withdraw: the node")
    p.add_argument("--device", help="withdraw: the device's name in the slice")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG")
    args = p.parse_args(argv)
    if args.command == "withdraw":
        from kubernetes import config

        withdraw(config.new_client_from_config(config_file=args.kubeconfig), args.node[0], args.device)
        return 0
    if args.scenario:
        by_node = devices_from_scenario(load_scenario(args.scenario))
    elif args.nodes:
        by_node = devices_from_nodes(d for d in yaml.safe_load_all(args.nodes.read_text()) if d)
    else:
        p.error("--scenario or --nodes is required")
    slices = [resource_slice(n, devs) for n, devs in by_node.items() if not args.node or n in args.node]
    if args.command == "slices":
        yaml.safe_dump_all(slices, sys.stdout, sort_keys=False)
        return 0
    from kubernetes import config

    publish(config.new_client_from_config(config_file=args.kubeconfig), slices)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
