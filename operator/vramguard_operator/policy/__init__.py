"""Pure policy: merging ``GPUMemoryPolicy`` objects, shares of shared devices,
ceilings, implicit budgets for pods no budget selects, and the admission
checks (validation and mutation) behind the webhooks.

No kopf and no Kubernetes client; may use the engine's types.
"""
