"""Evidence -> verdict: the rules' order, innocence and blame."""

from __future__ import annotations

import pytest

from vramguard_api.oom import DeviceEvidence, Evidence, Neighbour, classify

GiB = 1 << 30
TORCH = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 0 B"


def device(held: int, share: int | None, **kw: object) -> DeviceEvidence:
    return DeviceEvidence(uuid="GPU-0", free_bytes=GiB, usable_bytes=80 * GiB, held_bytes=held,
                          share_bytes=share, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("evidence", "kind", "confidence"),
    [
        (Evidence(exit_code=137, reason="OOMKilled"), "HostOutOfMemory", "High"),
        (Evidence(exit_code=137, reason="Error", oom_kills_delta=1), "HostOutOfMemory", "High"),
        (Evidence(exit_code=137, kernel_oom=True), "HostOutOfMemory", "High"),
        # The kernel's kill wins over a VRAM message printed before it.
        (Evidence(exit_code=137, reason="OOMKilled", message=TORCH), "HostOutOfMemory", "High"),
        (Evidence(exit_code=1, message=TORCH), "GPUOutOfMemory", "High"),
        (Evidence(exit_code=1, message="RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "GPUOutOfMemory",
         "Medium"),
        (Evidence(exit_code=1, cap_reason="HardLimit", message=TORCH), "CapKill", "High"),
        (Evidence(exit_code=1, device=device(10 * GiB, 20 * GiB, step_bytes=2 * GiB)), "GPUOutOfMemory", "Low"),
        # Plenty free, no message: not memory.
        (Evidence(exit_code=1, device=device(10 * GiB, 20 * GiB, step_bytes=GiB // 2)), "NotMemory", "Medium"),
        (Evidence(exit_code=0, reason="Completed"), "NotMemory", "Medium"),
        (Evidence(exit_code=0, reason="Completed", device=device(10 * GiB, 20 * GiB, step_bytes=2 * GiB)),
         "NotMemory", "Medium"),
        (Evidence(), "NotMemory", "Medium"),
    ],
)
def test_kind_and_confidence(evidence: Evidence, kind: str, confidence: str) -> None:
    verdict = classify(evidence)
    assert (verdict.kind, verdict.confidence) == (kind, confidence)
    assert verdict.because


def test_innocent_names_the_neighbours_above_their_shares_largest_first() -> None:
    neighbours = (Neighbour("ns/a", 30 * GiB, 20 * GiB), Neighbour("ns/b", 10 * GiB, 20 * GiB),
                  Neighbour("ns/c", 45 * GiB, 20 * GiB), Neighbour("ns/d", 5 * GiB, None))
    verdict = classify(Evidence(exit_code=1, message=TORCH, device=device(10 * GiB, 20 * GiB, neighbours=neighbours)))
    assert verdict.blame == "Innocent" and verdict.innocent
    assert [n.name for n in verdict.neighbours_above_share] == ["ns/c", "ns/a"]
    assert [n.over_bytes for n in verdict.neighbours_above_share] == [25 * GiB, 10 * GiB]
    assert any("ns/c held" in line for line in verdict.because)


def test_own_when_what_it_wanted_is_above_its_share() -> None:
    # Held 19 GiB, asked for 2 GiB (read from the message): 21 GiB > a 20 GiB share.
    verdict = classify(Evidence(exit_code=1, message=TORCH, device=device(19 * GiB, 20 * GiB)))
    assert verdict.blame == "Own" and not verdict.innocent
    assert verdict.neighbours_above_share == ()


def test_the_agents_requested_bytes_win_over_the_message() -> None:
    evidence = Evidence(exit_code=1, message=TORCH, device=device(19 * GiB, 20 * GiB, requested_bytes=GiB // 2))
    assert classify(evidence).blame == "Innocent"


def test_own_when_above_its_limit_even_within_its_share() -> None:
    evidence = Evidence(exit_code=1, message=TORCH, device=device(5 * GiB, 20 * GiB, limit_bytes=6 * GiB))
    verdict = classify(evidence)
    assert verdict.blame == "Own"
    assert any("limit of" in line for line in verdict.because)


def test_unknown_without_a_share() -> None:
    assert classify(Evidence(exit_code=1, message=TORCH)).blame == "Unknown"
    assert classify(Evidence(exit_code=1, message=TORCH, device=device(GiB, None))).blame == "Unknown"


def test_host_and_not_memory_verdicts_carry_no_blame() -> None:
    assert classify(Evidence(reason="OOMKilled", device=device(GiB, 20 * GiB))).blame is None
    assert classify(Evidence(exit_code=2)).blame is None


def test_host_verdict_names_ram_against_its_limit_and_vram_as_not_the_cause() -> None:
    verdict = classify(Evidence(reason="OOMKilled", ram_working_set_bytes=GiB, ram_limit_bytes=GiB))
    assert any("against a limit of" in line for line in verdict.because)
    assert "host RAM, not VRAM" in verdict.because
