"""Node reports naming pod uids that are not pods on their node (issue 32
item 1's last rule; docs/operator.md, "Reports naming unknown pods"). Pure.

The agent and the API race: a pod deleted just after the agent's sample stays
in the report until the next one, and a pod the agent sees may reach the
operator's pod watch a moment later. So a uid counts as unknown only once the
report has named it, while the pod cache had no such pod on that node, for
``grace_seconds`` on end. What is flagged is a warning only: the report is
still believed (``report_checks.unknown_pods``), and nothing is acted on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from vramguard_api.usage import NodeGPUUsageStatus
from vramguard_operator.engine.report_checks import unknown_pods
from vramguard_operator.plan.cache import ClusterCache


@dataclass(frozen=True, slots=True)
class UnknownPodsFlag:
    """A node whose report names unknown pods: how many, and the one-line
    message of ``report_checks.unknown_pods``."""

    count: int
    message: str


class UnknownReportPods:
    """Which node reports name unknown pods, past the grace period.

    ``grace_seconds``: how long a uid must be named without a pod of that uid
    on the node before it is flagged (the operator passes its freshness, the
    age beyond which a report is stale anyway). ``judged(namespace)``: whether
    the pod cache holds that namespace's pods, so that a uid the report places
    there can be judged (the operator passes the namespaces it watches and,
    with shards, owns: each replica flags the uids of its own namespaces, and
    none a pod it never sees); a report's pod without a namespace is judged
    under "". Call ``update`` only once the pod informers have listed (before
    that every pod is unknown)."""

    def __init__(self, grace_seconds: float, judged: Callable[[str], bool] = lambda ns: True) -> None:
        self.grace = timedelta(seconds=grace_seconds)
        self.judged = judged
        self._since: dict[str, dict[str, datetime]] = {}  # node -> uid -> first seen unknown
        self.flagged: dict[str, UnknownPodsFlag] = {}  # node -> what is flagged now

    def update(self, cache: ClusterCache, now: datetime) -> dict[str, UnknownPodsFlag | None]:
        """Look at every node's report; returns the nodes whose flag changed:
        the new flag, or None where it was cleared (the pods appeared, left the
        report, or the report is gone). A flag unchanged is not returned, so
        the caller posts one Event per change, not one per pass."""
        changes: dict[str, UnknownPodsFlag | None] = {}
        seen: set[str] = set()
        for node in cache.reports:
            rep = cache.report(node)
            if rep is None or rep.status is None:
                continue
            seen.add(node)
            flag = self._judge(node, rep.status, cache.pods_on_node.get(node, set()), now)
            if flag != self.flagged.get(node):
                changes[node] = flag
        for node in set(self._since) - seen:
            del self._since[node]
        for node in set(self.flagged) - seen:
            changes[node] = None
        for node, flag in changes.items():
            if flag is None:
                self.flagged.pop(node, None)
            else:
                self.flagged[node] = flag
        return changes

    def retry(self, node: str) -> None:
        """The change of ``node``'s flag was not reported (its Event failed):
        ``update`` returns it again."""
        self.flagged.pop(node, None)

    def _judge(self, node: str, st: NodeGPUUsageStatus, on_node: set[str], now: datetime) -> UnknownPodsFlag | None:
        """The node's flag now; keeps when each unknown uid was first seen
        (a uid that left the report, or whose pod appeared, starts again)."""
        named = {p.uid for p in st.pods}
        unjudged = {p.uid for p in st.pods if not self.judged(p.namespace or "")}
        since = self._since.get(node, {})
        since = {u: since.get(u, now) for u in named - on_node - unjudged}
        if since:
            self._since[node] = since
        else:
            self._since.pop(node, None)
        in_grace = {u for u, t in since.items() if now - t < self.grace}
        message = unknown_pods(st, on_node | unjudged | in_grace)
        if message is None:
            return None
        return UnknownPodsFlag(len(since) - len(in_grace), message)
