"""The seal on a pod's escalation state: proof that this operator wrote it.

The state lives in pod annotations (``vramguard.io/violations``,
``vramguard.io/original-cpu``), which anyone allowed to update the pod can
write unless the chart's annotation guard (a ValidatingAdmissionPolicy) is in
place. Obeying forged state would let a tenant buy CPU (an ``original-cpu``
above what the pod had, restored on recovery) or escape eviction (a step the
operator never reached). So the operator seals what it writes: an
HMAC-SHA256 (RFC 2104, Python's ``hmac``) under a key only it holds, over the
pod's uid and both annotations, in ``vramguard.io/state-signature``. State
whose seal does not verify was not written by this operator (with this key)
and is ignored, reported, and replaced at the pod's next write.

The seal binds the pod's uid, so state copied from another pod does not
verify. It cannot stop a writer from removing the state (that is what the
annotation guard is for), nor from putting back an older sealed state of the
same pod.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from vramguard_operator.engine.keys import (
    ANNOTATION_ORIGINAL_CPU,
    ANNOTATION_STATE_SIGNATURE,
    ANNOTATION_VIOLATIONS,
)

SEALED = (ANNOTATION_VIOLATIONS, ANNOTATION_ORIGINAL_CPU)
"""The annotations the seal covers."""
_VERSION = "v1:"


def seal(key: bytes, uid: str, violations: str | None, original: str | None) -> str:
    """The seal of a pod's state: ``v1:`` and the hex HMAC-SHA256 under ``key``
    of the uid and both annotation values (absent and empty are the same)."""
    msg = "\n".join((uid, violations or "", original or "")).encode()
    return _VERSION + hmac.new(key, msg, hashlib.sha256).hexdigest()


def has_state(annotations: Mapping[str, str]) -> bool:
    """Whether the pod carries escalation state (either sealed annotation)."""
    return any(annotations.get(k) for k in SEALED)


def verify(key: bytes, uid: str, annotations: Mapping[str, str]) -> bool:
    """Whether the pod's state is sealed with ``key`` (no state needs no seal)."""
    if not has_state(annotations):
        return True
    given = annotations.get(ANNOTATION_STATE_SIGNATURE) or ""
    want = seal(key, uid, annotations.get(ANNOTATION_VIOLATIONS), annotations.get(ANNOTATION_ORIGINAL_CPU))
    return hmac.compare_digest(given.encode(), want.encode())


def sealed(key: bytes | None, uid: str, annotations: Mapping[str, str | None]) -> str | None:
    """The ``vramguard.io/state-signature`` value for the final annotations of a
    pod (after its patch): None without a key or without state."""
    if key is None:
        return None
    violations, original = annotations.get(ANNOTATION_VIOLATIONS), annotations.get(ANNOTATION_ORIGINAL_CPU)
    if not violations and not original:
        return None
    return seal(key, uid, violations, original)
