"""``vramguard operator``: run the operator (kopf, standalone) with its metrics
server and, with ``--webhook-port``, its admission webhooks.

Every setting has a flag and a ``VRAMGUARD_*`` environment variable (the flag
wins); the table is ``controller.settings.parameters``. Durations are Go-style
(``5s``, ``1m``). kopf is imported only when the command runs
(``controller.runner``), so that ``vramguard analyze`` needs neither kopf nor
a cluster.
"""

from __future__ import annotations

from typing import Any

import click

from vramguard_operator.controller.settings import from_params, parameters

HELP = "run the operator (kopf) with its webhooks"


def _run(**params: Any) -> int:
    """Run the operator with the settings read from the command line and the
    environment; returns its exit status."""
    settings = from_params(params)
    from vramguard_operator.controller import runner

    return runner.run(settings)


operator_command = click.Command("operator", params=parameters(), callback=_run, help=HELP, short_help=HELP)
