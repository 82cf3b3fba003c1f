"""Test-suite wide settings: tests under tests/e2e carry the e2e marker, and
tests under tests/bench the benchmark marker, without each file saying so; the
``--bench-results`` option (read by tests/bench/conftest.py) is declared here,
where pytest reads options whichever tests are run."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-results",
        metavar="PATH",
        default=None,
        help="write the benchmarks' figures to PATH as JSON (make bench: bench-results.json)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "e2e" in parts:
            item.add_marker(pytest.mark.e2e)
        if "bench" in parts:
            item.add_marker(pytest.mark.benchmark)
