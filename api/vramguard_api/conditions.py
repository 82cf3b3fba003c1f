"""Condition types and reasons, as constants shared by the operator, the agent and tests."""

# Condition types on GPUMemoryBudget.status.conditions
READY = "Ready"
VIOLATING = "Violating"
DATA_STALE = "DataStale"
WARNING = "Warning"

# Condition types on NodeGPUUsage.status.conditions
AGENT_HEALTHY = "AgentHealthy"
PROCESSES_MISSING = "ProcessesMissing"

# Reasons (CamelCase, as metav1.Condition requires)
REASON_VALID = "Valid"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_NO_VIOLATIONS = "NoViolations"
REASON_LIMIT_EXCEEDED = "LimitExceeded"
REASON_LEAK_DETECTED = "LeakDetected"
REASON_DEVICE_PRESSURE = "DevicePressure"
REASON_REPORTS_FRESH = "ReportsFresh"
REASON_REPORT_STALE = "ReportStale"
REASON_REPORT_MISSING = "ReportMissing"
REASON_REPORT_INVALID = "ReportInvalid"
REASON_EVALUATION_FAILED = "EvaluationFailed"
REASON_EVALUATION_TIMEOUT = "EvaluationTimeout"
REASON_ABOVE_WARNING_THRESHOLD = "AboveWarningThreshold"
REASON_BELOW_WARNING_THRESHOLD = "BelowWarningThreshold"
REASON_SAMPLING = "Sampling"
REASON_NVML_UNAVAILABLE = "NVMLUnavailable"
REASON_DEVICE_ERRORS = "DeviceErrors"
REASON_PROCESS_SUM_BELOW_USED = "ProcessSumBelowUsed"
REASON_PROCESSES_COMPLETE = "ProcessesComplete"
