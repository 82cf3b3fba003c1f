"""The changes the planner is fed (``plan.cache.ClusterCache.apply``): one
object of a watched collection changed, or a collection was listed completely.

The operator's informers (``controller.informer``) hand these to the reconcile
loop; the tests' worlds and the fuzz harness build them directly. Pure.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class Change(Generic[E]):
    """One object changed in collection ``kind``: ``old`` None when it is new,
    ``new`` None when it is gone (deleted, or no longer kept by the parser)."""

    kind: str
    key: Hashable
    old: E | None
    new: E | None


@dataclass(frozen=True, slots=True)
class Synced:
    """Collection ``kind`` has been listed completely once."""

    kind: str
