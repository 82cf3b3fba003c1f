#!/usr/bin/env bash
# Real-GPU check of the vramguard agent's NVML backend, on a machine with an NVIDIA GPU.
#
# Installs the repo with its agent extra into a fresh venv (made with
# --system-site-packages, so that an installed torch / cupy / pycuda / numba stays
# visible), then runs hack/gpu_check.py: a child process holds a known amount of
# device memory while `vramguard-agent once --backend nvml` samples the GPU, and
# expected and measured figures are printed with PASS/FAIL checks.
#
# With --memory-limits (as root) it also sets, reads and clears a per-cgroup memory
# limit through NVML (driver r615+, cgroup v2, not MIG) and checks that an allocation
# above the hard limit fails inside the cgroup, or says why the host cannot.
#
# Usage: hack/gpu-check.sh [--mib 1024] [--device 0] [--holder auto|torch|cupy|pycuda|numba|ctypes]
#                          [--memory-limits [--limit-mib 2048] [--no-enforce-check]]
# Environment: VENV=DIR reuses (or creates) that venv; PYTHON=python3 picks the interpreter;
#              NO_INSTALL=1 skips pip and runs from the source tree (needs pydantic, kubernetes,
#              nvidia-ml-py, prometheus-client, PyYAML, numpy in that interpreter).
# Exit status: 0 pass, 1 a check failed, 2 no GPU / NVML / CUDA or setup failed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv || true

if [[ ${NO_INSTALL:-} == 1 ]]; then
  export PYTHONPATH="$repo/api:$repo/agent${PYTHONPATH:+:$PYTHONPATH}"
  exec "$python" "$repo/hack/gpu_check.py" "$@"
fi

venv=${VENV:-$(mktemp -d -t vramguard-gpu-check.XXXXXX)/venv}
if [[ ! -x $venv/bin/python ]]; then
  echo "gpu-check: creating $venv" >&2
  "$python" -m venv --system-site-packages "$venv"
fi
echo "gpu-check: installing $repo[agent] into $venv" >&2
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "$repo[agent]"; then
  echo "gpu-check: pip install failed (offline?); rerun with NO_INSTALL=1 and the dependencies installed" >&2
  exit 2
fi
exec "$venv/bin/python" "$repo/hack/gpu_check.py" "$@"
