"""The ``vramguard`` command: ``operator``, ``top``, ``analyze``, ``replay``, ``simulate``, ``oom``.

A click group. ``operator`` and ``top`` are click commands whose options come
from one table each (``controller.settings`` and ``top``); ``analyze``,
``replay`` and ``simulate`` declare argparse arguments (``add_arguments(parser)`` and
``run(args)``) and are passed their command line as it is. Nothing here
imports kopf or the Kubernetes client: ``vramguard analyze``, ``replay`` and
``simulate`` work without either and without a cluster.

``simulate`` is not the product's: the fleet simulation ships in the
vramguard-sim distribution (``pip install 'vramguard[sim]'``), which registers
its module under the entry point group ``vramguard.commands``; the command is
found there when run, as the agent finds its simulated backends
(``vramguard_agent.backends``), and without it says what to install.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from functools import partial
from importlib.metadata import entry_points
from types import ModuleType

import click

from vramguard_api.cliargs import CONTEXT, OneLineParser, run_main
from vramguard_operator.cli.run_operator import operator_command
from vramguard_operator.cli.top.command import top_command

# subcommand -> (module, help); each module defines add_arguments(parser) and run(args) -> int
ARGPARSE_SUBCOMMANDS = {
    "analyze": ("vramguard_operator.cli.analyze", "say whether a VRAM log shows a leak"),
    "replay": ("vramguard_operator.cli.replay", "replay recorded usage against a budget offline"),
    "oom": ("vramguard_operator.cli.oom", "list recent OOM kills on GPU nodes with their kind, verdict and blame"),
}

# Subcommands other distributions provide: entry point group, name -> (help, install hint).
# Their modules have the same two functions as ARGPARSE_SUBCOMMANDS'.
COMMANDS_GROUP = "vramguard.commands"
PLUGIN_SUBCOMMANDS = {
    "simulate": (
        "simulate a GPU fleet with vramguard off and on",
        "the fleet simulation comes with pip install 'vramguard[sim]' (a checkout: pip install ./sim)",
    ),
}


class CommandNotInstalled(Exception):
    """No installed distribution registers the subcommand run."""


def plugin_module(name: str, hint: str) -> ModuleType:
    """The module registered as ``name`` in ``vramguard.commands``. Raises
    ``CommandNotInstalled`` (one line: the command, what to install) when none is."""
    for ep in entry_points(group=COMMANDS_GROUP, name=name):
        module = ep.load()
        if not isinstance(module, ModuleType):
            raise TypeError(f"entry point {COMMANDS_GROUP}:{name} ({ep.value}) is not a module")
        return module
    raise CommandNotInstalled(f"vramguard {name}: not installed; {hint}")


def argparse_command(name: str, load: Callable[[], ModuleType], help_text: str) -> click.Command:
    """A click command that hands its whole command line (``--help`` included)
    to the argparse parser of the ``add_arguments`` of the module ``load()``
    returns and calls its ``run``; returns ``run``'s exit status, or 2 with one
    line on stderr when ``load`` raises ``CommandNotInstalled``."""

    @click.command(
        name,
        help=help_text,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                          "help_option_names": []},
    )
    @click.argument("argv", nargs=-1, type=click.UNPROCESSED)
    def command(argv: tuple[str, ...]) -> int:
        try:
            module = load()
        except CommandNotInstalled as err:
            print(err, file=sys.stderr)
            return 2
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
    vramguard.add_command(argparse_command(_name, partial(importlib.import_module, _module), _help))
for _name, (_help, _hint) in PLUGIN_SUBCOMMANDS.items():
    vramguard.add_command(argparse_command(_name, partial(plugin_module, _name, _hint), _help))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vramguard``; returns the process exit status (2 with a
    one-line message on stderr for a bad flag, value or file: ``run_main``)."""
    return run_main("vramguard", lambda: vramguard.main(args=list(argv) if argv is not None else None,
                                                        prog_name="vramguard", standalone_mode=False))


if __name__ == "__main__":
    sys.exit(main())
