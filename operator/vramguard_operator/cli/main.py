"""The ``vramguard`` command: ``operator``, ``analyze``, ``replay``, ``top``.

Each subcommand lives in its own module with ``add_arguments`` and ``run``;
those modules import kopf only inside ``run``, so that ``vramguard analyze``
and ``replay`` work without kopf or a cluster.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help); each module defines add_arguments(parser) and run(args) -> int
SUBCOMMANDS = {
    "operator": ("vramguard_operator.cli.run_operator", "run the operator (kopf) with its webhooks"),
    "analyze": ("vramguard_operator.cli.analyze", "say whether a VRAM log shows a leak"),
    "replay": ("vramguard_operator.cli.replay", "replay recorded usage against a budget offline"),
    "top": ("vramguard_operator.cli.top", "show pods, their usage and their budgets"),
}


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="vramguard", description="GPU memory budgets for Kubernetes: the operator and its tools."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``vramguard``; returns the process exit status."""
    args = build_parser().parse_args(argv)
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
