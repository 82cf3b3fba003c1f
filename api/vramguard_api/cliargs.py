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
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from .units import parse_duration, quantity_to_bytes

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
            return quantity_to_bytes(str(value), field="")
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


def duration_arg(flag: str, env: str | None = None) -> Callable[[str], float]:
    """An argparse ``type`` turning a Go-style duration (``30s``) into seconds;
    a bad value raises ``argparse.ArgumentTypeError`` naming ``flag`` (and
    ``env``, the variable its default comes from, when given)."""

    def parse(value: str) -> float:
        try:
            return parse_duration(value, field=_name(flag, env))
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def quantity_arg(flag: str, env: str | None = None) -> Callable[[str], int]:
    """An argparse ``type`` turning a Kubernetes quantity (``512Mi``) into bytes;
    a bad value raises ``argparse.ArgumentTypeError`` naming ``flag`` (and
    ``env`` when given)."""

    def parse(value: str) -> int:
        try:
            return quantity_to_bytes(value, field=_name(flag, env))
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def _name(flag: str, env: str | None) -> str:
    return f"{flag} (or env {env})" if env else flag
