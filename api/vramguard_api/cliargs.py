"""Command-line settings of the ``vramguard`` and ``vramguard-agent`` commands:
one way to read a flag and its environment variable, and one parser per kind
of value, so that both commands take and refuse values alike.

The commands are built with click (docs/operator.md, "Configuration"): each
setting is an ``EnvOption`` read from its flag, else from its environment
variable, else from its default, and its value (wherever it came from) is
converted by one of the parameter types here: ``Duration`` (Go syntax, to
seconds), ``Quantity`` (Kubernetes quantity, to bytes), ``WholeNumber``,
``Number``, ``LogLevel``. A bad value stops the command with exit status 2 and
a message naming the flag, its variable and the value, for example
``Invalid value for '--metrics-port' (env VRAMGUARD_METRICS_PORT): want a
whole number from 0 to 65535, got 'http'``.

``duration_arg`` and ``quantity_arg`` adapt the same parsers to argparse for
the subcommands that still declare argparse arguments (``vramguard analyze``
and ``replay``).

Both commands run through ``run_main``, so that every error a user can cause
is one line on stderr naming the flag, file or field, the value and what is
wanted, never a traceback (docs/cli.md): click's and argparse's usage errors
are cut to that line (``OneLineParser``), and ``-h`` is a help option
everywhere (``CONTEXT``). A quantity of bytes written as a bare number
(``--limit 80``: 80 bytes) is refused with a hint to write a unit.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from .units import format_duration, parse_duration, quantity_to_bytes

log = logging.getLogger(__name__)

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
"""click context settings for every command and group: ``-h`` as well as ``--help``."""

LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


@dataclass(frozen=True, slots=True)
class Environment:
    """The environment variables a command reads, when they are not the
    process's (pass it as the context's ``obj``: tests, and settings read
    from a given mapping)."""

    variables: Mapping[str, str]


class EnvOption(click.Option):
    """A click option read from its flag, else from its environment variable
    (``envvar``), else from its default; the flag wins.

    Unlike click's own options, a variable set to the empty string is a value
    (``VRAMGUARD_LIVENESS=''`` disables the endpoint, as ``--liveness ''``
    does), not an unset variable. The variables come from the ``Environment``
    in the context, else from ``os.environ``. Errors name the flag and the
    variable. ``empty_is_unset``: an empty variable counts as unset (for
    settings whose absence means "off", such as a port)."""

    def __init__(self, *args: Any, empty_is_unset: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.empty_is_unset = empty_is_unset

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        """The raw value of the option's variable, ``""`` included; None when unset."""
        if not isinstance(self.envvar, str):
            return None
        source = ctx.find_object(Environment)
        variables = source.variables if source is not None else os.environ
        value = variables.get(self.envvar)
        return None if value == "" and self.empty_is_unset else value

    def get_error_hint(self, ctx: click.Context | None) -> str:
        """``'--flag' (env VARIABLE)``."""
        hint = " / ".join(f"'{o}'" for o in self.opts)
        return f"{hint} (env {self.envvar})" if isinstance(self.envvar, str) else hint


def env_option(flag: str | tuple[str, ...], env: str | None, default: Any = None, **kwargs: Any) -> EnvOption:
    """An ``EnvOption`` for ``flag`` (``"--x"``, or ``("-n", "--x")``) with
    variable ``env`` (None: a flag only) and ``default`` (converted by the
    option's type like any other value)."""
    decls = [flag] if isinstance(flag, str) else list(flag)
    return EnvOption(decls, envvar=env, default=default, **kwargs)


class Duration(click.ParamType):
    """A Go-style duration (``30s``, ``1h30m``, Go's ``time.ParseDuration``
    grammar without a sign) converted to seconds (float)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Seconds of ``value``; a float passes through (an already converted default)."""
        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value), field="")
        except ValueError as err:  # units' message names the value and what is wanted
            self.fail(str(err).removeprefix(": "), param, ctx)


class Quantity(click.ParamType):
    """A non-negative Kubernetes quantity (``64Mi``, ``1G``) converted to bytes
    (int; fractions of a byte round up, as apimachinery does)."""

    name = "quantity"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Bytes of ``value``; an int passes through (an already converted default)."""
        if isinstance(value, int):
            return value
        try:
            return bytes_quantity(str(value), field="")
        except ValueError as err:
            self.fail(str(err).removeprefix(": "), param, ctx)


class WholeNumber(click.ParamType):
    """A whole number (decimal digits) in [``low``, ``high``] (``high`` None: no
    upper bound)."""

    name = "integer"

    def __init__(self, low: int = 0, high: int | None = None) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The number ``value`` stands for."""
        if isinstance(value, int) and not isinstance(value, bool):
            number: int | None = value
        else:
            try:
                number = int(str(value), 10)
            except ValueError:
                number = None
        if number is None or number < self.low or (self.high is not None and number > self.high):
            span = f">= {self.low}" if self.high is None else f"from {self.low} to {self.high}"
            self.fail(f"want a whole number {span}, got {value!r}", param, ctx)
        return number


class Number(click.ParamType):
    """A finite real number for which ``ok`` holds; ``want`` says which in
    the error (``"a number in [0, 1)"``)."""

    name = "number"

    def __init__(self, ok: Callable[[float], bool], want: str) -> None:
        self.ok, self.want = ok, want

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """The number ``value`` stands for."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and self.ok(number)):
            self.fail(f"want {self.want}, got {value!r}", param, ctx)
        return number


class LogLevel(click.ParamType):
    """A logging level name (``LOG_LEVELS``), any case; returned upper-case."""

    name = "level"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """The level's upper-case name."""
        level = str(value).strip().upper()
        if level not in LOG_LEVELS:
            self.fail(f"want one of {', '.join(LOG_LEVELS)}, got {value!r}", param, ctx)
        return level


def duration_arg(
    flag: str, env: str | None = None, *, legacy_unit_s: float | None = None, positive: bool = False,
    maximum_s: float | None = None,
) -> Callable[[str], float]:
    """An argparse ``type`` turning a Go-style duration (``30s``) into seconds;
    a bad value raises ``argparse.ArgumentTypeError`` naming ``flag`` (and
    ``env``, the variable its default comes from, when given).

    ``legacy_unit_s``: a flag that took a bare number (of seconds, 1.0, or hours,
    3600.0) keeps taking it for one release, with a deprecation line on stderr
    naming the Go duration to write. ``positive``: 0 is refused; ``maximum_s``: the
    largest value taken."""

    def _bounded(seconds: float, value: str) -> float:
        if positive and seconds <= 0:
            raise argparse.ArgumentTypeError(f"{value!r}: want a duration above 0s")
        if maximum_s is not None and seconds > maximum_s:
            raise argparse.ArgumentTypeError(
                f"{value!r}: want at most {format_duration(round(maximum_s * 1e9))}")
        return seconds

    def parse(value: str) -> float:
        if legacy_unit_s is not None and _BARE_NUMBER.fullmatch(value):
            seconds = float(value) * legacy_unit_s
            print(f"warning: {flag} {value.strip()}: a bare number is deprecated and will be refused in the next "
                  f"release; write {format_duration(round(seconds * 1e9))}", file=sys.stderr)
            return _bounded(seconds, value)
        try:
            return _bounded(parse_duration(value, field=_name(flag, env)), value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix(f"{flag}: ")) from None  # argparse names it

    return parse


def quantity_arg(flag: str, env: str | None = None) -> Callable[[str], int]:
    """An argparse ``type`` turning a Kubernetes quantity (``512Mi``) into bytes;
    a bad value raises ``argparse.ArgumentTypeError`` naming ``flag`` (and
    ``env`` when given)."""

    def parse(value: str) -> int:
        try:
            return bytes_quantity(value, field=_name(flag, env))
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix(f"{flag}: ")) from None  # argparse names it

    return parse


def _name(flag: str, env: str | None) -> str:
    return f"{flag} (or env {env})" if env else flag


_BARE_NUMBER = re.compile(r"\s*[0-9]+(\.[0-9]+)?\s*")


def bytes_quantity(value: str, field: str) -> int:
    """A quantity of bytes from the command line (``quantity_to_bytes``), refusing a bare
    number other than 0, which would mean bytes and is almost always a forgotten unit:
    ``--limit 80`` -> ``ValueError("--limit: 80 has no unit (80 bytes); write 80Gi or 80G")``."""
    if _BARE_NUMBER.fullmatch(value) and float(value) != 0:
        n = value.strip()
        raise ValueError(f"{field}: {n} has no unit ({n} bytes); write {n}Gi or {n}G, or {n}Mi")
    return quantity_to_bytes(value, field)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (``PROG: MESSAGE (see PROG -h)``) and exit status 2,
    instead of the usage block and the message."""

    def error(self, message: str) -> NoReturn:
        """Print the one line and exit 2."""
        print(f"{self.prog}: {message} (see {self.prog} -h)", file=sys.stderr)
        raise SystemExit(2)


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined with "; " (a message may quote a multi-line error)."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def run_main(prog: str, call: Callable[[], Any]) -> int:
    """Run a command's ``call`` and return its exit status, with every error on one line:
    a usage error (status 2) and any other click error as ``PROG: message``; ``ValueError``,
    ``KeyError`` and ``OSError`` (bad input, a missing file: status 2) as ``PROG: message``;
    Ctrl-C as status 130; anything else as ``PROG: internal error: ...`` (status 1), its
    traceback only in the log at DEBUG."""
    try:
        return int(call() or 0)
    except click.UsageError as err:
        where = err.ctx.command_path if err.ctx is not None else prog
        print(f"{prog}: {one_line(err.format_message())} (see {where} -h)", file=sys.stderr)
        return err.exit_code
    except click.ClickException as err:
        print(f"{prog}: {one_line(err.format_message())}", file=sys.stderr)
        return err.exit_code
    except (click.Abort, KeyboardInterrupt):
        return 130
    except SystemExit as err:  # argparse's -h and OneLineParser's errors
        return err.code if isinstance(err.code, int) else 0
    except KeyError as err:
        print(f"{prog}: {one_line(str(err.args[0] if err.args else err))}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as err:
        print(f"{prog}: {one_line(str(err))}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - the last guard: a bug is still one line for the user
        log.debug("internal error", exc_info=True)
        print(f"{prog}: internal error: {type(err).__name__}: {one_line(str(err))} (a bug: please report it)",
              file=sys.stderr)
        return 1
