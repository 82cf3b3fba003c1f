"""Prints the fuzz tests' counts at the end of the run (``harness.TALLY``), and
writes them to ``$VRAMGUARD_FUZZ_RESULTS`` when set (``make fuzz``)."""

from __future__ import annotations

import json
import os
from typing import Any

from .harness import EXAMPLES, TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY:
        return
    tr = terminalreporter
    tr.section(f"fuzz (up to {EXAMPLES} inputs per kind)")
    for kind in sorted(TALLY):
        c = TALLY[kind]
        extra = ", ".join(f"{k}: {v}" for k, v in sorted(c.items())
                          if k not in ("inputs", "escaped exceptions", "canary differences"))
        tr.write_line(f"{kind}: {c['inputs']} inputs, {c['escaped exceptions']} escaped exceptions, "
                      f"{c['canary differences']} canary differences" + (f" ({extra})" if extra else ""))
    path = os.environ.get("VRAMGUARD_FUZZ_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump({k: dict(v) for k, v in TALLY.items()}, f, indent=2, sort_keys=True)
