"""Plain list+watch informers: one thread per watched collection, raw JSON,
parsed once into the small entries of ``plan.entries``, changes handed to a sink.

Why not kopf's indexes: during kopf's initial listing every object wakes every
object waiting on the indexes' readiness (``aiotoggles.ToggleSet.notify_all``),
so start-up grew with the square of the objects (62-70% of start-up at 2,000
pods), and each watch event cost 3-8 ms of Python on the event loop. Here an
event costs one ``orjson.loads`` and the entry's parser.

The protocol is client-go's reflector: a paginated LIST (``limit``,
``continue``), then a WATCH from the list's ``resourceVersion`` with
bookmarks (parsed with orjson); a watch that ends is re-established from the last version seen;
``410 Gone`` (or any error) relists, and the relist's differences are handed
on as changes, so a sink never misses a deletion. The sink sees ``Change``
objects in the order of the collection's events, and one ``Synced`` after the
first complete listing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import orjson

from vramguard_operator.controller.kubeapi import API_ERRORS, error_status
from vramguard_operator.plan.changes import Change, Synced

log = logging.getLogger("vramguard.informer")

E = TypeVar("E")
ListCall = Callable[..., Any]
"""A list method of the kubernetes client bound to its collection (for example
``CoreV1Api.list_pod_for_all_namespaces`` with ``label_selector`` set through
``functools.partial``); called with ``_preload_content=False``."""


Sink = Callable[[Change[Any] | Synced], None]


class Informer(threading.Thread, Generic[E]):
    """List and watch one collection in a daemon thread.

    ``key_of(body)`` names an object; ``parse(body)`` returns the entry kept for
    it, or None to leave it out (a filter); ``same(a, b)`` says whether two
    entries are equal (then no change is handed on; the default compares the
    entries). ``store()`` returns a copy of what is kept, by key, from any
    thread. ``page_size``: objects per LIST page; ``watch_seconds``: the
    server-side timeout of one WATCH (with up to 10% jitter, so that watches
    of many replicas do not end together). ``optional``: a collection the API
    server may not serve (``resource.k8s.io`` on an older cluster): a 404 makes
    it empty and listed, and it is listed again every five minutes."""

    def __init__(
        self,
        kind: str,
        list_call: ListCall,
        key_of: Callable[[Mapping[str, Any]], Hashable],
        parse: Callable[[Mapping[str, Any]], E | None],
        sink: Sink,
        page_size: int = 500,
        watch_seconds: float = 300.0,
        same: Callable[[E, E], bool] | None = None,
        optional: bool = False,
    ) -> None:
        super().__init__(name=f"vramguard-informer-{kind}", daemon=True)
        self.kind = kind
        self.list_call = list_call
        self.key_of = key_of
        self.parse = parse
        self.sink = sink
        self.page_size = page_size
        self.watch_seconds = watch_seconds
        self.same = same or (lambda a, b: a == b)
        self.optional = optional
        self.synced = threading.Event()
        self.events = 0  # watch events handled, for metrics and tests
        self._store: dict[Hashable, E] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._version = ""

    # -- reading

    def store(self) -> dict[Hashable, E]:
        """A copy of the entries kept, by key."""
        with self._lock:
            return dict(self._store)

    def get(self, key: Hashable) -> E | None:
        """One entry (None when not kept)."""
        with self._lock:
            return self._store.get(key)

    def stop(self) -> None:
        """Ask the thread to end (at its next event or watch timeout)."""
        self._halt.set()

    # -- the loop

    def run(self) -> None:
        backoff = 0.5
        while not self._halt.is_set():
            try:
                self._list()
                backoff = 0.5
                while not self._halt.is_set() and self._watch():
                    pass
            except API_ERRORS as err:
                if self.optional and error_status(err) == 404:
                    self._absent()
                    backoff = 300.0  # not served by this API server: look again now and then
                else:
                    log.warning("%s: list/watch failed (%s); relisting in %.1fs", self.kind, _why(err), backoff)
            except Exception:  # a bug in a parser must not end the watch for good
                log.exception("%s: list/watch failed; relisting in %.1fs", self.kind, backoff)
            if self._halt.wait(backoff):
                return
            backoff = min(30.0, backoff * 2)

    def _absent(self) -> None:
        """An optional collection the API server does not serve: empty, and
        listed (so that evaluations do not wait for it)."""
        for key in list(self.store()):
            self._put(key, None)
        if not self.synced.is_set():
            log.info("%s: not served by the API server; taken as empty", self.kind)
            self.synced.set()
            self.sink(Synced(self.kind))

    def _list(self) -> None:
        seen: dict[Hashable, E | None] = {}
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False, "_request_timeout": 60}
            if cont:
                kwargs["_continue"] = cont
            data = orjson.loads(self.list_call(**kwargs).data)
            for body in data.get("items") or ():
                seen[self.key_of(body)] = self.parse(body)
            meta = data.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                self._version = str(meta.get("resourceVersion") or "")
                break
        for key in [k for k in self.store() if k not in seen]:
            self._put(key, None)
        for key, entry in seen.items():
            self._put(key, entry)
        if not self.synced.is_set():
            self.synced.set()
            self.sink(Synced(self.kind))

    def _watch(self) -> bool:
        """One WATCH until the server ends it: True to watch again from the
        last version, False to relist (410 Gone, an ERROR event)."""
        seconds = int(self.watch_seconds * (1 + random.random() * 0.1))
        resp = self.list_call(
            watch=True,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _preload_content=False,
            _request_timeout=(10, seconds + 30),
        )
        try:
            for line in _lines(resp):
                if self._halt.is_set():
                    return False
                if not self._event(orjson.loads(line)):
                    return False
        finally:
            resp.release_conn()
        return True

    def _event(self, ev: Mapping[str, Any]) -> bool:
        kind, body = ev.get("type"), ev.get("object") or {}
        if kind == "ERROR":
            log.info("%s: watch ended by the server (%s); relisting", self.kind, body.get("message") or body)
            return False
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        if kind != "BOOKMARK":
            self.events += 1
            key = self.key_of(body)
            self._put(key, None if kind == "DELETED" else self.parse(body))
        if rv:
            self._version = rv
        return True

    def _put(self, key: Hashable, entry: E | None) -> None:
        with self._lock:
            old = self._store.get(key)
            if entry is None:
                self._store.pop(key, None)
            else:
                self._store[key] = entry
        if old is None and entry is None:
            return
        if old is not None and entry is not None and self.same(old, entry):
            return
        self.sink(Change(self.kind, key, old, entry))


def _lines(resp: Any) -> Iterator[bytes]:
    """The lines of a streamed response, each as soon as it is complete."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        if b"\n" not in chunk:
            continue
        *lines, buf = buf.split(b"\n")
        yield from (ln for ln in lines if ln.strip())
    if buf.strip():
        yield buf


def _why(err: Exception) -> str:
    status = error_status(err)
    return f"HTTP {status}" if status is not None else f"{type(err).__name__}: {err}"[:200]


def wait_synced(informers: Mapping[str, Informer[Any]] | list[Informer[Any]], timeout: float | None = None) -> bool:
    """Wait until every informer listed its collection once; False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for inf in informers.values() if isinstance(informers, Mapping) else informers:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not inf.synced.wait(left):
            return False
    return True
