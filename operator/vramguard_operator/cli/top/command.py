"""The ``vramguard top`` command: its flags (``TopSettings``), the reads
(through ``controller.cluster_reads``) and the refresh loop."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

import click

from vramguard_api.cliargs import Duration, one_line
from vramguard_operator.cli.top.devices import DeviceRow, build_devices
from vramguard_operator.cli.top.model import DEFAULT_FRESHNESS_S, Row, Snapshot
from vramguard_operator.cli.top.render import devices_json, render, rows_json
from vramguard_operator.cli.top.rows import build_rows
from vramguard_operator.cli.top.selection import parse_sort_by, pod_matcher, select_rows, sort_rows
from vramguard_operator.controller import cluster_reads

HELP = "show pods, their usage and their budgets"


@dataclass(frozen=True, slots=True)
class TopSettings:
    """What ``vramguard top`` is told: ``namespace`` (None: the kubeconfig
    context's) or ``all_namespaces``; ``watch`` (refresh every ``interval``
    seconds); ``output`` (``table``, ``wide``, ``json``); ``freshness``
    (seconds: older node reports are marked stale); the kubeconfig file and
    context (None: the defaults)."""

    namespace: str | None = None
    all_namespaces: bool = False
    watch: bool = False
    interval: float = 2.0
    output: str = "table"
    freshness: float = DEFAULT_FRESHNESS_S
    kubeconfig: str | None = None
    context: str | None = None
    selector: str | None = None
    sort_by: tuple[str, ...] = ()
    color: str = "auto"


class SortBy(click.ParamType):
    """``--sort-by``'s value: column names (``selection.parse_sort_by``)."""

    name = "columns"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        """The column names, checked."""
        if isinstance(value, tuple):
            return value
        try:
            return parse_sort_by(str(value), field="--sort-by")
        except ValueError as err:
            self.fail(str(err).removeprefix("--sort-by: "), param, ctx)  # click names the flag


class Selector(click.ParamType):
    """``-l``'s value: a label selector in kubectl's syntax, checked here so a bad
    one stops the command before it reads the cluster."""

    name = "selector"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """The selector text, unchanged once it parses."""
        try:
            pod_matcher(str(value))
        except ValueError as err:
            self.fail(str(err).removeprefix("--selector: "), param, ctx)  # click names the flag
        return str(value)


def use_color(choice: str, is_terminal: bool, environ: Mapping[str, str]) -> bool:
    """Whether to colour the states: ``always``, ``never``, or with ``auto``
    only on a terminal and while ``NO_COLOR`` is unset or empty (no-color.org:
    the flag, being the user's explicit choice, overrides the variable)."""
    if choice != "auto":
        return choice == "always"
    return is_terminal and not environ.get("NO_COLOR")


def parameters() -> list[click.Parameter]:
    """The options of ``vramguard top`` (flags only: no variables)."""
    return [
        click.Option(["-n", "--namespace"], help="namespace (default: the kubeconfig context's)"),
        click.Option(["-A", "--all-namespaces"], is_flag=True, help="pods of every namespace"),
        click.Option(["-w", "--watch"], is_flag=True, help="refresh until interrupted"),
        click.Option(["--interval"], default="2s", type=Duration(), help="refresh interval with --watch (default 2s)"),
        click.Option(["-o", "--output"], type=click.Choice(["table", "wide", "json"]), default="table",
                     help="output format"),
        click.Option(["--freshness"], default="60s", type=Duration(),
                     help="node reports older than this are marked stale (default 60s, the operator's default)"),
        click.Option(["--kubeconfig"], default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)"),
        click.Option(["--context"], default=None, help="kubeconfig context"),
        click.Option(["-l", "--selector"], default=None, type=Selector(),
                     help="label selector over pods, as kubectl's (-l app=train,tier!=batch,'team in (a,b)')"),
        click.Option(["--sort-by"], default=None, type=SortBy(),
                     help="order by these columns, comma-separated: namespace, pod, node, vram, ram, limit, source, "
                          "use, trend, state, diagnosis; a leading - reverses (default: state, then use)"),
        click.Option(["--color"], type=click.Choice(["auto", "always", "never"]), default="auto",
                     help="colour the states: auto (on a terminal, unless NO_COLOR is set), always, never"),
    ]


def from_params(params: Mapping[str, Any]) -> TopSettings:
    """``TopSettings`` from the values click read; raises ``click.UsageError``
    when ``-n`` and ``-A`` are both given."""
    if params["namespace"] is not None and params["all_namespaces"]:
        raise click.UsageError("--namespace and --all-namespaces cannot be used together")
    values = {f.name: params[f.name] for f in fields(TopSettings)}
    values["sort_by"] = values["sort_by"] or ()  # None: the default order
    return TopSettings(**values)


def parse_settings(argv: Sequence[str]) -> TopSettings:
    """The settings ``vramguard top ARGV`` would run with; raises
    ``click.UsageError`` naming a bad flag and value."""
    command = click.Command("top", params=parameters())
    with command.make_context("vramguard top", list(argv)) as ctx:
        return from_params(ctx.params)


def fetch(api: Any, namespace: str | None, freshness_s: float = DEFAULT_FRESHNESS_S) -> Snapshot:
    """Read a ``Snapshot`` through ``api`` (a kubernetes ``ApiClient``):
    ``namespace`` None reads every namespace. Raises as
    ``cluster_reads.read_cluster`` does."""
    read = cluster_reads.read_cluster(api, namespace)
    return Snapshot(read.pods, read.budgets, read.policies, read.reports, read.namespace_labels,
                    datetime.now(UTC), freshness_s, read.notes)


def tables(snap: Snapshot, settings: TopSettings) -> tuple[list[Row], list[str], list[DeviceRow]]:
    """What one refresh shows (pure): the rows of the pods ``-l`` selects in
    ``--sort-by``'s order, the notes, and the device rows. ``-l`` narrows the pod
    table only: every pod still counts toward a budget's totals and a device's
    free memory, so the figures are the operator's whatever is shown."""
    rows, notes = build_rows(snap)
    devices = build_devices(snap, rows)
    shown = sort_rows(select_rows(rows, snap.pods, pod_matcher(settings.selector)), settings.sort_by)
    return shown, notes, devices


def show(api: Any, settings: TopSettings, namespace: str | None, color: bool = False) -> str:
    """One refresh of the output as text (``color``: the states in ANSI colours)."""
    snap = fetch(api, namespace, settings.freshness)
    rows, notes, devices = tables(snap, settings)
    if settings.output == "json":
        body = {"rows": rows_json(rows), "devices": devices_json(devices), "notes": list(notes)}
        return json.dumps(body, indent=2, default=str)
    return render(rows, notes, all_namespaces=namespace is None, wide=settings.output == "wide", devices=devices,
                  color=color)


def run(settings: TopSettings) -> int:
    """Print the table once, or refresh it every ``interval`` with ``watch``."""
    try:
        api = cluster_reads.api_client(settings.kubeconfig, settings.context)
    except Exception as err:  # noqa: BLE001 - ConfigException, a missing or malformed file
        print(f"vramguard top: cannot load a Kubernetes configuration: {err}", file=sys.stderr)
        return 1
    namespace = None if settings.all_namespaces else (
        settings.namespace or cluster_reads.current_namespace(settings.kubeconfig, settings.context))
    try:
        return _loop(api, settings, namespace)
    except KeyboardInterrupt:
        return 0


def _loop(api: Any, settings: TopSettings, namespace: str | None) -> int:
    tty = sys.stdout.isatty()
    color = use_color(settings.color, tty, os.environ)
    while True:
        try:
            text = show(api, settings, namespace, color)
        except LookupError as err:
            print(f"vramguard top: {err}", file=sys.stderr)
            return 1
        except cluster_reads.API_ERRORS as err:
            # urllib3's MaxRetryError repeats the whole request; its reason is the part a person needs
            why = one_line(str(getattr(err, "reason", None) or err))
            print(f"vramguard top: cannot read the cluster at {api.configuration.host}: {why}", file=sys.stderr)
            if not settings.watch:
                return 1
            text = ""
        if not settings.watch:
            print(text)
            return 0
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        head = "\x1b[H\x1b[2J" if tty else ""
        print(f"{head}vramguard top {'-A' if namespace is None else '-n ' + namespace}   {stamp}\n{text}\n",
              flush=True)
        time.sleep(settings.interval)


def _run(**params: Any) -> int:
    return run(from_params(params))


top_command = click.Command("top", params=parameters(), callback=_run, help=HELP, short_help=HELP)
