"""Budget status writes, and the ``vramguard.io/limits`` annotations, off the
decision path: a queue and a thread of their own (docs/operator.md, "Budget
status").

The reconcile thread hands over each budget's desired status (``put``) and
goes on deciding; the writer keeps the latest one per budget (coalesced) and
writes it as a JSON merge patch from what it knows of the API's status
(``applier.Applier.write_statuses``, the same comparison as before):

- at once, when anything but figures changed: conditions (type, status,
  reason), violations and their steps and times, warnings, the mode, the
  generation observed (``decisive``);
- otherwise, when a figure moved by more than ``dead_band`` (1%) of its
  written value, or the number of pods selected changed: at most once per
  ``refresh`` seconds per budget (30 s by default); a figure that moved less
  waits for the next write of that budget.

``status.oomKills`` belongs to the OOM publisher (``controller/oom.py``): it
is neither compared nor removed here.

Figures are ``usage``, ``matchedPods``, the ``observedBytes`` of violations
and warnings, and the numbers inside messages. The engine never reads them
back to decide (it reads the escalation state), and the operator keeps the
desired status in memory for its next evaluation (``plan.cache``), so a figure
written late changes no decision. ``fence(namespace)`` is asked before each
write: a shard that no longer owns the namespace drops the write.

``vramguard.io/limits`` patches (``put_limits``) take turns with the due
status writes, one per pod (the latest wins), and are reported back through
``on_limits`` (the reconcile thread records them).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vramguard_api.budget import OOM_KILLS_FIELD
from vramguard_operator.controller.applier import Applier, ApplyContext, ApplyResult
from vramguard_operator.controller.metrics import Metrics
from vramguard_operator.engine.types import BudgetStatusUpdate, PodRef

log = logging.getLogger("vramguard.status")

BudgetKey = tuple[str, str]
_NUMBER = re.compile(r"\d[\d.]*\s*(?:[KMGTPE]i?)?")
_FIGURE_LISTS = ("violations", "warnings")


def _mask(text: Any) -> Any:
    return _NUMBER.sub("#", text) if isinstance(text, str) else text


def decisive(status: Mapping[str, Any] | None) -> Any:
    """A status in API form without its figures (see the module doc): two
    statuses with the same ``decisive`` differ only in figures."""
    if not status:
        return None
    # oomKills is the OOM publisher's (controller/oom.py): never a reason to write
    out: dict[str, Any] = {k: v for k, v in status.items() if k not in ("usage", "matchedPods", OOM_KILLS_FIELD)}
    out["conditions"] = [{**c, "message": _mask(c.get("message"))} for c in status.get("conditions") or ()]
    for name in _FIGURE_LISTS:
        out[name] = [{**{k: v for k, v in e.items() if k != "observedBytes"}, "message": _mask(e.get("message"))}
                     for e in status.get(name) or ()]
    return out


def figures_moved(old: Mapping[str, Any] | None, new: Mapping[str, Any], dead_band: float) -> bool:
    """Whether a figure of ``new`` differs from ``old`` by more than
    ``dead_band`` of the larger of the two (or the selected pods' count at all)."""
    old = old or {}
    if old.get("matchedPods") != new.get("matchedPods"):
        return True
    pairs = [((old.get("usage") or {}).get(k), (new.get("usage") or {}).get(k)) for k in ("vramBytes", "ramBytes")]
    for name in _FIGURE_LISTS:
        before = {_entry_key(e): e.get("observedBytes") for e in old.get(name) or ()}
        pairs += [(before.get(_entry_key(e)), e.get("observedBytes")) for e in new.get(name) or ()]
    for a, b in pairs:
        if (a is None) != (b is None):
            return True
        if a is not None and b is not None and abs(a - b) > dead_band * max(abs(a), abs(b)):
            return True
    return False


def _entry_key(e: Mapping[str, Any]) -> tuple[Any, ...]:
    return e.get("kind"), e.get("pod"), e.get("device")


@dataclass(slots=True)
class _Pending:
    update: BudgetStatusUpdate
    desired: dict[str, Any]
    due: float
    urgent: bool


class StatusWriter(threading.Thread):
    """The writer thread (see the module doc). ``applier`` makes the calls;
    ``refresh``: seconds between two writes of only figures to one budget;
    ``dead_band``: the share by which a figure must move to be written."""

    def __init__(
        self,
        applier: Applier,
        refresh: float = 30.0,
        dead_band: float = 0.01,
        fence: Callable[[str], bool] = lambda ns: True,
        on_limits: Callable[[PodRef, Mapping[str, str | None], dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(name="vramguard-status-writer", daemon=True)
        self.applier = applier
        self.refresh = refresh
        self.dead_band = dead_band
        self.fence = fence
        self.on_limits = on_limits
        self.clock = clock
        self.metrics = metrics
        self.writes = {"at_once": 0, "refresh": 0}
        self._cv = threading.Condition()
        self._pending: dict[BudgetKey, _Pending] = {}
        self._known: dict[BudgetKey, tuple[int, dict[str, Any] | None]] = {}  # (resourceVersion, status)
        self._last: dict[BudgetKey, float] = {}
        self._limits: dict[str, tuple[PodRef, Mapping[str, str | None]]] = {}
        self._turn = False
        self._halt = False

    # -- the reconcile thread's side

    def put(self, upd: BudgetStatusUpdate, desired: dict[str, Any], current: dict[str, Any] | None,
            current_rv: str = "") -> None:
        """Write ``upd`` (``desired``: its status in API form) in its time.
        ``current``/``current_rv``: the API's status as the watch last showed it."""
        key = (upd.budget.namespace, upd.budget.name)
        with self._cv:
            rv = int(current_rv) if current_rv.isdigit() else 0
            if key not in self._known or rv > self._known[key][0]:
                self._known[key] = (rv, current)
            known = self._known[key][1]
            now = self.clock()
            if decisive(known) != decisive(desired):
                self._pending[key] = _Pending(upd, desired, now, True)
            elif figures_moved(known, desired, self.dead_band):
                due = max(now, self._last.get(key, -self.refresh) + self.refresh)
                self._pending[key] = _Pending(upd, desired, due, False)
            else:
                self._pending.pop(key, None)  # nothing worth a write (or the API already has it)
                return
            self._cv.notify()

    def put_limits(self, ref: PodRef, patch: Mapping[str, str | None]) -> None:
        """Write a pod's ``vramguard.io/limits`` patch (the latest per pod)."""
        with self._cv:
            self._limits[ref.uid] = (ref, patch)
            self._cv.notify()

    def forget(self, key: BudgetKey) -> None:
        """A deleted budget: nothing more to write or know."""
        with self._cv:
            self._pending.pop(key, None)
            self._known.pop(key, None)
            self._last.pop(key, None)

    def pending(self) -> int:
        """Writes waiting (statuses and limits)."""
        with self._cv:
            return len(self._pending) + len(self._limits)

    def stop(self) -> None:
        """End the thread (call ``flush`` after it for what is still queued)."""
        with self._cv:
            self._halt = True
            self._cv.notify()

    def write_due(self) -> int:
        """Write the statuses that are due now, in the calling thread; returns how many."""
        n = 0
        while True:
            with self._cv:
                ready = [(p.due, k) for k, p in self._pending.items() if p.due <= self.clock()]
                if not ready:
                    return n
                job = self._pending.pop(min(ready)[1])
            self._write(job)
            n += 1

    def flush(self) -> int:
        """Write everything queued now, due or not, in the calling thread (at
        shutdown, and in tests); returns how many writes were made."""
        n = 0
        while True:
            with self._cv:
                if self._pending:
                    job: Any = self._pending.pop(min(self._pending, key=lambda k: self._pending[k].due))
                elif self._limits:
                    job = self._limits.pop(next(iter(self._limits)))
                else:
                    return n
            if isinstance(job, tuple):
                self._write_limits(*job)
            else:
                self._write(job)
            n += 1

    # -- the writer thread

    def run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                if isinstance(job, tuple):
                    self._write_limits(*job)
                else:
                    self._write(job)
            except Exception:  # one bad write must not end the writer
                log.exception("status write failed")

    def _next(self) -> _Pending | tuple[PodRef, Mapping[str, str | None]] | None:
        with self._cv:
            while not self._halt:
                now = self.clock()
                due = [(p.due, k) for k, p in self._pending.items() if p.due <= now]
                # statuses and limits take turns, so that neither starves the other
                self._turn = not self._turn
                if self._limits and (self._turn or not due):
                    return self._limits.pop(next(iter(self._limits)))
                if due:
                    return self._pending.pop(min(due)[1])
                wait = min((p.due - now for p in self._pending.values()), default=None)
                self._cv.wait(wait)
            return None

    def _write(self, job: _Pending) -> None:
        key = (job.update.budget.namespace, job.update.budget.name)
        if not self.fence(key[0]):
            return
        with self._cv:
            known = self._known.get(key, (0, None))[1]
        result = ApplyResult()
        self.applier.write_statuses([job.update], ApplyContext(frozenset(), lambda ns: ("",), {key: known}), result)
        body = result.budgets.get(key)
        with self._cv:
            self._last[key] = self.clock()
            if body is not None:
                rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
                self._known[key] = (int(rv) if rv.isdigit() else 0, body.get("status"))
                self.writes["at_once" if job.urgent else "refresh"] += 1
        if body is not None and self.metrics is not None:
            self.metrics.status_written("at_once" if job.urgent else "refresh")

    def _write_limits(self, ref: PodRef, patch: Mapping[str, str | None]) -> None:
        if not self.fence(ref.namespace):
            return
        try:
            body = self.applier.actions.patch_pod_annotations(ref, patch)
        except Exception as err:  # the next evaluation asks again
            log.warning("pod %s/%s: vramguard.io/limits not written: %s", ref.namespace, ref.name, err)
            return
        if self.on_limits is not None:
            self.on_limits(ref, patch, body)
