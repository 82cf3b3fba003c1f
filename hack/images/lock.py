#!/usr/bin/env python3
"""Write images/constraints.txt: the pinned versions both images install.

pip resolves the project with both image extras (``operator``, ``agent``) as if
nothing were installed (``pip install --dry-run --ignore-installed --report``,
pip's installation report, https://pip.pypa.io/en/stable/reference/installation-report/)
and every package it would install but the project itself is written as
``name==version``. The images install with ``-c images/constraints.txt``, so two
builds of one commit install the same versions; ``make lock`` refreshes it.

Usage: lock.py PIP OUT   (PIP: the pip command of a Python like the images' one)
Errors: pip's own failure exits with its status and message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEADER = """\
# Pinned versions of everything the images install (hack/images/lock.py).
# Refresh with `make lock`; resolved with Python {python} on {platform}.
"""


def resolve(pip: list[str], root: Path) -> tuple[dict[str, object], list[str]]:
    """pip's installation report for the project with both image extras, and its pins."""
    out = subprocess.run(
        [*pip, "install", "--quiet", "--dry-run", "--ignore-installed", "--report", "-", f"{root}[operator,agent]"],
        check=True, capture_output=True, text=True,
    ).stdout
    report = json.loads(out)
    pins = sorted(
        f"{item['metadata']['name'].lower()}=={item['metadata']['version']}"
        for item in report["install"]
        if item["metadata"]["name"].lower() != "vramguard"
    )
    return report["environment"], pins


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: lock.py PIP OUT", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[2]
    try:
        env, pins = resolve(argv[1].split(), root)
    except subprocess.CalledProcessError as e:
        print(f"lock: pip failed ({e.returncode}): {e.stderr.strip()[-500:]}", file=sys.stderr)
        return e.returncode
    text = HEADER.format(python=env["python_full_version"], platform=env["sys_platform"]) + "\n".join(pins) + "\n"
    Path(argv[2]).write_text(text)
    print(f"lock: {len(pins)} packages pinned in {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
