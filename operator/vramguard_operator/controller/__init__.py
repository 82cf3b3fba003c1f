"""The side effects: informers and kopf handlers, the reconcile loop driving
the planner (``plan``), the actions (Events, evictions, resizes, rate limits),
policy status, webhooks, certificates, shards and metrics. The only code that
imports kopf or the Kubernetes client.
"""
