"""hack/cycles.py: finds import circles, type-only ones included, and fails on them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("hack_cycles", ROOT / "hack" / "cycles.py")
assert _spec is not None and _spec.loader is not None
cycles = importlib.util.module_from_spec(_spec)
sys.modules["hack_cycles"] = cycles
_spec.loader.exec_module(cycles)


def test_circles_are_the_strongly_connected_components():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert cycles.circles(edges) == [["a", "b", "c"], ["e"]]
    assert cycles.circles({"a": {"b"}, "b": set()}) == []


def test_a_type_only_circle_fails_and_a_clean_package_passes(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("from cyclepkg.two import B\n\nclass A:\n    pass\n")
    (pkg / "two.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from cyclepkg.one import A\n\nclass B:\n    pass\n"
    )
    (pkg / "three.py").write_text("from cyclepkg.one import A\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles.main(["cyclepkg"]) == 1
    err = capsys.readouterr().err
    assert "import circle among cyclepkg.one, cyclepkg.two" in err
    assert "cyclepkg.two imports cyclepkg.one (line 4)" in err
    (pkg / "two.py").write_text("class B:\n    pass\n")
    assert cycles.main(["cyclepkg"]) == 0
