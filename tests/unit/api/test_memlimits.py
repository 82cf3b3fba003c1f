"""The vramguard.io/memory-limits annotation: format, parsing, bounds, errors."""

from __future__ import annotations

import json

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_api import memlimits as ML
from vramguard_api.memlimits import DeviceMemoryLimit, MemoryLimitsError, format_memory_limits, parse_memory_limits

GIB = 1 << 30
U1 = "GPU-8f0e3a52-3d4e-4c1b-9a57-6f1e2b7d9c10"
U2 = "GPU-1a2b3c4d-0000-0000-0000-000000000000"


def test_max_sentinel_is_nvidia_ml_pys():
    assert ML.NVML_DEVICE_MEMORY_LIMIT_MAX == pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX


def test_parse_reads_hard_and_soft_limits_in_bytes():
    text = json.dumps({U1: {"hardLimit": 20 * GIB}, U2: {"softLimit": 10 * GIB, "hardLimit": 30 * GIB}})
    assert parse_memory_limits(text) == {
        U1: DeviceMemoryLimit(hard_limit=20 * GIB),
        U2: DeviceMemoryLimit(soft_limit=10 * GIB, hard_limit=30 * GIB),
    }
    only_soft = parse_memory_limits(json.dumps({U1: {"softLimit": 5 * GIB}}))[U1]
    assert only_soft.hard_limit is None and only_soft.nvml_hard_limit == ML.NVML_DEVICE_MEMORY_LIMIT_MAX


def test_format_is_compact_sorted_and_stable():
    limits = {U2: DeviceMemoryLimit(soft_limit=GIB, hard_limit=2 * GIB), U1: DeviceMemoryLimit(hard_limit=GIB)}
    text = format_memory_limits(limits)
    assert text == f'{{"{U2}":{{"hardLimit":{2 * GIB},"softLimit":{GIB}}},"{U1}":{{"hardLimit":{GIB}}}}}'
    assert format_memory_limits(dict(reversed(list(limits.items())))) == text
    assert parse_memory_limits(text) == limits


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("{", ["not JSON"]),
        ("[]", ["want an object"]),
        (json.dumps({"MIG-0000": {"hardLimit": GIB}}), ["'MIG-0000'", "not a GPU UUID"]),
        (json.dumps({"0": {"hardLimit": GIB}}), ["'0'", "not a GPU UUID"]),
        (json.dumps({U1: {}}), [U1, "hardLimit and/or softLimit"]),
        (json.dumps({U1: 5}), [U1, "got 5"]),
        (json.dumps({U1: {"hard": GIB}}), [U1, "unknown field(s) hard"]),
        (json.dumps({U1: {"hardLimit": "20Gi"}}), [f"{U1}'].hardLimit", "'20Gi'"]),
        (json.dumps({U1: {"hardLimit": 2.5e10}}), ["hardLimit", "whole number"]),
        (json.dumps({U1: {"softLimit": True}}), ["softLimit", "True"]),
        (json.dumps({U1: {"hardLimit": 1024}}), ["hardLimit: 1024 bytes", "256 MiB"]),
        (json.dumps({U1: {"hardLimit": ML.NVML_DEVICE_MEMORY_LIMIT_MAX}}), ["hardLimit", "outside"]),
        (json.dumps({U1: {"softLimit": -1}}), ["softLimit: -1 bytes"]),
        (json.dumps({U1: {"softLimit": 3 * GIB, "hardLimit": 2 * GIB}}), ["softLimit", f"hardLimit {2 * GIB}"]),
        (json.dumps({U1: {"softLimit": 0}}), [U1, "sets no limit"]),
        (f'{{"{U1}":{{"hardLimit":{GIB}}},"{U1}":{{"hardLimit":{GIB}}}}}', ["given twice", U1]),
        (json.dumps({f"GPU-{i:04d}": {"hardLimit": GIB} for i in range(65)}), ["65 devices", "64"]),
        ("x" * (ML.MAX_ANNOTATION_LENGTH + 1), ["characters"]),
    ],
)
def test_bad_annotations_are_refused_with_the_annotation_device_and_value(value, words):
    with pytest.raises(MemoryLimitsError) as err:
        parse_memory_limits(value)
    message = str(err.value)
    assert message.startswith(ML.MEMORY_LIMITS_ANNOTATION)
    for word in words:
        assert word in message


def test_one_bad_device_refuses_the_whole_annotation():
    text = json.dumps({U1: {"hardLimit": 20 * GIB}, U2: {"hardLimit": 1}})
    with pytest.raises(MemoryLimitsError, match=U2):
        parse_memory_limits(text)


def test_format_refuses_what_the_agent_would_refuse():
    with pytest.raises(MemoryLimitsError):
        format_memory_limits({U1: DeviceMemoryLimit(hard_limit=1)})
    with pytest.raises(MemoryLimitsError):
        format_memory_limits({U1: DeviceMemoryLimit()})


def test_memory_limits_of_annotations():
    assert ML.memory_limits_of(None) is None
    assert ML.memory_limits_of({"other": "x"}) is None
    text = format_memory_limits({U1: DeviceMemoryLimit(hard_limit=GIB)})
    assert ML.memory_limits_of({ML.MEMORY_LIMITS_ANNOTATION: text}) == {U1: DeviceMemoryLimit(hard_limit=GIB)}


limits = st.builds(
    lambda hard, soft_fraction: DeviceMemoryLimit(
        hard_limit=hard, soft_limit=int((hard or 80 * GIB) * soft_fraction) or (0 if hard else 1)
    ),
    st.one_of(st.none(), st.integers(ML.MIN_HARD_LIMIT_BYTES, ML.MAX_LIMIT_BYTES)),
    st.floats(0, 1),
)
uuids = st.from_regex(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}", fullmatch=True)


@given(st.dictionaries(uuids, limits, max_size=8))
def test_format_then_parse_is_the_identity(wanted):
    assert parse_memory_limits(format_memory_limits(wanted)) == wanted
