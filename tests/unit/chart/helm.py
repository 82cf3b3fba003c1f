"""Helpers for the chart's tests: find the helm binary, render the chart, read
RBAC rules, and read the command blocks of docs/install.md that the end-to-end
test runs as they are written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "vramguard"
INSTALL_DOC = ROOT / "docs" / "install.md"
CACHE = Path(os.environ.get("VG_CACHE", Path.home() / ".cache" / "vramguard"))
# helm built from source without its release ldflags assumes Kubernetes 1.20 for
# `helm template`; the chart needs >= 1.30, so every render names the version.
KUBE_VERSION = "1.36.0"
NAMESPACE = "vramguard-system"
RELEASE = "vramguard"


def find_helm() -> str | None:
    """Path of the helm binary: $HELM, the one hack/cluster/build.sh caches, or PATH's."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    built = sorted(p for p in CACHE.glob("bin/helm-*/helm") if not p.parent.name.endswith(".tmp"))
    if built:
        return str(built[-1])
    return shutil.which("helm")


class HelmError(RuntimeError):
    """helm exited non-zero; the message is its stderr."""


def helm(*args: str, binary: str | None = None) -> str:
    """Run helm with ``args``; returns stdout, raises HelmError with stderr on failure."""
    exe = binary or find_helm()
    if exe is None:
        raise HelmError("helm not found")
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip())
    return proc.stdout


def template_args(values: dict[str, Any] | None = None, *, values_files: Iterable[Path] = (),
                  release: str = RELEASE, namespace: str = NAMESPACE) -> list[str]:
    """Arguments of ``helm template`` for the chart; ``values`` become ``--set-json`` flags."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    args += ["--kube-version", KUBE_VERSION]
    for f in values_files:
        args += ["--values", str(f)]
    for key, value in (values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def render(values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Render the chart; returns its objects (YAML documents that are not empty).

    ``values`` maps dotted keys to JSON-compatible values (``{"agent.backend": "sim"}``).
    Raises HelmError when helm rejects the values or the templates fail."""
    out = helm(*template_args(values, **kw))
    return [d for d in yaml.safe_load_all(out) if d]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    """Objects of ``kind`` (and ``name`` when given)."""
    return [o for o in objs
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of ``kind`` (and ``name``); AssertionError when there are 0 or 2+."""
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def permissions(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) a Role or ClusterRole grants, expanded."""
    out: set[tuple[str, str, str]] = set()
    for rule in role.get("rules", []):
        for group in rule.get("apiGroups", [""]):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def allows(role: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    """Whether the role grants ``verb`` on ``group``/``resource``, honouring "*" as RBAC does."""
    for g, r, v in permissions(role):
        if g in (group, "*") and r in (resource, "*") and v in (verb, "*"):
            return True
    return False


_BLOCK = re.compile(r"<!-- e2e:([a-z-]+) -->\s*```bash\n(.*?)```", re.S)


def doc_blocks(path: Path = INSTALL_DOC) -> dict[str, str]:
    """The shell blocks of ``path`` marked ``<!-- e2e:NAME -->``, by name."""
    return {m.group(1): m.group(2) for m in _BLOCK.finditer(path.read_text())}


def doc_commands(block: str) -> Iterator[str]:
    """The commands of a block: lines joined at trailing backslashes, comments dropped."""
    for cmd in re.sub(r"\\\n\s*", " ", block).splitlines():
        if cmd.strip() and not cmd.lstrip().startswith("#"):
            yield cmd.strip()
