"""``vramguard operator``: run the operator (kopf, standalone) with its metrics server.

Every setting has a flag and a ``VRAMGUARD_*`` environment variable (the flag
wins). Durations are Go-style (``5s``, ``1m``). kopf itself is imported only
when the command runs, so that ``vramguard analyze`` needs neither kopf nor a
cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

from vramguard_api.cliargs import duration_arg as _duration
from vramguard_api.policy import EvictionRateLimit
from vramguard_api.units import parse_duration
from vramguard_operator.controller.reconcile import OperatorConfig

log = logging.getLogger("vramguard.operator")

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"


def _whole(flag: str, env: str, low: int = 0, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]. The error names the flag
    and its variable (defaults come from the environment as strings, which
    argparse converts with this too), never a traceback."""

    def parse(value: str) -> int:
        try:
            number: int | None = int(value, 10)
        except ValueError:
            number = None
        if number is None or number < low or (high is not None and number > high):
            span = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"want a whole number {span} ({flag} or env {env}), got {value!r}")
        return number

    return parse


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``vramguard operator`` flags."""
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="PATTERN",
        help="watch these namespaces only (repeatable; kopf glob patterns such as 'ml-*')",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        default=True,
        help="run without kopf peering (always on; one replica only)",
    )
    p.add_argument(
        "--liveness",
        default=_env("VRAMGUARD_LIVENESS", DEFAULT_LIVENESS),
        help=f"kopf's liveness endpoint; '' disables (env VRAMGUARD_LIVENESS; {DEFAULT_LIVENESS})",
    )
    p.add_argument(
        "--metrics-port",
        type=_whole("--metrics-port", "VRAMGUARD_METRICS_PORT", 0, 65535),
        default=_env("VRAMGUARD_METRICS_PORT", "9090"),
        help="Prometheus /metrics port; 0 disables (env VRAMGUARD_METRICS_PORT; default 9090)",
    )
    p.add_argument(
        "--metrics-address",
        default=_env("VRAMGUARD_METRICS_ADDRESS", "0.0.0.0"),
        help="address the metrics server binds (env VRAMGUARD_METRICS_ADDRESS; default 0.0.0.0)",
    )
    for flag, env, default, text in (
        (
            "--evaluation-period",
            "VRAMGUARD_EVALUATION_PERIOD",
            "5s",
            "longest time between evaluations; escalation steps fire at most this late",
        ),
        (
            "--debounce",
            "VRAMGUARD_DEBOUNCE",
            "20ms",
            "wait after a change so that a burst of events makes one evaluation",
        ),
        (
            "--freshness",
            "VRAMGUARD_FRESHNESS",
            "60s",
            "node reports older than this are stale: no action on their pods",
        ),
        (
            "--eviction-retry",
            "VRAMGUARD_EVICTION_RETRY",
            "30s",
            "wait before retrying an eviction a PodDisruptionBudget refused",
        ),
        ("--request-timeout", "VRAMGUARD_REQUEST_TIMEOUT", "10s", "timeout of each API call the actions make"),
        (
            "--watch-timeout",
            "VRAMGUARD_WATCH_TIMEOUT",
            "5m",
            "server-side timeout of kopf's watches (they are re-established)",
        ),
    ):
        p.add_argument(
            flag,
            type=_duration(flag, env),
            default=_env(env, default),
            help=f"{text} (env {env}; default {default})",
        )
    p.add_argument(
        "--eviction-rate-per-minute",
        type=_whole("--eviction-rate-per-minute", "VRAMGUARD_EVICTION_RATE_PER_MINUTE"),
        default=_env("VRAMGUARD_EVICTION_RATE_PER_MINUTE", "2"),
        help="evictions per minute where no GPUMemoryPolicy selects the namespace "
        "(env VRAMGUARD_EVICTION_RATE_PER_MINUTE; default 2)",
    )
    p.add_argument(
        "--eviction-burst",
        type=_whole("--eviction-burst", "VRAMGUARD_EVICTION_BURST"),
        default=_env("VRAMGUARD_EVICTION_BURST", "2"),
        help="eviction burst where no GPUMemoryPolicy selects the namespace (env VRAMGUARD_EVICTION_BURST; default 2)",
    )
    p.add_argument(
        "--webhook-port",
        type=int,
        default=None,
        help="serve the admission webhooks on this HTTPS port (off when unset; "
        "VRAMGUARD_WEBHOOK_* set the rest, see docs/policy.md)",
    )
    p.add_argument(
        "--webhook-tls-dir",
        default=None,
        help="directory of the webhooks' tls.crt/tls.key (default /tmp/vramguard-webhook-tls)",
    )
    level = p.add_mutually_exclusive_group()
    level.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    level.add_argument("-d", "--debug", action="store_true", help="DEBUG, with asyncio's logs")
    level.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")


def _seconds(value: float | str, flag: str) -> float:
    # Defaults taken from the environment arrive as strings.
    return value if isinstance(value, float) else parse_duration(str(value), field=flag)


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    """The operator's settings from parsed flags. Raises ``ValueError`` naming
    the flag on a bad value."""
    if args.eviction_rate_per_minute < 0 or args.eviction_burst < 1:
        raise ValueError(
            f"--eviction-rate-per-minute {args.eviction_rate_per_minute} must be >= 0 and "
            f"--eviction-burst {args.eviction_burst} >= 1"
        )
    return OperatorConfig(
        evaluation_period=_seconds(args.evaluation_period, "--evaluation-period"),
        debounce=_seconds(args.debounce, "--debounce"),
        freshness=_seconds(args.freshness, "--freshness"),
        eviction_retry=_seconds(args.eviction_retry, "--eviction-retry"),
        default_rate_limit=EvictionRateLimit(perMinute=args.eviction_rate_per_minute, burst=args.eviction_burst),
        request_timeout=_seconds(args.request_timeout, "--request-timeout"),
    )


def run(args: argparse.Namespace) -> int:
    """Run the operator until SIGINT/SIGTERM; returns the exit status."""
    import kopf
    from prometheus_client import start_http_server

    # Importing registers the handlers with kopf's default registry.
    from vramguard_operator.controller import handlers, policy_handlers  # noqa: F401

    try:
        config = config_from_args(args)
    except ValueError as err:
        print(f"vramguard operator: {err}")
        return 2
    kopf.configure(debug=args.debug, verbose=args.verbose, quiet=args.quiet)
    if not (args.verbose or args.debug):
        # At INFO, kopf logs every event handler's success (one line per pod event)
        # and every liveness probe with its HTTP access line.
        for name in ("kopf.objects", "kopf.activities.probe", "aiohttp.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
    webhook = None
    if args.webhook_port is not None:
        from vramguard_operator.controller import webhooks

        # Flags for what the chart sets; VRAMGUARD_WEBHOOK_* for the rest (address, host, managed).
        env = {**os.environ, "VRAMGUARD_WEBHOOK_PORT": str(args.webhook_port)}
        if args.webhook_tls_dir:
            env["VRAMGUARD_WEBHOOK_TLS_DIR"] = args.webhook_tls_dir
        try:
            webhook = webhooks.WebhookConfig.from_env(env)
        except ValueError as err:
            print(f"vramguard operator: --webhook-port: {err}")
            return 2
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_address)
        log.info("metrics on %s:%d/metrics", args.metrics_address, args.metrics_port)
    memo = kopf.Memo(
        config=config,
        watch_timeout=_seconds(args.watch_timeout, "--watch-timeout"),
        metrics=handlers.process_metrics(),
        webhook=webhook,
    )
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        memo=memo,
    )
    return 0
