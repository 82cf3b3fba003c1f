"""Driver-enforced memory limits on pods' cgroups: probe, reconcile, report.

The operator writes the limits a pod should have in the pod's
``vramguard.io/memory-limits`` annotation (``vramguard_api.memlimits``); each
step of the agent, between reading a sample and reporting it
(``agent.Components.tick``), ``CapEnforcer.reconcile``

1. probes each GPU (``nvml_limits``; at start, for a new device, then every
   ``probe_interval_s``) and records the answer on the sample's devices;
2. with ``enforce`` off stops there: wanted limits are reported ``Disabled``;
3. waits for the first list of the node's pods (no action on unknown wants);
4. once per device (at start, or when the device first answers), reads what
   the driver holds for every GPU pod and every pod with the annotation, so
   that a restarted agent knows the limits it (or its predecessor) set: a
   restart neither loses nor duplicates a cap;
5. sets what is wanted and not held, clears what is held and no longer wanted
   (annotation removed or pod deleted; a removed cgroup clears its limits by
   itself), reads every change back, and re-reads settled limits every
   ``verify_interval_s``;
6. returns, per pod, an entry per device: state, reason and what the driver holds.

The decisions are pure, in ``limits_plan`` (``decide``). The agent owns the limits of
the pods' cgroups on its node: limits it finds that no annotation wants are
cleared (docs/agent.md, "Memory limits"). A limit is applied to the pod's
cgroup (the parent of its containers' cgroups), so it bounds the pod's sum over
its containers and survives a container's restart; the cgroup path is the
pod's path under the host's cgroup root, prefixed with ``nvml_cgroup_root``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from vramguard_api import memlimits as ML

from .gpu import DeviceSample, GPUSample, MemoryLimitsSupport
from .limits_plan import Facts, Key, LimitEntry, PodLimits, Step, decide, describe, entry, not_held, uids, wanted_limits
from .nvml_limits import HeldLimits, LimitsError, NVMLMemoryLimits
from .pods import PodMeta

log = logging.getLogger(__name__)

NVML_CGROUP_ROOT = "/sys/fs/cgroup"
DEFAULT_PROBE_INTERVAL_S = 600.0
DEFAULT_VERIFY_INTERVAL_S = 60.0


class CapEnforcer:
    """Applies and reports pods' memory limits on one node; see the module docstring.

    ``pods_synced`` says whether the node's pods have been listed; the probe reads
    the cgroup of ``own_pod_uid`` (the agent's pod), else ``own_cgroup`` (the
    agent process's, relative to the cgroup root), else the root;
    ``on_operation(operation, result)`` counts each NVML call (get/set/clear, ok/error).
    """

    def __init__(
        self,
        limits: NVMLMemoryLimits,
        enforce: bool = False,
        nvml_cgroup_root: str = NVML_CGROUP_ROOT,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        verify_interval_s: float = DEFAULT_VERIFY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        pods_synced: Callable[[], bool] = lambda: True,
        own_pod_uid: str | None = None,
        own_cgroup: str | None = None,
        on_operation: Callable[[str, str], None] = lambda op, result: None,
    ) -> None:
        self.limits = limits
        self.enforce = enforce
        self.root = nvml_cgroup_root.rstrip("/")
        self.probe_interval_s = probe_interval_s
        self.verify_interval_s = verify_interval_s
        self.clock = clock
        self.pods_synced = pods_synced
        self.own_pod_uid = own_pod_uid
        self.own_cgroup = own_cgroup
        self.on_operation = on_operation
        self.support: dict[str, MemoryLimitsSupport] = {}
        self._probed_at: dict[str, float] = {}
        self.held: dict[Key, HeldLimits] = {}
        self._verified_at: dict[Key, float] = {}
        self._problems: dict[Key, tuple[str, str]] = {}  # key -> (reason, message) of a Failed entry
        self._swept: set[str] = set()  # devices whose held limits were read once
        self._last: dict[str, PodLimits] = {}

    def namespace(self, relative: str) -> str:
        """NVML's nameSpace of a cgroup at ``relative`` under the host's cgroup root."""
        return f"{self.root}/{relative.strip('/')}" if relative.strip("/") else self.root

    def cgroups_needed(self, pods: Mapping[str, PodMeta]) -> list[str]:
        """Cgroup uids whose cgroup the sampler must read for these limits: the pods
        with the annotation, and the agent's own (the probe's target)."""
        annotated = [u for u, m in pods.items() if m.memory_limits is not None and u == (m.config_hash or m.uid)]
        return [*annotated, *([self.own_pod_uid] if self.own_pod_uid else [])]

    def reconcile(
        self,
        gpu: GPUSample | None,
        pods: Mapping[str, PodMeta],
        cgroup_path: Callable[[str], str | None],
        cgroup_v2: bool,
    ) -> dict[str, PodLimits]:
        """One pass (module docstring); returns the report's entries by pod cgroup uid.

        ``cgroup_path(uid)`` is a pod's cgroup path relative to the cgroup root,
        None when it has none. Without a GPU sample nothing is done and the last
        entries are returned.
        """
        if gpu is None:
            return self._last
        self.limits.driver_version = gpu.driver_version
        devices = {d.uuid: d for d in gpu.devices if d.health == "Healthy" and d.parent_uuid is None}
        self._probe(gpu.devices, cgroup_path, cgroup_v2)
        metas = {(m.config_hash or m.uid): m for m in pods.values()}
        wanted, errors = wanted_limits(metas)
        result = {uid: PodLimits(error=err) for uid, err in errors.items()}
        if not self.enforce:
            for uid, uuid in sorted(wanted):
                disabled = LimitEntry(
                    uuid, "Disabled", ML.REASON_ENFORCEMENT_DISABLED, "the agent runs without --enforce-caps"
                )
                result.setdefault(uid, PodLimits()).entries.append(disabled)
            self._last = result
            return result
        if not self.pods_synced():
            return self._last  # no want is known yet: change nothing
        supported = [u for u, s in self.support.items() if s.supported and u in devices]
        unswept = [u for u in supported if u not in self._swept]
        gpu_pods = {u for u, m in metas.items() if m.gpu} if unswept else set()
        needed = uids(wanted) | uids(self.held) | gpu_pods
        cgroups = {uid: self.namespace(path) for uid in sorted(needed) if (path := cgroup_path(uid)) is not None}
        if unswept:
            self._sweep(gpu_pods | uids(wanted), unswept, devices, cgroups)
        self._forget({d.uuid for d in gpu.devices}, cgroups)
        for step in decide(wanted, self.held, supported, cgroups, unknown=errors):
            if self.support[step.key[1]].supported:  # an earlier step may have found the device cannot
                self._apply(step, devices[step.key[1]], cgroups[step.key[0]])
        self._verify(wanted, devices, cgroups)
        self._last = self._entries(wanted, devices, cgroups, result, refused=errors)
        return self._last

    # --- probe ------------------------------------------------------------------

    def _probe(self, samples: list[DeviceSample], cgroup_path: Callable[[str], str | None], cgroup_v2: bool) -> None:
        now = self.clock()
        own = cgroup_path(self.own_pod_uid) if self.own_pod_uid else None
        target = self.namespace(own or self.own_cgroup or "")
        for d in samples:
            if d.health != "Healthy":
                continue  # a device that does not answer: its support is unknown
            last = self._probed_at.get(d.uuid)
            if d.uuid not in self.support or last is None or now - last >= self.probe_interval_s:
                support = self.limits.probe(d, target, cgroup_v2)
                if support.reason not in ML.STATIC_REASONS:
                    self._count("get", support.supported)
                if self.support.get(d.uuid) != support:
                    log.info(
                        "memory limits on %s: %s (%s: %s)", d.uuid, _word(support), support.reason, support.message
                    )
                self.support[d.uuid], self._probed_at[d.uuid] = support, now
            d.memory_limits = self.support[d.uuid]

    def _unsupported(self, uuid: str, err: LimitsError) -> None:
        """A call says the device cannot hold limits: so until the next probe."""
        self.support[uuid] = MemoryLimitsSupport(False, err.reason, err.message)
        log.warning("memory limits on %s: unsupported (%s: %s)", uuid, err.reason, err.message)

    # --- reading what the driver holds -------------------------------------------

    def _sweep(
        self, candidates: set[str], unswept: list[str], devices: Mapping[str, DeviceSample], cgroups: Mapping[str, str]
    ) -> None:
        """Read, once per device, what the driver holds for every GPU pod and every pod
        with wants (at start, or when a device first answers)."""
        for uuid in unswept:
            for uid in sorted(candidates):
                if uid in cgroups:
                    self._read((uid, uuid), devices[uuid], cgroups[uid])
            self._swept.add(uuid)
        found = sorted(k for k in self.held if k[1] in unswept)
        if found:
            log.info("memory limits the driver holds: %s", ", ".join(f"pod {u} on {d}" for u, d in found))

    def _read(self, key: Key, device: DeviceSample, namespace: str) -> HeldLimits | None:
        """What the driver holds for ``key``, remembered; None when the get failed (a
        failed set's problem, more telling, is kept over the get's)."""
        self._verified_at[key] = self.clock()
        try:
            held = self.limits.get(device.index, namespace)
        except LimitsError as err:
            self._count("get", False)
            if err.device_wide:
                self._unsupported(device.uuid, err)
            self._problems.setdefault(key, (ML.REASON_GET_FAILED, err.message))
            return None
        self._count("get", True)
        if self._problems.get(key, ("",))[0] == ML.REASON_GET_FAILED:
            del self._problems[key]
        if held.is_clear:
            self.held.pop(key, None)
        else:
            self.held[key] = held
        return held

    def _forget(self, present: set[str], cgroups: Mapping[str, str]) -> None:
        """Drop held limits whose device is gone from NVML's list (a lost GPU keeps its
        entry) or whose cgroup is gone (a removed cgroup clears its own limits)."""
        self._swept &= present
        for key in [k for k in self.held if k[1] not in present or k[0] not in cgroups]:
            why = "device" if key[1] not in present else "cgroup"
            log.info("memory limits of pod %s on %s: forgotten (%s gone)", *key, why)
            self.held.pop(key)

    # --- changing it ---------------------------------------------------------------

    def _apply(self, step: Step, device: DeviceSample, namespace: str) -> None:
        key = step.key
        want = step.wanted
        try:
            if want is None:
                self.limits.clear(device.index, namespace)
            else:
                self.limits.set(device.index, namespace, want.soft_limit, want.nvml_hard_limit)
        except LimitsError as err:
            self._count(step.action, False)
            if err.device_wide:
                self._unsupported(device.uuid, err)
            self._problems[key] = (ML.REASON_SET_FAILED, err.message)
            log.warning("memory limits of pod %s on %s: %s failed: %s", *key, step.action, err.message)
            return
        self._count(step.action, True)
        self._problems.pop(key, None)
        held = self._read(key, device, namespace)
        if want is not None and held is not None and not held.holds(want):
            self._problems[key] = (ML.REASON_NOT_HELD, not_held(want, held))
            log.warning("memory limits of pod %s on %s: %s", *key, not_held(want, held))
        elif held is not None:
            log.info("memory limits of pod %s on %s: %s", *key, "cleared" if want is None else describe(want))

    def _verify(
        self,
        wanted: Mapping[Key, ML.DeviceMemoryLimit],
        devices: Mapping[str, DeviceSample],
        cgroups: Mapping[str, str],
    ) -> None:
        """Re-read settled limits every ``verify_interval_s`` (someone may have changed them)."""
        now = self.clock()
        for key in sorted(wanted.keys() | self.held.keys()):
            uid, uuid = key
            support = self.support.get(uuid)
            if support is None or not support.supported or uuid not in devices or uid not in cgroups:
                continue
            if now - self._verified_at.get(key, -float("inf")) >= self.verify_interval_s:
                self._read(key, devices[uuid], cgroups[uid])

    # --- the report ----------------------------------------------------------------

    def _entries(
        self,
        wanted: Mapping[Key, ML.DeviceMemoryLimit],
        devices: Mapping[str, DeviceSample],
        cgroups: Mapping[str, str],
        result: dict[str, PodLimits],
        refused: Mapping[str, str],
    ) -> dict[str, PodLimits]:
        keys = wanted.keys() | self.held.keys()
        for key in sorted(keys):
            uid, uuid = key
            facts = Facts(
                want=wanted.get(key),
                held=self.held.get(key),
                support=self.support.get(uuid),
                device=uuid in devices,
                cgroup=uid in cgroups,
                problem=self._problems.get(key),
                refused=uid in refused,
            )
            result.setdefault(uid, PodLimits()).entries.append(entry(uuid, facts))
        # What is neither wanted nor held any more leaves no trace.
        self._problems = {k: v for k, v in self._problems.items() if k in keys}
        self._verified_at = {k: v for k, v in self._verified_at.items() if k in keys}
        return result

    def _count(self, operation: str, ok: bool) -> None:
        self.on_operation(operation, "ok" if ok else "error")


def _word(support: MemoryLimitsSupport) -> str:
    return "supported" if support.supported else "unsupported"
