"""The list+watch informer against an HTTP server standing in for the API
server (the real kubernetes client underneath): paginated listing, watch
events from the list's version, bookmarks, a filter that lets an object go,
and a relist after ``410 Gone`` that hands on what was deleted meanwhile."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from vramguard_operator.controller.informer import Informer
from vramguard_operator.plan.changes import Change, Synced

from ..agent.stubapi import StubAPI


@pytest.fixture()
def stub() -> Iterator[StubAPI]:
    s = StubAPI()
    yield s
    s.close()


def pod(name: str, rv: str, app: str = "x") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": rv,
                         "labels": {"app": app}}}


def page(items: list[dict[str, Any]], rv: str, cont: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"kind": "PodList", "metadata": meta, "items": items}


def events(*evs: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in evs)


def informer(stub: StubAPI, seen: list[Any]) -> Informer[str]:
    core = client.CoreV1Api(stub.api_client())
    return Informer("pods", functools.partial(core.list_pod_for_all_namespaces, label_selector="gpu=true"),
                    lambda b: b["metadata"]["uid"],
                    lambda b: b["metadata"]["labels"]["app"] if b["metadata"]["labels"]["app"] != "skip" else None,
                    seen.append, page_size=2)


def test_list_then_watch_then_relist_after_gone(stub: StubAPI) -> None:
    stub.respond("GET", r"^/api/v1/pods\?(?!.*watch=true)",
                 (200, page([pod("a", "1"), pod("b", "2")], "5", cont="next")),
                 (200, page([pod("c", "3")], "5")),
                 (200, page([pod("a", "9", app="y"), pod("d", "11")], "12")))  # after the 410: b, c gone
    stub.respond("GET", r"^/api/v1/pods\?.*watch=true",
                 (200, events(("ADDED", pod("e", "6")), ("MODIFIED", pod("a", "7", app="z")),
                              ("MODIFIED", pod("e", "7", app="skip")), ("BOOKMARK", {"metadata": {"resourceVersion": "8"}}),
                              ("DELETED", pod("c", "8")))),
                 (200, events(("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}))))
    seen: list[Any] = []
    inf = informer(stub, seen)
    inf._list()
    assert [(c.key, c.new) for c in seen if isinstance(c, Change)] == [
        ("uid-a", "x"), ("uid-b", "x"), ("uid-c", "x")]
    assert seen[-1] == Synced("pods") and inf.synced.is_set()
    lists = [parse_qs(urlparse(r.path).query) for r in stub.requests]
    assert lists[1]["continue"] == ["next"] and lists[0]["labelSelector"] == ["gpu=true"]
    seen.clear()
    assert inf._watch() is True  # the server ended the watch: watch again from the last version
    watch = parse_qs(urlparse(stub.requests[-1].path).query)
    assert watch["resourceVersion"] == ["5"] and watch["allowWatchBookmarks"] == ["true"]
    assert [(c.key, c.old, c.new) for c in seen] == [
        ("uid-e", None, "x"), ("uid-a", "x", "z"), ("uid-e", "x", None), ("uid-c", "x", None)]
    assert inf._version == "8"  # from the bookmark
    seen.clear()
    assert inf._watch() is False  # 410: relist
    inf._list()
    assert sorted((c.key, c.old, c.new) for c in seen) == [
        ("uid-a", "z", "y"), ("uid-b", "x", None), ("uid-d", None, "x")]
    assert inf.store() == {"uid-a": "y", "uid-d": "x"}
    assert inf.events == 4  # watch events handled (bookmarks and errors aside)
