"""vramguard's shared API: pydantic models of the custom resources (the single
source of the CRD schemas), quantities and durations, condition constants and
the pure helpers that the operator and the agent must interpret the same way.

Imports neither kopf nor pynvml.
"""

GROUP = "vramguard.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The resources' plural names (the URL path segments of the API).
BUDGETS = "gpumemorybudgets"
POLICIES = "gpumemorypolicies"
REPORTS = "nodegpuusages"
