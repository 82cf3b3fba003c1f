"""Generate the CustomResourceDefinitions in ``crds/`` from the pydantic models.

The models are the single source of truth. Their JSON Schema (pydantic, draft
2020-12) is turned into a structural OpenAPI v3 schema as Kubernetes requires
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema):
references inlined, ``Optional`` unions collapsed, titles dropped, every field
described, CEL rules (``x-kubernetes-validations``) kept where the models put them.

Usage: ``python -m vramguard_api.crdgen DIR`` writes ``DIR/<group>_<plural>.yaml``;
``--check`` exits 1 and names the files that differ instead of writing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from . import BUDGETS, GROUP, POLICIES, REPORTS, VERSION
from .budget import GPUMemoryBudgetSpec, GPUMemoryBudgetStatus
from .policy import GPUMemoryPolicySpec, GPUMemoryPolicyStatus
from .usage import NodeGPUUsageSpec, NodeGPUUsageStatus

_DROP = {"title", "$defs"}


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated sub-schemas out in full: anchors would be unreadable in a CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@dataclass(frozen=True)
class Resource:
    """What a CRD needs beyond the schema."""

    kind: str
    plural: str
    short_name: str
    scope: str
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    columns: list[dict[str, Any]] = field(default_factory=list)


_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

RESOURCES = [
    Resource(
        kind="GPUMemoryBudget",
        plural=BUDGETS,
        short_name="gmb",
        scope="Namespaced",
        spec=GPUMemoryBudgetSpec,
        status=GPUMemoryBudgetStatus,
        description="A budget for the GPU memory (VRAM) and host memory (RAM) of the pods its selector "
        "matches, with an escalation ladder (Annotate, Throttle, Cap, Evict) for violations.",
        columns=[
            {"name": "Mode", "type": "string", "jsonPath": ".status.effectiveMode",
             "description": "the mode in force: a policy's DryRun overrides the budget's Enforce"},
            {"name": "Pods", "type": "integer", "jsonPath": ".status.matchedPods"},
            {"name": "VRAM", "type": "string", "jsonPath": ".status.usage.vram", "description": "used/limit"},
            {"name": "RAM", "type": "string", "jsonPath": ".status.usage.ram", "priority": 1},
            {"name": "Violations", "type": "integer", "jsonPath": ".status.openViolations"},
            {"name": "Mode-Source", "type": "string", "jsonPath": ".status.modeSource", "priority": 1},
            {"name": "Spec-Mode", "type": "string", "jsonPath": ".spec.enforcement.mode", "priority": 1},
            _AGE,
        ],
    ),
    Resource(
        kind="GPUMemoryPolicy",
        plural=POLICIES,
        short_name="gmp",
        scope="Cluster",
        spec=GPUMemoryPolicySpec,
        status=GPUMemoryPolicyStatus,
        description="A cluster-wide policy for GPU pods in a set of namespaces: default limits, ceilings "
        "for budgets, exempt namespaces, a cluster-wide mode and eviction rate limits.",
        columns=[
            {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
            {"name": "Caps", "type": "boolean", "jsonPath": ".spec.injectFrameworkCaps", "priority": 1},
            _AGE,
        ],
    ),
    Resource(
        kind="NodeGPUUsage",
        plural=REPORTS,
        short_name="ngu",
        scope="Cluster",
        spec=NodeGPUUsageSpec,
        status=NodeGPUUsageStatus,
        description="The measured GPU and host memory of one node, per device, pod and container; "
        "named after the node and written only by that node's agent.",
        columns=[
            {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName"},
            {"name": "Healthy", "type": "string", "jsonPath": '.status.conditions[?(@.type=="AgentHealthy")].status',
             "description": "the AgentHealthy condition: False when no device can be read"},
            {"name": "Devices", "type": "integer", "jsonPath": ".status.healthyDevices",
             "description": "devices that answered NVML"},
            {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="AgentHealthy")].reason',
             "priority": 1},
            {"name": "Backend", "type": "string", "jsonPath": ".status.agent.backend"},
            {"name": "Sampled", "type": "date", "jsonPath": ".status.sampleTime"},
            _AGE,
        ],
    ),
]


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON Schema node into a structural OpenAPI v3 node.

    A ``$ref`` is inlined and an ``Optional`` union collapsed to its one type;
    the node's own keywords (description, default) then apply over it. Raises
    ``ValueError`` naming the construct when a schema cannot be made structural
    (an untyped union, for example).
    """
    node = dict(schema)
    base: dict[str, Any] = {}
    if "$ref" in node:
        base = structural(defs[node.pop("$ref").split("/")[-1]], defs)
    elif "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot make a union structural: {options}")
        base = structural(options[0], defs)
    out = {**base, **structural_keywords(node, defs)}
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" in out:
        out.pop("additionalProperties", None)  # extra="forbid": the API server prunes unknown fields
    return out


def structural_keywords(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Recurse into properties/items and translate JSON Schema keywords to OpenAPI v3.0."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020-12 gives the bound; OpenAPI v3.0 wants minimum + a flag
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of a model, as an object node."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def undescribed(schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of properties that have no description (each one must have one for kubectl explain)."""
    missing = []
    for name, sub in schema.get("properties", {}).items():
        here = f"{path}.{name}"
        if here == ".metadata":
            continue
        if not sub.get("description"):
            missing.append(here)
        missing += undescribed(sub, here)
    if isinstance(schema.get("items"), dict):
        missing += undescribed(schema["items"], path + "[]")
    return missing


def crd(res: Resource) -> dict[str, Any]:
    """Build the CustomResourceDefinition manifest of one resource."""
    spec_schema = model_schema(res.spec)
    status_schema = model_schema(res.status)
    spec_schema["description"] = (res.spec.__doc__ or "").strip().splitlines()[0]
    status_schema["description"] = (res.status.__doc__ or "").strip().splitlines()[0]
    schema = {
        "type": "object",
        "description": res.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this object."},
            "kind": {"type": "string", "description": "Kind is a string value representing the REST resource."},
            "metadata": {"type": "object"},  # the API server allows nothing more here
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    missing = undescribed(schema)
    if missing:
        raise ValueError(f"{res.kind}: fields without a description: {missing}")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{res.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": res.kind,
                "listKind": f"{res.kind}List",
                "plural": res.plural,
                "singular": res.kind.lower(),
                "shortNames": [res.short_name],
                "categories": ["vramguard"],
            },
            "scope": res.scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": res.columns,
                }
            ],
        },
    }


def render(res: Resource) -> str:
    """The YAML text of one CRD file, with a header saying it is generated."""
    header = "# Generated by `make generate` (python -m vramguard_api.crdgen) from api/vramguard_api. Do not edit.\n"
    return header + yaml.dump(crd(res), Dumper=_NoAliasDumper, sort_keys=False, width=120, allow_unicode=True)


def outputs() -> dict[str, str]:
    """File name -> content for every CRD."""
    return {f"{GROUP}_{res.plural}.yaml": render(res) for res in RESOURCES}


def main(argv: list[str] | None = None) -> int:
    """Write the CRDs to a directory, or with ``--check`` report drift (exit 1)."""
    parser = argparse.ArgumentParser(prog="crdgen", description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+", type=Path, help="where to write the CRD files")
    parser.add_argument("--check", action="store_true", help="fail when checked-in files differ")
    args = parser.parse_args(argv)
    drift = []
    for directory in args.directories:
        for name, text in outputs().items():
            path = directory / name
            if args.check:
                if not path.exists() or path.read_text() != text:
                    drift.append(str(path))
            else:
                directory.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if drift:
        print("generated files differ; run `make generate`: " + ", ".join(drift), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
