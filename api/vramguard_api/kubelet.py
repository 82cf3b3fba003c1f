"""What the kubelet does when a container exits: the parts the simulations need.

Shared by the agent's simulated backend and the operator's fleet simulation,
so that a container killed by a GPU out-of-memory error comes back (or not)
the same way in both.

- ``restartPolicy`` (pod spec): ``Always`` restarts a container whatever its
  exit; ``OnFailure`` restarts it after a failure (an OOM kill is one) but not
  after success; ``Never`` leaves it exited and the pod ``Failed``.
- CrashLoopBackOff: the kubelet waits before each restart, 10 s doubling up to
  5 min; a container that ran 10 min without exiting has its back-off reset.
  (kubelet ``pkg/kubelet/kubelet.go``: ``backOffPeriod = 10s``,
  ``MaxContainerBackOff = 300s``; the reset after twice the maximum is
  client-go's ``flowcontrol.Backoff`` as the kubelet configures it.)
"""

from __future__ import annotations

from typing import Literal

RestartPolicy = Literal["Always", "OnFailure", "Never"]
RESTART_POLICIES: tuple[RestartPolicy, ...] = ("Always", "OnFailure", "Never")

BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0
BACKOFF_RESET_S = 2 * BACKOFF_MAX_S


def restarts_after_failure(policy: RestartPolicy) -> bool:
    """Whether a container that failed (an OOM kill) is restarted."""
    if policy not in RESTART_POLICIES:
        raise ValueError(f"restartPolicy: {policy!r} is not one of {', '.join(RESTART_POLICIES)}")
    return policy != "Never"


def crash_loop_backoff(failures: int) -> float:
    """Seconds the kubelet waits before restarting a container after its
    ``failures``-th consecutive failure (1 for the first): 10, 20, 40, ... 300."""
    if failures < 1:
        raise ValueError(f"failures: want 1 or more, got {failures}")
    return min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2.0 ** min(failures - 1, 16))


def consecutive_failures(previous: int, ran_seconds: float) -> int:
    """The failure count after a container that ran ``ran_seconds`` since its
    last start failed again: the back-off is reset after a long enough run."""
    return 1 if ran_seconds >= BACKOFF_RESET_S else previous + 1
