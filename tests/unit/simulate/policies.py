"""Policies and a small fleet for the simulation's tests and the equivalence
suite (tests/unit/operator/test_incremental_equivalence.py)."""

from __future__ import annotations

from vramguard_sim.simulate.policyfile import DEFAULT_POLICY
from vramguard_sim.simulate.run import SimulationConfig

# The built-in policy without its device-pressure rule: implicit budgets that only annotate.
PRESSURE_LINE = "  devicePressure: {minFree: 5%, protectShares: true, action: Evict}\n"
assert PRESSURE_LINE in DEFAULT_POLICY
ANNOTATE_ONLY = DEFAULT_POLICY.replace(PRESSURE_LINE, "")
SMALL = SimulationConfig(nodes={"time-slicing": 1}, hours=1.0, seed=3, tick_s=20.0)

# Budgets that act: a fine-tune per-device limit with the whole ladder, fast; a
# leak guard on the inference servers; a total over the batch namespace.
ACTING = DEFAULT_POLICY + """\
---
apiVersion: vramguard.io/v1alpha1
kind: GPUMemoryBudget
metadata: {name: finetune, namespace: research}
spec:
  selector: {matchLabels: {app.kubernetes.io/component: training}}
  limits: {perDevice: {fraction: 0.25}}
  tolerance: {overshootPercent: 10, duration: 30s}
  enforcement:
    escalation:
    - {action: Annotate, after: 0s}
    - {action: Throttle, after: 2m, cpuLimit: 500m}
    - {action: Evict, after: 5m}
---
apiVersion: vramguard.io/v1alpha1
kind: GPUMemoryBudget
metadata: {name: leak-guard, namespace: serving}
spec:
  selector: {matchLabels: {app.kubernetes.io/component: inference}}
  limits: {perPod: {vram: 30Gi}}
  leakDetection: {enabled: true, minGrowthPerHour: 1Gi, minWindow: 20m, evictBefore: 30m}
  enforcement:
    escalation: [{action: Annotate, after: 0s}]
---
apiVersion: vramguard.io/v1alpha1
kind: GPUMemoryBudget
metadata: {name: batch-total, namespace: batch}
spec:
  selector: {}
  limits: {total: {vram: 40Gi}}
  enforcement:
    escalation:
    - {action: Annotate, after: 0s}
    - {action: Evict, after: 1m}
"""
# A Cap on the fine-tunes (the research namespace) instead of Throttle and Evict.
CAPPING = DEFAULT_POLICY + """\
---
apiVersion: vramguard.io/v1alpha1
kind: GPUMemoryBudget
metadata: {name: finetune, namespace: research}
spec:
  selector: {matchLabels: {app.kubernetes.io/component: training}}
  limits: {perDevice: {fraction: 0.25}}
  enforcement:
    escalation:
    - {action: Annotate, after: 0s}
    - {action: Cap, after: 1m}
"""
MIX = {"training": 0.1, "inference": 0.2, "leaking-inference": 0.2, "finetune": 0.3, "batch": 0.2}
