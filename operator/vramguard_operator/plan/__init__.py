"""The planner: which pods and budget groups to evaluate, and when (pure).

Fed the changes the informers see (``changes``: pod, report, budget, policy,
namespace, node and DRA upserts and deletes) and the clock, it keeps what the
operator knows (``cache``: the entries of ``entries`` and
``allocation_entries``), marks what a change may affect, closes the marks over
budgets and devices (``closure``, ``coupling``, ``quiet``), arms timers
(``timers``) and returns the engine groups to evaluate (``incremental``).
``full_pass`` plans everything at once: the reference the planner must agree
with. ``status_notes`` and ``index_views`` are the loop's and the webhooks'
pure helpers over the same entries. No kopf, no Kubernetes client, no metrics:
``controller`` drives it and does the I/O.
"""
