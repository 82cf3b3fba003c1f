"""The side effects: kopf handlers and indexes, the reconcile loop, the
actions (Events, evictions, resizes, rate limits), policy status, webhooks,
certificates and metrics. The only code that imports kopf or the Kubernetes
client.
"""
