"""The vramguard node agent: NVML and simulated GPU backends, cgroup
attribution, RAM accounting, sampler, reporter, metrics and the
``vramguard-agent`` command."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vramguard")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
