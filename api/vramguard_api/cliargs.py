"""argparse types for the Kubernetes units the commands take, shared by the
``vramguard`` and ``vramguard-agent`` commands so that a bad value is reported
the same way: the flag (and, where given, its environment variable) and the value."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .units import parse_duration, quantity_to_bytes


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
    # argparse converts a default taken from the environment with the same type:
    # the message must point at both places the value may have come from.
    return f"{flag} (or env {env})" if env else flag
