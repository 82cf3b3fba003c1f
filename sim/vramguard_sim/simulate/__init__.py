"""The fleet simulation: GPU nodes with driver memory semantics, a seeded
workload mix, and vramguard's real policy code and engine deciding.

Pure (no kopf, no Kubernetes client): it imports ``policy``, ``engine`` and
``vramguard_api`` only. ``run.simulate`` runs one configuration,
``run.compare`` the same seed with vramguard off and on; ``docs/simulation.md``
describes the model.
"""
