"""The vramguard node agent: NVML and simulated GPU backends, cgroup
attribution, RAM accounting, sampler, reporter, metrics and the
``vramguard-agent`` command."""
