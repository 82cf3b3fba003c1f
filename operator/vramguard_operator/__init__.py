"""The vramguard operator: kopf handlers, the pure policy engine, actions,
webhooks and the ``vramguard`` command."""
