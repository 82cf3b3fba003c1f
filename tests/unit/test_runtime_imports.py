"""scipy is a test-only dependency (pyproject's `dev` extra): every runtime module
imports without it. The dev environment has scipy installed, so a runtime import
of it would pass every other test and break only an installed image. Likewise the
simulators (vramguard_sim, the vramguard-sim distribution): every module of the
product imports without them, as in the product's images."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("vramguard_api", "vramguard_operator", "vramguard_agent")

# A child interpreter where importing the packages named in BLOCKED (scipy unless
# told) fails as if they were not installed (None in sys.modules makes any import
# of it raise ImportError), which then imports every module of the packages it is
# given (`__main__` aside: it would run).
SCRIPT = """
import importlib, os, pkgutil, sys
for blocked in os.environ["BLOCKED"].split(","):
    sys.modules[blocked] = None
names = []
for package in sys.argv[1:]:
    root = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
            names.append(info.name)
print(*names)
"""


def imports_without_scipy(
    source_roots: list[Path], packages: tuple[str, ...], blocked: str = "scipy"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(r) for r in source_roots), "BLOCKED": blocked}
    return subprocess.run([sys.executable, "-c", SCRIPT, *packages], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)


def test_every_runtime_module_imports_without_scipy():
    out = imports_without_scipy([ROOT / d for d in ("api", "operator", "agent", "sim")], PACKAGES)
    assert out.returncode == 0, out.stderr[-3000:]
    imported = out.stdout.split()
    # the walk reached the packages' modules, not just their roots
    assert {"vramguard_api.leak", "vramguard_agent.sampler", "vramguard_operator.controller.handlers"} <= set(imported)


def test_every_product_module_imports_without_the_simulators():
    out = imports_without_scipy([ROOT / d for d in ("api", "operator", "agent")], PACKAGES, "scipy,vramguard_sim")
    assert out.returncode == 0, out.stderr[-3000:]
    assert {"vramguard_agent.agent", "vramguard_agent.backends", "vramguard_agent.cli"} <= set(out.stdout.split())


def test_the_simulators_import_without_scipy():
    out = imports_without_scipy([ROOT / d for d in ("api", "operator", "agent", "sim")], ("vramguard_sim",))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "vramguard_sim.agent_backends" in out.stdout.split()


def test_the_check_fails_on_a_module_that_imports_scipy(tmp_path):
    (tmp_path / "uses_scipy").mkdir()
    (tmp_path / "uses_scipy" / "__init__.py").write_text("")
    (tmp_path / "uses_scipy" / "fit.py").write_text("from scipy.stats import theilslopes\n")
    out = imports_without_scipy([tmp_path], ("uses_scipy",))
    assert out.returncode != 0
    assert "uses_scipy/fit.py" in out.stderr and "scipy" in out.stderr.splitlines()[-1]
