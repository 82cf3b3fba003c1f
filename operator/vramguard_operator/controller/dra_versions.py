"""Which version of the DRA API (``resource.k8s.io``) the cluster serves, found
by API discovery when the operator starts: ``v1`` (Kubernetes 1.34+), else
``v1beta2`` (1.33), else ``v1beta1`` (1.32). The claims' and slices' fields
vramguard reads have the same shape in all three, but for a v1beta1
ResourceSlice device's attributes and capacity, which sit under ``basic``
(``allocation_entries.slice_entry`` reads both). None served: DRA claims are
not read, and the startup log says so.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubernetes import client

from vramguard_operator.plan.allocation_entries import DRA_GROUP

DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
"""The versions vramguard reads, most preferred first."""


def pick_version(served: Iterable[str]) -> str | None:
    """The most preferred of :data:`DRA_VERSIONS` among ``served`` (the
    versions the API server lists for ``resource.k8s.io``), or None."""
    have = set(served)
    return next((v for v in DRA_VERSIONS if v in have), None)


def served_versions(api: client.ApiClient) -> list[str]:
    """The versions of ``resource.k8s.io`` the API server serves (discovery,
    ``GET /apis``); empty when the group is not served. Raises the client's
    ``ApiException`` when discovery fails."""
    groups = client.ApisApi(api).get_api_versions().groups or []
    return [v.version for g in groups if g.name == DRA_GROUP for v in g.versions or []]


def describe(version: str | None) -> str:
    """The startup log line for the DRA version in use."""
    if version is None:
        return (
            f"{DRA_GROUP} is not served at {', '.join(DRA_VERSIONS)}: DRA claims are not read "
            "(pods holding GPUs through ResourceClaims get no limit from their claims)"
        )
    return f"DRA: reading ResourceClaims and ResourceSlices at {DRA_GROUP}/{version}"
