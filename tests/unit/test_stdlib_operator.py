"""`api/`, `operator/` and `agent/` are source roots: `import operator` must stay
the standard library's module under pytest, python -m and mypy."""

import operator
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_operator_is_stdlib_under_pytest():
    assert operator.__file__ is None or "site-packages" not in operator.__file__
    assert hasattr(operator, "itemgetter")
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_import_operator_is_stdlib_under_python_m():
    code = "import operator, vramguard_operator; print(operator.itemgetter.__module__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "operator"
    help_out = subprocess.run(
        [sys.executable, "-m", "vramguard_operator", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "vramguard" in help_out.stdout


def test_import_operator_is_stdlib_under_mypy(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import operator\nx: int = operator.add(1, 2)\ny: str = operator.itemgetter(0)(["a"])\n')
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(probe)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
