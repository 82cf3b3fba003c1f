"""Pure policy: merging ``GPUMemoryPolicy`` objects, shares of shared devices,
what DRA claims and GPU sharers granted pods (``grants``, ``dra``,
``sharers``), ceilings, implicit budgets for pods no budget selects or that
were granted memory, and the admission checks (validation and mutation)
behind the webhooks.

No kopf and no Kubernetes client; may use the engine's types.
"""
