"""The ``bench`` fixture: every benchmark records its figures through it (see
``recorder.py``); at the end of the run the figures go to the file given by
``--bench-results`` (``make bench``: bench-results.json) and the terminal
summary lists the targets missed."""

from __future__ import annotations

from pathlib import Path

import pytest

from .recorder import BenchRecorder, Results

RESULTS = pytest.StashKey[Results]()


def _results(config: pytest.Config) -> Results:
    if RESULTS not in config.stash:
        config.stash[RESULTS] = Results()
    return config.stash[RESULTS]


@pytest.fixture
def bench(request: pytest.FixtureRequest) -> BenchRecorder:
    """A recorder for this test's figures (a parametrized test's id is appended to each name)."""
    callspec = getattr(request.node, "callspec", None)
    return BenchRecorder(_results(request.config), request.node.nodeid, callspec.id if callspec else None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    # A benchmark's outcome: a failed or skipped setup counts; otherwise the call's result
    # (and a failing teardown after it).
    if item.get_closest_marker("benchmark") and (report.when == "call" or report.outcome != "passed"):
        _results(item.config).outcomes[item.nodeid] = report.outcome
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--bench-results")
    results = _results(session.config)
    if path and (results.figures or results.outcomes):
        results.write(Path(path))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    results = _results(config)
    if not results.figures:
        return
    path = config.getoption("--bench-results")
    missed = results.missed()
    where = f"written to {path}" if path else "not written (no --bench-results)"
    terminalreporter.section("benchmark figures")
    terminalreporter.write_line(f"{len(results.figures)} figures, {len(missed)} targets missed; {where}")
    for f in missed:
        assert f.target is not None
        terminalreporter.write_line(f"  missed: {f.name} = {f.value:g} {f.unit} (target {f.target.op} {f.target.bound:g})")
