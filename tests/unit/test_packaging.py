"""The product's distribution (pyproject.toml) packages no simulator; the simulators'
(sim/pyproject.toml) packages only them and registers their backends and ``vramguard simulate``.

What setuptools packages is what ``[tool.setuptools.packages.find]`` finds: the
same call here (``find_packages`` over the ``where`` roots, with ``include``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"vramguard_api", "vramguard_operator", "vramguard_agent"}


def packaged(project: Path) -> set[str]:
    """The packages setuptools puts in the wheel of the project at ``project``."""
    find = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    include = tuple(find.get("include", ["*"]))
    return {name for where in find["where"] for name in find_packages(str(project / where), include=include)}


def test_the_products_wheel_holds_its_three_packages_and_no_simulator():
    packages = packaged(ROOT)
    assert {p.split(".")[0] for p in packages} == PRODUCT
    assert "vramguard_agent" in packages and "vramguard_operator.controller" in packages
    modules = {f.stem for root in ("api", "operator", "agent") for f in (ROOT / root).rglob("*.py")}
    lab = {f.stem for f in (ROOT / "sim" / "vramguard_sim").glob("*.py")} - {"__init__", "__main__", "cli"}
    assert not modules & lab, f"simulator modules in the product: {sorted(modules & lab)}"
    # the fleet simulation and the GPU memory semantics it and the simulated GPU share
    assert not {p for p in packages if p.split(".")[-1] == "simulate"}, "the fleet simulation is in the product"
    assert "gpumem" not in modules and "simulate" not in modules


def test_the_fleet_simulation_is_the_simulators_and_registers_vramguard_simulate():
    assert (ROOT / "sim" / "vramguard_sim" / "simulate" / "command.py").is_file()
    assert (ROOT / "sim" / "vramguard_sim" / "gpumem.py").is_file()
    project = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vramguard.commands"] == {"simulate": "vramguard_sim.simulate.command"}


def test_the_simulators_wheel_holds_only_them_and_registers_the_backends():
    assert packaged(ROOT / "sim") == {"vramguard_sim", "vramguard_sim.simulate"}
    project = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())["project"]
    assert set(project["entry-points"]["vramguard.agent_backends"]) == {"sim", "simdriver"}
    product = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(product["entry-points"]["vramguard.agent_backends"]) == {"nvml"}
    assert product["optional-dependencies"]["sim"] == [f"vramguard-sim=={project['version']}"]
    assert f"vramguard[agent]=={product['version']}" in project["dependencies"]
