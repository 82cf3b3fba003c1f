"""``terminationMessagePolicy: FallbackToLogsOnError`` for GPU containers (the mutating webhook).

A container that crashes with "CUDA out of memory" writes the message to its
log, not to ``/dev/termination-log``; with the default policy (``File``) the
pod's status then carries no message, and the OOM record can only guess from
the free memory (docs/oom.md). ``FallbackToLogsOnError`` makes the kubelet put
the last log lines (at most 2,048 bytes or 80 lines) into
``lastState.terminated.message`` when the container failed and wrote no
termination message: the framework's message reaches the pod's status without
log access, and a container that does write its termination file keeps it.

The API server applies defaults before admission, so a container that set
nothing arrives with ``File``; ``File`` is replaced, an explicit
``FallbackToLogsOnError`` is left as it is. Switched by the policies'
``terminationMessageFallback`` (unset: on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FALLBACK = "FallbackToLogsOnError"


def termination_message_ops(pod: Mapping[str, Any], gpu_containers: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902 ops) that sets ``FallbackToLogsOnError`` on the
    GPU containers (None or empty: every container) whose policy is unset or ``File``."""
    chosen = set(gpu_containers or ())
    ops = []
    for i, c in enumerate((pod.get("spec") or {}).get("containers") or ()):
        if chosen and (c.get("name") or str(i)) not in chosen:
            continue
        if c.get("terminationMessagePolicy") in (None, "File"):
            ops.append({"op": "add", "path": f"/spec/containers/{i}/terminationMessagePolicy", "value": FALLBACK})
    return ops
