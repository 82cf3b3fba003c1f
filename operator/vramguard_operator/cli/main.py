"""The ``vramguard`` command: ``operator``, ``top``, ``analyze``, ``replay``, ``simulate``, ``oom``.

A click group. ``operator`` and ``top`` are click commands whose options come
from one table each (``controller.settings`` and ``top``); ``analyze``,
``replay`` and ``simulate`` declare argparse arguments (``add_arguments(parser)`` and
``run(args)``) and are passed their command line as it is. Nothing here
imports kopf or the Kubernetes client: ``vramguard analyze``, ``replay`` and
``simulate`` work without either and without a cluster.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import click

from vramguard_api.cliargs import CONTEXT, OneLineParser, run_main
from vramguard_operator.cli.run_operator import operator_command
from vramguard_operator.cli.top.command import top_command

# subcommand -> (module, help); each module defines add_arguments(parser) and run(args) -> int
ARGPARSE_SUBCOMMANDS = {
    "analyze": ("vramguard_operator.cli.analyze", "say whether a VRAM log shows a leak"),
    "replay": ("vramguard_operator.cli.replay", "replay recorded usage against a budget offline"),
    "simulate": ("vramguard_operator.cli.simulate", "simulate a GPU fleet with vramguard off and on"),
    "oom": ("vramguard_operator.cli.oom", "list recent OOM kills on GPU nodes with their kind, verdict and blame"),
}


def argparse_command(name: str, module_name: str, help_text: str) -> click.Command:
    """A click command that hands its whole command line (``--help`` included)
    to the argparse parser of ``module_name``'s ``add_arguments`` and calls its
    ``run``; returns ``run``'s exit status."""

    @click.command(
        name,
        help=help_text,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                          "help_option_names": []},
    )
    @click.argument("argv", nargs=-1, type=click.UNPROCESSED)
    def command(argv: tuple[str, ...]) -> int:
        module = importlib.import_module(module_name)
        parser = OneLineParser(prog=f"vramguard {name}", description=help_text)
        module.add_arguments(parser)
        return int(module.run(parser.parse_args(list(argv))))

    return command


@click.group(name="vramguard", help="GPU memory budgets for Kubernetes: the operator and its tools.",
             context_settings=CONTEXT)
@click.version_option(package_name="vramguard", prog_name="vramguard", message="%(prog)s %(version)s")
def vramguard() -> None:
    """The command group (its subcommands do the work)."""


vramguard.add_command(operator_command)
vramguard.add_command(top_command)
for _name, (_module, _help) in ARGPARSE_SUBCOMMANDS.items():
    vramguard.add_command(argparse_command(_name, _module, _help))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vramguard``; returns the process exit status (2 with a
    one-line message on stderr for a bad flag, value or file: ``run_main``)."""
    return run_main("vramguard", lambda: vramguard.main(args=list(argv) if argv is not None else None,
                                                        prog_name="vramguard", standalone_mode=False))


if __name__ == "__main__":
    sys.exit(main())
