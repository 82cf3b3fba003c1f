"""The message table against real messages from public issues (fixtures/messages.yaml)."""

from __future__ import annotations

import pytest

from tests.unit.oom.cases import MessageCase, message_cases
from vramguard_api.oom import MESSAGE_PATTERNS, Evidence, classify, match_message
from vramguard_api.oom.messages import size_bytes


@pytest.mark.parametrize("case", message_cases(), ids=lambda c: c.id)
def test_each_real_message_matches_its_row(case: MessageCase) -> None:
    found = match_message(case.text)
    assert (found.pattern.name if found else None) == case.pattern
    if case.requested is not None:
        assert found is not None and found.requested_bytes is not None
        assert abs(found.requested_bytes - case.requested) <= case.requested * 0.001


@pytest.mark.parametrize("case", [c for c in message_cases() if c.pattern is not None], ids=lambda c: c.id)
def test_a_terminated_container_with_the_message_gets_its_label(case: MessageCase) -> None:
    verdict = classify(Evidence(exit_code=1, reason="Error", message=case.text))
    assert verdict.kind == case.label
    assert verdict.message is not None and verdict.message.pattern.name == case.pattern


def test_every_row_is_cited_and_exercised_by_a_real_message() -> None:
    used = {c.pattern for c in message_cases()}
    for row in MESSAGE_PATTERNS:
        assert row.source.strip(), row.name
    # Rows without a fixture: patterns whose messages only the framework's source shows.
    untested = {row.name for row in MESSAGE_PATTERNS} - used
    assert untested <= {
        "pytorch-oom-class", "tensorflow-oom-cpu", "cuda-runtime-error", "cuda-runtime-enum", "vllm-startup-free",
        "tensorflow-resource-exhausted", "python-memory-error",
    }


def test_the_more_specific_row_wins() -> None:
    cpu = "OOM when allocating tensor with shape[10] and type float on /job:localhost/replica:0/task:0/device:CPU:0"
    found = match_message(cpu)
    assert found is not None and found.pattern.name == "tensorflow-oom-cpu"
    assert classify(Evidence(exit_code=1, message=cpu)).kind == "HostOutOfMemory"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2.00 GiB", 2 << 30), ("512 bytes", 512), ("8000000000", 8_000_000_000), ("1.5 MB", 1_500_000), ("3 parsecs", None)],
)
def test_sizes_as_frameworks_print_them(text: str, expected: int | None) -> None:
    assert size_bytes(text) == expected


def test_no_text_no_match() -> None:
    assert match_message(None) is None
    assert match_message("") is None
