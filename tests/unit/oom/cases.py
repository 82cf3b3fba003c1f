"""The labelled fixtures (``fixtures/*.yaml``), loaded once for the tests and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class MessageCase:
    id: str
    source: str
    label: str
    pattern: str | None
    text: str
    requested: int | None


@cache
def message_cases() -> tuple[MessageCase, ...]:
    rows: list[dict[str, Any]] = yaml.safe_load((FIXTURES / "messages.yaml").read_text())
    return tuple(
        MessageCase(r["id"], r["source"], r["label"], r.get("pattern"), r["text"], r.get("requested")) for r in rows
    )


@cache
def kernel_cases() -> tuple[dict[str, Any], ...]:
    return tuple(yaml.safe_load((FIXTURES / "kernel.yaml").read_text()))
