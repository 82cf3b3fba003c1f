"""The fleet's workloads: kinds, what each wants over time, and a seeded mix.

Every workload is sized to the share of the GPU slot it lands on (``S``: the
node's usable memory / replicas, a MIG device's memory; ``policy.shares``), so
that the same mix fits time-sliced, MPS, MIG and vGPU nodes. What a process
*wants* is ``Shape.wants(progress)`` × S, ramped up over ``WARMUP_S`` after
each container start (loading weights); the device decides what it *gets*.

``progress`` is seconds of work done: it advances with the clock at the pod's
CPU speed (1, or the throttled fraction: see ``docs/simulation.md``), so a
throttled pod's memory grows more slowly in proportion, and a throttled job
takes longer.

=====================  =========  ===========================================
kind                   owner      memory (fractions of S)
=====================  =========  ===========================================
``training``           Job        sawtooth ``low`` → ``high`` (≤ 0.92) every
                                  ``period``: well-behaved, within its share
``inference``          Deployment steady ``base`` (≤ 0.85) with a small request
                                  sawtooth
``leaking-inference``  Deployment ``base`` growing ``growth`` per hour without
                                  bound (a leak), with a request sawtooth
``finetune``           Job        ramps from ``base`` to ``high`` (1.5–3 S:
                                  over its share) over ``ramp``, then a small
                                  sawtooth
``batch``              Job        ``base`` with bursts to ``high`` (0.8–1.3 S)
                                  lasting ``burst`` every ``period``
=====================  =========  ===========================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

KINDS = ("training", "inference", "leaking-inference", "finetune", "batch")
DEFAULT_MIX: Mapping[str, float] = {
    "training": 0.3,
    "inference": 0.3,
    "leaking-inference": 0.1,
    "finetune": 0.1,
    "batch": 0.2,
}
WARMUP_S = 60.0
"""After each container start, memory ramps up to the profile over this long."""
REQUEST_SAWTOOTH = (0.02, 40.0)
"""Inference servers' request sawtooth: amplitude (fraction of S) and period (s)."""
FINETUNE_SAWTOOTH = 0.02
"""A fine-tune's step sawtooth on its plateau (fraction of S): as NVML sees a
caching allocator, nearly flat."""
NAMESPACES = {
    "training": "training",
    "inference": "serving",
    "leaking-inference": "serving",
    "finetune": "research",
    "batch": "batch",
}
COMPONENT = {
    "training": "training",
    "inference": "inference",
    "leaking-inference": "inference",
    "finetune": "training",
    "batch": "batch",
}


def parse_mix(text: str) -> dict[str, float]:
    """``training=3,inference=3,leaking-inference=1,finetune=1,batch=2`` → proportions
    summing to 1 (kinds left out get 0). Raises ``ValueError`` naming ``--mix``,
    the kind and the value for an unknown kind, a bad or negative number, or an
    all-zero mix."""
    out = dict.fromkeys(KINDS, 0.0)
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, sep, value = item.partition("=")
        kind = kind.strip()
        if not sep or kind not in out:
            raise ValueError(f"--mix: {item!r} is not <kind>=<proportion> with a kind of {', '.join(KINDS)}")
        try:
            share = float(value)
        except ValueError:
            share = -1.0
        if not (math.isfinite(share) and share >= 0):
            raise ValueError(f"--mix: {kind}={value!r} is not a proportion >= 0")
        out[kind] = share
    total = sum(out.values())
    if total <= 0:
        raise ValueError(f"--mix: {text!r} gives every kind 0")
    return {k: v / total for k, v in out.items()}


@dataclass(frozen=True, slots=True)
class Shape:
    """What a workload's process wants, as a fraction of its share, over its
    progress (seconds of work). Fields by kind: see the module table."""

    kind: str
    base: float
    high: float = 0.0
    period_s: float = 60.0
    growth_per_h: float = 0.0
    ramp_s: float = 1.0
    burst_s: float = 0.0
    phase_s: float = 0.0

    def wants(self, progress_s: float) -> float:
        """Fraction of the share wanted after ``progress_s`` seconds of work."""
        k = self.kind
        if k == "training":
            return self.base + (self.high - self.base) * _phase(progress_s, self.period_s)
        if k in ("inference", "leaking-inference"):
            amp, period = REQUEST_SAWTOOTH
            return self.base + self.growth_per_h * progress_s / 3600.0 + amp * _phase(progress_s, period)
        if k == "finetune":
            level = self.base + (self.high - self.base) * min(1.0, progress_s / self.ramp_s)
            return level + FINETUNE_SAWTOOTH * _phase(progress_s, self.period_s)
        if k == "batch":
            bursting = (progress_s + self.phase_s) % self.period_s < self.burst_s
            return self.high if bursting else self.base
        raise ValueError(f"workload kind {k!r} is not one of {', '.join(KINDS)}")

    def growth_bytes_per_hour(self, progress_s: float, share_bytes: int) -> float:
        """The steady growth of what it wants at ``progress_s`` (bytes per hour of
        work): the leak rate, or a fine-tune's ramp; 0 for the others. The ground
        truth a Leak decision is checked against."""
        if self.kind == "leaking-inference":
            return self.growth_per_h * share_bytes
        if self.kind == "finetune" and progress_s < self.ramp_s:
            return (self.high - self.base) / self.ramp_s * 3600.0 * share_bytes
        return 0.0


def _phase(t: float, period: float) -> float:
    return (t % period) / period


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One workload: a Job (``work_s`` seconds of work, done from
    ``done_s``) or a Deployment (``work_s`` None: runs to the end) of
    ``replicas`` pods, created at ``arrival_s``. ``checkpoint_s``: a Job
    resumes from its last multiple of it after a restart (None: from 0).
    ``grace_s``: terminationGracePeriodSeconds. ``pdb``: a PodDisruptionBudget
    with maxUnavailable 1 covers the Deployment's pods."""

    name: str
    kind: str
    arrival_s: float
    shape: Shape
    replicas: int = 1
    work_s: float | None = None
    done_s: float = 0.0
    checkpoint_s: float | None = None
    cpu: str = "4"
    ram_bytes: int = 16 << 30
    grace_s: float = 30.0
    backoff_limit: int = 6
    pdb: bool = False

    @property
    def namespace(self) -> str:
        return NAMESPACES[self.kind]

    @property
    def is_job(self) -> bool:
        return self.work_s is not None


# --- drawing workloads ----------------------------------------------------------------


def _shape(kind: str, rng: np.random.Generator) -> Shape:
    u = rng.uniform
    if kind == "training":
        low = u(0.45, 0.6)
        return Shape(kind, low, high=u(0.75, 0.92), period_s=u(60.0, 600.0))
    if kind == "inference":
        return Shape(kind, u(0.5, 0.83))
    if kind == "leaking-inference":
        return Shape(kind, u(0.4, 0.6), growth_per_h=u(0.02, 0.15))
    if kind == "finetune":
        return Shape(kind, u(0.4, 0.6), high=u(1.5, 3.0), period_s=u(60.0, 300.0), ramp_s=u(1200.0, 3600.0))
    return Shape(kind, u(0.2, 0.4), high=u(0.8, 1.3), period_s=u(600.0, 1800.0), burst_s=u(60.0, 300.0),
                 phase_s=u(0.0, 1800.0))


# mean work (s) of each Job kind and how it is drawn
_WORK = {"training": (7200.0, 28800.0), "finetune": (3600.0, 14400.0), "batch": (1200.0, 7200.0)}
_CPU = {"training": "8", "inference": "4", "leaking-inference": "4", "finetune": "8", "batch": "4"}
_GRACE = {"training": 60.0, "inference": 30.0, "leaking-inference": 30.0, "finetune": 60.0, "batch": 30.0}
_RAM = {"training": 48, "inference": 24, "leaking-inference": 24, "finetune": 64, "batch": 16}
_CHECKPOINT = {"training": 1800.0, "finetune": 1800.0, "batch": None}


def _workload(kind: str, index: int, arrival: float, rng: np.random.Generator, started: bool) -> WorkloadSpec:
    shape = _shape(kind, rng)
    common = dict(
        shape=shape, cpu=_CPU[kind], ram_bytes=_RAM[kind] << 30, grace_s=_GRACE[kind], arrival_s=arrival
    )
    if kind in _WORK:
        work = float(rng.uniform(*_WORK[kind]))
        done = float(rng.uniform(0.0, work)) if started else 0.0
        return WorkloadSpec(f"{kind}-{index}", kind, work_s=work, done_s=done, checkpoint_s=_CHECKPOINT[kind],
                            **common)  # type: ignore[arg-type]
    replicas = 1 if kind == "leaking-inference" else int(rng.integers(1, 3))
    return WorkloadSpec(f"{kind}-{index}", kind, replicas=replicas, pdb=replicas > 1, **common)  # type: ignore[arg-type]


def generate(
    seed: int, mix: Mapping[str, float], slots: int, hours: float, load: float, fill_s: float = 1800.0
) -> list[WorkloadSpec]:
    """The workloads of one run, by arrival time, from ``seed`` alone (so the
    runs with vramguard off and on get the same ones).

    At the start the fleet is filled to ``load`` × ``slots`` pods in the
    proportions of ``mix``: Deployments, and Jobs already part-way through their
    work, created over the first ``fill_s`` seconds. Then Jobs of each kind
    arrive as a Poisson process at the rate that keeps their share of the
    slots busy (``mix[kind] × slots × load / mean work``) until ``hours``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
    out: list[WorkloadSpec] = []
    counts = dict.fromkeys(KINDS, 0)

    def add(kind: str, arrival: float, started: bool) -> WorkloadSpec:
        counts[kind] += 1
        w = _workload(kind, counts[kind], arrival, rng, started)
        out.append(w)
        return w

    for kind in KINDS:
        target = round(mix.get(kind, 0.0) * slots * load)
        placed = 0
        while placed < target:
            placed += add(kind, float(rng.uniform(0.0, fill_s)), started=True).replicas
    horizon = hours * 3600.0
    for kind, (lo, hi) in _WORK.items():
        rate = mix.get(kind, 0.0) * slots * load / ((lo + hi) / 2.0)  # jobs per second
        t = 0.0
        while rate > 0:
            t += float(rng.exponential(1.0 / rate))
            if t >= horizon:
                break
            add(kind, t, started=False)
    out.sort(key=lambda w: (w.arrival_s, w.name))
    return out
