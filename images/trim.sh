#!/bin/sh
# Remove from a virtual environment what the images never run (run in the
# Dockerfiles' first stage): the installers, test suites, C headers, type stubs,
# and the kubernetes client's asyncio copy (kubernetes.aio: nothing imports it).
# Byte code stays: the root filesystem is read-only, so without it every start
# would compile the kubernetes client again. The client's generated API classes
# (kubernetes/client/api: 22 MB of source, mostly docstrings) keep only their
# byte code, compiled next to where the source was (Python imports such
# "sourceless" .pyc files); a traceback through them shows no source lines.
# The project's wheel holds both components; the other one's package and
# command go (the import contracts keep operator and agent apart), and so do
# the distributions this image's component never imports (UNUSED).
# Usage: trim.sh VENV OTHER_PACKAGE OTHER_COMMAND [UNUSED...]
set -eu
venv=$1 other_package=$2 other_command=$3
shift 3
site=$(echo "$venv"/lib/python3*/site-packages)
"$venv/bin/python" -m pip uninstall -q -y "$@" pip setuptools wheel 2>/dev/null || true
rm -rf "$site/$other_package" "$venv/bin/$other_command"
rm -f "$venv"/bin/pip* "$venv"/bin/activate* "$venv"/bin/Activate.ps1
rm -rf "$site/kubernetes/aio"
find "$site" -depth \( -type d \( -name tests -o -name testing -o -name include \) -path '*/numpy/*' \) -exec rm -rf {} +
find "$site" -depth -type d \( -name tests -o -name test \) -not -path '*/numpy/*' -exec rm -rf {} +
find "$site" \( -name '*.pyi' -o -name '*.h' -o -name '*.c' -o -name '*.pxd' -o -name 'py.typed' \) -delete
# numpy's Fortran wrapper generator and its C/Cython interfaces are for building, not running.
rm -rf "$site"/numpy/f2py "$site"/numpy/_pyinstaller "$site"/numpy/random/_examples
api="$site/kubernetes/client/api"
"$venv/bin/python" -m compileall -q -b -f "$api"
find "$api" -name '*.py' -delete
rm -rf "$api/__pycache__"
