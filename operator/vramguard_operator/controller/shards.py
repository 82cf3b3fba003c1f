"""Namespace shards on ``coordination.k8s.io/v1`` Leases (docs/operator.md,
"Shards").

With ``--shards N`` (N > 1) there are N Leases, ``vramguard-shard-<i>`` in the
operator's namespace, and namespace ``ns`` belongs to shard
``crc32(ns) mod N``. A replica decides only in the namespaces of the shards
whose Lease it holds, and only while it renewed them within the renew
deadline (``owns``); every replica watches everything, so that a shard taken
over is decided on at once from a complete view.

- **Holding**: each held Lease is renewed every ``renew_period`` (an update
  with the read resourceVersion: of two writers one wins).
- **Taking over**: a Lease whose record (holder, renewTime) this replica has
  seen unchanged for ``duration`` on its own clock, as client-go's leader
  election judges it, is taken by the first replica to update it; a free one
  (no holder) too, by a replica that holds none or that it was handed to.
- **Nothing decided twice**: a holder stops deciding ``renew_deadline`` after
  its last successful renewal, and every action checks ``owns`` first
  (``Applier``'s fence), so with ``duration`` ≥ ``renew_deadline`` + the API
  request timeout the old holder's last call has ended before anyone takes
  over. The escalation state is on the objects, so the new holder resumes at
  the right step.
- **Balance**: a replica holding no Lease while another holds two or more
  asks for one (annotation ``vramguard.io/wanted-by``); the holder stops
  deciding there, waits ``renew_deadline``, and frees it for the asker.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client

from vramguard_operator.controller.kubeapi import API_ERRORS, error_status, error_text, response_json

log = logging.getLogger("vramguard.shards")

WANTED_BY = "vramguard.io/wanted-by"
LEASE_PREFIX = "vramguard-shard-"
LEASE_VERBS = ("get", "create", "update")
"""What the shards do with Leases (the chart's Role grants exactly these)."""


def shard_of(namespace: str, shards: int) -> int:
    """The shard of a namespace: ``crc32(name) mod shards`` (stable across
    replicas, versions and restarts)."""
    return zlib.crc32(namespace.encode()) % shards


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """``shards``: how many; ``identity``: this replica's name in the Leases;
    ``namespace``: where the Leases are; ``duration``: seconds after which an
    unrenewed Lease may be taken over. A holder stops deciding half of it
    after its last renewal (``renew_deadline``) and renews every tenth
    (``renew_period``), as client-go's 15 s / 10 s / 2 s do roughly."""

    shards: int
    identity: str
    namespace: str
    duration: float = 30.0

    @property
    def renew_deadline(self) -> float:
        """Seconds after its last renewal that a holder stops deciding."""
        return self.duration / 2

    @property
    def renew_period(self) -> float:
        """Seconds between renewals."""
        return self.duration / 10

    def check(self, request_timeout: float) -> None:
        """Raises ``ValueError`` when a call begun just before the renew
        deadline could still be under way when another replica takes over."""
        if self.shards > 1 and request_timeout > self.duration - self.renew_deadline:
            raise ValueError(
                f"--lease-duration {self.duration:g}s: want at least twice --request-timeout "
                f"({request_timeout:g}s), so that a holder's last call ends before a take-over")


@dataclass(slots=True)
class _Seen:
    record: tuple[Any, ...]
    since: float  # monotonic: when this replica saw the record change


class ShardManager(threading.Thread):
    """Holds, renews, takes over and hands over the shard Leases (see the module
    doc). ``on_change(held)`` is called with the shards held after each change."""

    def __init__(
        self,
        config: ShardConfig,
        api: client.CoordinationV1Api,
        on_change: Callable[[frozenset[int]], None] = lambda held: None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(name="vramguard-shards", daemon=True)
        self.cfg = config
        self.api = api
        self.on_change = on_change
        self.clock = clock
        self.wall = wall
        self._held: frozenset[int] = frozenset()
        self._renewed_at: dict[int, float] = {}  # shard -> monotonic time of its last renewal
        self._seen: dict[int, _Seen] = {}
        self._releasing: dict[int, float] = {}  # shard -> when this replica stopped deciding there
        self._halt = threading.Event()

    # -- asked from any thread

    def owns(self, namespace: str) -> bool:
        """Whether this replica may decide in ``namespace`` now."""
        return self._valid(shard_of(namespace, self.cfg.shards))

    def leads(self) -> bool:
        """Whether this replica does the cluster-wide work (it holds shard 0)."""
        return self._valid(0)

    def _valid(self, shard: int) -> bool:
        return shard in self._held and self.clock() < self._renewed_at.get(shard, float("-inf")) + self.cfg.renew_deadline

    def held(self) -> frozenset[int]:
        """The shards held (and being renewed)."""
        return self._held

    def stop(self) -> None:
        """Stop; the Leases held are freed (another replica takes them at once)."""
        self._halt.set()

    # -- the loop

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except Exception:  # keep trying: losing the Leases only stops decisions
                log.exception("shard leases: tick failed")
            self._halt.wait(self.cfg.renew_period)
        self._free_all()

    def tick(self) -> None:
        """One round: read every Lease, renew, take over, ask for or hand over one."""
        started = self.clock()
        leases = {i: self._read(i) for i in range(self.cfg.shards)}
        mine = {i for i, body in leases.items() if body is not None and _holder(body) == self.cfg.identity}
        held = mine - set(self._releasing)
        for i in sorted(held):  # a failed renewal keeps the shard until its deadline (owns)
            if self._update(i, leases[i], self.cfg.identity):  # type: ignore[arg-type]
                self._renewed_at[i] = started
        for i, body in leases.items():
            if body is not None and i not in mine and self._may_take(i, body, len(held)):
                if self._update(i, body, self.cfg.identity, taking=True):
                    held.add(i)
                    self._renewed_at[i] = started
                    self._seen.pop(i, None)
                    log.info("shard %d taken (was %s)", i, _holder(body) or "free")
        self._balance(leases, held)
        self._set_held(frozenset(held))

    def _may_take(self, i: int, body: dict[str, Any], holding: int) -> bool:
        holder = _holder(body)
        wanted = _annotations(body).get(WANTED_BY)
        seen = self._seen.get(i)
        expired = seen is not None and self.clock() - seen.since >= self.cfg.duration
        if holder and not expired:
            return False
        if not holder and wanted and wanted != self.cfg.identity and not expired:
            return False  # handed to another replica: its turn first
        return holding == 0 or expired or wanted == self.cfg.identity

    def _balance(self, leases: dict[int, dict[str, Any] | None], held: set[int]) -> None:
        counts: dict[str, list[int]] = {}
        for i, body in leases.items():
            if body is not None and _holder(body):
                counts.setdefault(_holder(body), []).append(i)
        if not held and counts:
            richest = max(counts.items(), key=lambda kv: len(kv[1]))
            i = max(richest[1])
            body = leases[i]
            if len(richest[1]) > 1 and body is not None and _annotations(body).get(WANTED_BY) != self.cfg.identity:
                self._update(i, body, _holder(body), wanted=self.cfg.identity)
        for i in sorted(held):
            body = leases[i]
            wanted = _annotations(body).get(WANTED_BY) if body is not None else None
            if wanted and wanted != self.cfg.identity and len(held) > 1 and i not in self._releasing:
                log.info("shard %d: handing over to %s", i, wanted)
                self._releasing[i] = self.clock()
        for i, since in list(self._releasing.items()):
            held.discard(i)
            if self.clock() - since >= self.cfg.renew_deadline and leases.get(i) is not None:
                if self._update(i, leases[i], "", wanted=_annotations(leases[i]).get(WANTED_BY)):  # type: ignore[arg-type]
                    del self._releasing[i]

    def _set_held(self, held: frozenset[int]) -> None:
        if held != self._held:
            gained = held - self._held
            self._held = held
            log.info("shards held: %s", sorted(held) or "none")
            if gained:
                self.on_change(held)

    # -- API calls

    def _lease_name(self, i: int) -> str:
        return f"{LEASE_PREFIX}{i}"

    def _read(self, i: int) -> dict[str, Any] | None:
        try:
            body = _body(self.api.read_namespaced_lease(self._lease_name(i), self.cfg.namespace,
                                                        _preload_content=False))
        except API_ERRORS as err:
            if error_status(err) == 404:
                return self._create(i)
            log.warning("lease %s: %s", self._lease_name(i), error_text(err))
            return None
        spec = body.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), _annotations(body).get(WANTED_BY))
        seen = self._seen.get(i)
        if seen is None or seen.record != record:
            self._seen[i] = _Seen(record, self.clock())
        return body

    def _create(self, i: int) -> dict[str, Any] | None:
        body = {"metadata": {"name": self._lease_name(i), "namespace": self.cfg.namespace},
                "spec": {"leaseDurationSeconds": int(self.cfg.duration)}}
        try:
            created = _body(self.api.create_namespaced_lease(self.cfg.namespace, cast(Any, body),
                                                             _preload_content=False))
        except API_ERRORS as err:
            if error_status(err) != 409:
                log.warning("lease %s: %s", self._lease_name(i), error_text(err))
            return None
        self._seen[i] = _Seen((None, None, None), self.clock())  # free: for one that holds none, at once
        return created

    def _update(self, i: int, body: dict[str, Any], holder: str, taking: bool = False,
                wanted: str | None = None) -> bool:
        now = self.wall().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = dict(body.get("spec") or {})
        meta = dict(body.get("metadata") or {})
        annotations = dict(_annotations(body))
        if taking or holder != spec.get("holderIdentity"):
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
            spec["acquireTime"] = now if holder else None
            if holder == self.cfg.identity:
                annotations.pop(WANTED_BY, None)  # the asker got it
        if wanted is not None:
            annotations[WANTED_BY] = wanted
        spec.update(holderIdentity=holder or None, leaseDurationSeconds=int(self.cfg.duration),
                    renewTime=now if holder else None)
        meta["annotations"] = annotations or None
        try:
            self.api.replace_namespaced_lease(self._lease_name(i), self.cfg.namespace,
                                              cast(Any, {"metadata": meta, "spec": spec}), _preload_content=False)
        except API_ERRORS as err:
            if error_status(err) != 409:  # another replica was first: read again next round
                log.warning("lease %s: %s", self._lease_name(i), error_text(err))
            return False
        return True

    def _free_all(self) -> None:
        for i in sorted(self._held):
            body = self._read(i)
            if body is not None and _holder(body) == self.cfg.identity:
                self._update(i, body, "")
        self._set_held(frozenset())


def _body(resp: Any) -> dict[str, Any]:
    """A response read with ``_preload_content=False`` as a dict (a dict as it is)."""
    return dict(resp) if isinstance(resp, dict) else response_json(resp)


def _holder(body: dict[str, Any]) -> str:
    return str((body.get("spec") or {}).get("holderIdentity") or "")


def _annotations(body: dict[str, Any]) -> dict[str, str]:
    return dict((body.get("metadata") or {}).get("annotations") or {})
