"""Pure decisions: ``evaluate(EngineInput) -> EngineOutput`` and what it is made of.

No kopf, no Kubernetes client, no clock and no I/O: budgets, the effective
policy, node reports, pod facts and ``now`` go in; decisions, pod annotation
patches and budget statuses come out. Imports only ``vramguard_api`` (the
import contract in ``make verify`` checks it).
"""
