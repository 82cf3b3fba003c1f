"""Out-of-memory evidence and verdicts (``docs/oom.md``): the frameworks' messages
(``messages``), the kernel OOM killer's lines (``kernel``) and the classifier
(``classify``), shared by the agent, the operator, the fleet simulation and
``vramguard analyze``."""

from vramguard_api.oom.classify import (
    KINDS,
    MEMORY_KINDS,
    Blame,
    DeviceEvidence,
    Evidence,
    Kind,
    Neighbour,
    Verdict,
    classify,
)
from vramguard_api.oom.kernel import KernelOOMKill, parse_kernel_lines
from vramguard_api.oom.messages import MESSAGE_PATTERNS, MessageMatch, MessagePattern, match_message

__all__ = [
    "KINDS", "MEMORY_KINDS", "MESSAGE_PATTERNS", "Blame", "DeviceEvidence", "Evidence", "KernelOOMKill", "Kind",
    "MessageMatch", "MessagePattern", "Neighbour", "Verdict", "classify", "match_message", "parse_kernel_lines",
]
