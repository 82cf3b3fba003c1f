"""Named points between a state write and the Events that explain it, where a
test can kill the operator (``VRAMGUARD_CRASH_AT``).

The end-to-end suite proves that a restart loses no explanation and repeats
no step, whatever the moment of the crash (docs/operator.md, "What survives a
crash"). It starts the operator with ``VRAMGUARD_CRASH_AT=<point>`` (or
``<point>:<n>``: the n-th time the point is reached, default the first), and
the operator sends itself SIGKILL there: no cleanup, no flush, as the kernel's
OOM killer or a node failure would. Unset (always, outside tests), a point
costs one dictionary lookup.

The points, in the order the applier reaches them for one pod:

- ``after-restore-resize``: a restore's ``pods/resize`` accepted; its
  ``Recovered`` Events and the record's removal not yet done;
- ``after-recovered-event``: a ``Recovered`` Event posted (pod and budget);
  the record not yet removed from the pod;
- ``after-annotation-patch``: the pod's escalation state written; the step's
  action and Events not yet done;
- ``after-resize``: a Throttle's ``pods/resize`` accepted; its Events not yet posted;
- ``before-eviction``: the ``Evicting`` Events posted; the Eviction not yet sent;
- ``after-eviction``: the Eviction accepted;
- ``after-pod-event``: an Event posted on the pod; its copy on the budget not yet;
- ``after-budget-event``: an Event's copy posted on the budget;
- ``before-explained``: every Event of the pod's steps posted; the records
  not yet marked posted;
- ``before-status``: the pods' work done; the budget statuses not yet written.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import Counter

ENV = "VRAMGUARD_CRASH_AT"
POINTS = (
    "after-restore-resize",
    "after-recovered-event",
    "after-annotation-patch",
    "after-resize",
    "before-eviction",
    "after-eviction",
    "after-pod-event",
    "after-budget-event",
    "before-explained",
    "before-status",
)

log = logging.getLogger("vramguard.crashpoints")
_reached: Counter[str] = Counter()


def reached(point: str) -> None:
    """Kill the process with SIGKILL when ``VRAMGUARD_CRASH_AT`` names ``point``
    and this is the time it asks for; otherwise nothing."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != point:
        return
    _reached[point] += 1
    if _reached[point] < (int(nth) if nth.isdigit() else 1):
        return
    log.critical("%s=%s: killing the operator here (a test of crash recovery)", ENV, wanted)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)
