"""Which nodes' pods the device-pressure rule couples in an incremental
evaluation (docs/operator.md, "The reconcile loop": "Device pressure couples
a node's pods ... while it is near").

The rule compares every pod on a device: the largest ``minFree`` of their
rules and the room the neediest pod within its share still needs give the
device's threshold, and only a device under it has anything to decide.
Evaluating a subset of a device's pods can only lower that threshold (a
maximum over fewer pods), so where the device is clear of it over all its
pods, it is clear over any subset: the subset decides nothing either, as a
pass over everything would. A node is therefore *far* — its pods are not
pulled in with any one of them — while:

- it was last evaluated with all its pods (coupled), from a fresh report that
  the operator believes, and every group that evaluated it succeeded;
- then every device of it that the rule judged was ``Clear`` with free memory
  at least ``margin`` above its threshold (``near_margin``: 5% of the
  device's usable memory, at least 1 GiB);
- and nothing the threshold is made of changed since: the report (the same
  object), a pod of the node or a pod its report names (any mark of such a
  pod: a change to it, its labels, claims or annotations, its node's report
  or node object or slices, its report turning stale, a policy of its
  namespace), or a budget that selects it (its spec, created or deleted:
  ``QuietAnswers.changed``).

Any such change makes the node *near* again until a coupled evaluation finds
it far. A device whose free memory moves closer to its threshold does so in
a new report, which marks every pod of its node: the node is coupled then,
so no decision is lost. The margin is not needed for exactness (nothing the
verdict reads changes while a node is far); it keeps a node that is close to
its threshold coupled, in case a change were ever missed above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime

from vramguard_operator.engine.measure import read_nodes
from vramguard_operator.engine.outputs import DevicePressureReport
from vramguard_operator.engine.records import whole_seconds
from vramguard_operator.plan.cache import ClusterCache
from vramguard_operator.plan.closure import node_pods

GI = 1 << 30
NEAR_MARGIN_FRACTION = 0.05
"""A device closer than this fraction of its usable memory to its threshold is near."""
NEAR_MARGIN_MIN_BYTES = GI
"""... or closer than 1 GiB, whichever is more."""


def near_margin(usable: int | None) -> int:
    """The margin above a device's threshold within which it is near (bytes)."""
    return max(NEAR_MARGIN_MIN_BYTES, int((usable or 0) * NEAR_MARGIN_FRACTION))


def slack_of(d: DevicePressureReport) -> float:
    """A device's slack in one verdict: its free memory above the rule's
    threshold (bytes, ``free_bytes - min_free_bytes``); ``-inf`` when the
    verdict is not ``Clear`` or either figure is unknown. The operator keeps a
    node far while the slack is at least the margin (``clear_of``); the fleet
    simulation keeps a device clear while what moved on it stays within its
    slack (``simulate.triggers``)."""
    if d.state != "Clear" or d.free_bytes is None or d.min_free_bytes is None:
        return -math.inf
    return float(d.free_bytes - d.min_free_bytes)


def device_slacks(reports: Iterable[DevicePressureReport]) -> dict[str, float]:
    """Each judged device's slack (bytes) by device UUID: the smallest over the
    groups that judged it (each group's threshold is the largest over its
    pods, so the device's is the largest of theirs)."""
    slack: dict[str, float] = {}
    for d in reports:
        slack[d.device] = min(slack.get(d.device, math.inf), slack_of(d))
    return slack


def clear_of(d: DevicePressureReport) -> bool:
    """Whether a device's verdict is ``Clear`` with free memory at least the
    margin above its threshold."""
    return slack_of(d) >= near_margin(d.usable_bytes)


class Coupling:
    """The far nodes (see the module doc), kept across evaluations.

    At each plan: ``settle`` (which of the last plan's coupled nodes are far),
    ``forget`` what changed, ``begin`` with the nodes coupled and ``expect``
    each group's nodes; after it, ``judged`` with each group's device reports
    (a node is far only once every group with a pod on it was judged) and
    ``failed`` for a group that could not be evaluated."""

    def __init__(self, cache: ClusterCache, freshness: float) -> None:
        self.cache = cache
        self.freshness = freshness
        self._far: dict[str, object] = {}  # node -> its report object when found far
        self._of_pod: dict[str, set[str]] = {}  # pod uid -> far nodes whose verdict reads it
        self._pending: dict[str, tuple[object, frozenset[str]]] = {}
        self._waiting: dict[str, int] = {}  # pending node -> groups with a pod on it not judged yet
        self._near: set[str] = set()

    def is_far(self, node: str) -> bool:
        """Whether ``node``'s pods may be left out with one of them."""
        rep = self._far.get(node)
        return rep is not None and rep is self.cache.report(node)

    def forget(self, pods: Iterable[str], nodes: Iterable[str] = ()) -> None:
        """Something the threshold of these pods' nodes (or of ``nodes``) is made
        of changed: they are near until a coupled evaluation finds them far."""
        near = set(nodes)
        for uid in pods:
            near |= self._of_pod.pop(uid, set())
            e = self.cache.pods.get(uid)
            if e is not None and e.facts.node_name:
                near.add(e.facts.node_name)
        for node in near:
            self._drop(node)
            self._pending.pop(node, None)

    def settle(self) -> None:
        """The last plan's coupled nodes that every group found clear are far."""
        for node, (rep, uids) in self._pending.items():
            if node in self._near or self._waiting.get(node) or rep is not self.cache.report(node):
                self._drop(node)
                continue
            self._far[node] = rep
            for uid in uids:
                self._of_pod.setdefault(uid, set()).add(node)
        self._pending, self._near, self._waiting = {}, set(), {}

    def begin(self, coupled: Iterable[str], now: datetime) -> None:
        """This plan's coupled nodes whose report is fresh and believed: far
        at the next ``settle`` unless a group finds a device of theirs near."""
        unknown = self.cache.unknown_nodes()
        for node in coupled:
            rep = self.cache.report(node)
            if rep is None or node in unknown:
                continue
            state = read_nodes({node: rep}, whole_seconds(now), self.freshness)[node].state
            if state == "Fresh":
                self._pending[node] = (rep, frozenset(node_pods(self.cache, node)))

    def expect(self, nodes: Iterable[str]) -> None:
        """A group of this plan has pods on these nodes: it must be judged."""
        for node in nodes:
            if node in self._pending:
                self._waiting[node] = self._waiting.get(node, 0) + 1

    def judged(self, devices: Iterable[DevicePressureReport], nodes: Iterable[str]) -> None:
        """A group's device reports (its pods on ``nodes``): a device not clear by
        the margin keeps its node near."""
        for node in nodes:
            if node in self._waiting:
                self._waiting[node] -= 1
        for d in devices:
            if not clear_of(d):
                self._near.add(d.node)

    def failed(self, nodes: Iterable[str]) -> None:
        """A group with pods on these nodes could not be evaluated: they stay near."""
        self._near |= set(nodes)

    def _drop(self, node: str) -> None:
        self._far.pop(node, None)
