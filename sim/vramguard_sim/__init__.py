"""vramguard's simulators, apart from the product (docs/layout.md, "The laboratory").

The distribution vramguard-sim (``sim/pyproject.toml``) ships them; the product
(vramguard) never imports this package (an import-linter contract, checked by
``make verify``). It holds the agent's simulated GPU backends, registered as the
entry points ``sim`` and ``simdriver`` of ``vramguard.agent_backends``
(``agent_backends``): a fake ``pynvml`` that mimics nvidia-ml-py (``fakenvml``),
scenarios (``scenario``), simulated devices, cgroups and host
(``simgpu``, ``simcgroups``, ``simbackend``), the real node's simulated driver
and its NVML client (``simdriver``, ``drivernvml``), and the ``vramguard-sim``
command (``cli``).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vramguard-sim")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
