"""The operator's settings: every flag of ``vramguard operator`` with its
environment variable, default and help, in one table (``parameters``), read by
click into ``OperatorSettings``.

Both ways to start the operator read the same table: ``vramguard operator``
(each setting from its flag, else its ``VRAMGUARD_*`` variable, else its
default) and ``kopf run -m vramguard_operator.controller.handlers``
(``settings_from_env``: the variables, else the defaults). A bad value is
refused with a message naming the flag, the variable and the value
(``vramguard_api.cliargs``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from vramguard_api.cliargs import Duration, Environment, WholeNumber, env_option
from vramguard_api.policy import EvictionRateLimit
from vramguard_operator.engine.types import EngineConfig
from vramguard_operator.policy.dra import DEFAULT_MEMORY_CAPACITY, DEFAULT_UUID_ATTRIBUTE, DRAConfig

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
DEFAULT_WEBHOOK_TLS_DIR = "/tmp/vramguard-webhook-tls"

# (flag, variable, default, help) of the duration settings, in seconds once read
_DURATIONS = (
    ("--evaluation-period", "VRAMGUARD_EVALUATION_PERIOD", "5s",
     "longest time between evaluations; escalation steps fire at most this late"),
    ("--debounce", "VRAMGUARD_DEBOUNCE", "20ms", "wait after a change so that a burst of events makes one evaluation"),
    ("--freshness", "VRAMGUARD_FRESHNESS", "60s", "node reports older than this are stale: no action on their pods"),
    ("--eviction-retry", "VRAMGUARD_EVICTION_RETRY", "30s",
     "wait before retrying an eviction a PodDisruptionBudget refused"),
    ("--request-timeout", "VRAMGUARD_REQUEST_TIMEOUT", "10s", "timeout of each API call the actions make"),
    ("--watch-timeout", "VRAMGUARD_WATCH_TIMEOUT", "5m",
     "server-side timeout of the watches (they are re-established from the last version seen)"),
    ("--evaluation-timeout", "VRAMGUARD_EVALUATION_TIMEOUT", "30s",
     "longest time one budget's evaluation may take; one that takes longer is held and reported"),
    ("--status-refresh", "VRAMGUARD_STATUS_REFRESH", "30s",
     "longest a budget status's usage figures wait to be written (conditions and violations: at once)"),
    ("--lease-duration", "VRAMGUARD_LEASE_DURATION", "30s",
     "with --shards: an unrenewed shard Lease is taken over after this (at least twice --request-timeout)"),
)
MIN_STATE_KEY_BYTES = 16

# --log-format: kopf.LogFormat FULL ("text") or JSON, named as Kubernetes components name theirs.
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """Settings of the reconcile loop and the actions (seconds).

    ``evaluation_period``: longest time between evaluations (escalation delays
    fire at most this late). ``debounce``: wait after a trigger, so that a burst
    of events makes one evaluation. ``freshness``: a node report older than this
    is stale (no action on its pods). ``eviction_retry``: wait after a
    PodDisruptionBudget refused an eviction. ``default_rate_limit``: eviction
    rate limit where no GPUMemoryPolicy selects the namespace.
    ``request_timeout``: timeout of each API call made by the actions.
    ``dra``: which ResourceSlice device attribute is a GPU's UUID and which
    capacity its memory (docs/allocations.md). ``evaluation_timeout``: the
    longest one budget's evaluation (or another stage of a group's) may take
    (``isolation``). ``state_key_file``: the file holding the key that seals
    the state written on pods (``""``: none), and ``state_key`` its content.
    ``status_refresh``: longest a budget status's changed usage figures wait
    to be written. ``unlabelled_pods``: also watch pods without the webhook's
    ``vramguard.io/gpu-pod`` label (docs/operator.md, "Which pods are watched").
    """

    evaluation_period: float = 5.0
    debounce: float = 0.02
    freshness: float = 60.0
    eviction_retry: float = 30.0
    default_rate_limit: EvictionRateLimit = field(default_factory=EvictionRateLimit)
    request_timeout: float = 10.0
    dra: DRAConfig = field(default_factory=DRAConfig)
    evaluation_timeout: float = 30.0
    state_key_file: str = ""
    state_key: bytes | None = field(default=None, repr=False)
    status_refresh: float = 30.0
    unlabelled_pods: bool = True

    def engine(self) -> EngineConfig:
        """The engine's settings."""
        return EngineConfig(freshness_seconds=self.freshness, state_key=self.state_key)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """These settings from ``VRAMGUARD_*`` variables (``env``, default the
        process's) and the defaults, as ``settings_from_env`` reads them.
        Raises ``ValueError`` naming the flag, the variable and a bad value."""
        return settings_from_env(env).config


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Where the webhook server listens and how the API server reaches it.

    ``port``: HTTPS port. ``tls_dir``: directory of ``tls.crt``/``tls.key``/
    ``ca.crt`` (see ``certs``). ``addr``: listen address. ``host``: the host the
    API server calls in managed mode (its certificate's first SAN). ``managed``:
    let kopf maintain the webhook configurations. ``extra_sans``: more names
    for a generated certificate.
    """

    port: int
    tls_dir: str
    addr: str = "0.0.0.0"
    host: str = "127.0.0.1"
    managed: bool = False
    extra_sans: tuple[str, ...] = field(default_factory=tuple)

    def hosts(self) -> list[str]:
        """Names the serving certificate must cover."""
        names = [self.host, "localhost", "127.0.0.1", *self.extra_sans]
        if self.addr not in ("0.0.0.0", "::", ""):
            names.append(self.addr)
        return list(dict.fromkeys(names))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebhookConfig | None:
        """From ``VRAMGUARD_WEBHOOK_PORT`` (unset or empty: None, no webhooks),
        ``_TLS_DIR``, ``_ADDRESS``, ``_HOST``, ``_MANAGED`` (``true``) and
        ``_EXTRA_SANS`` (comma-separated), as ``settings_from_env`` reads them.
        Raises ``ValueError`` naming the variable of a bad value."""
        return settings_from_env(env).webhook


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """Everything ``vramguard operator`` is told: the loop's ``config``; the
    namespaces watched (kopf glob patterns; empty: every namespace); kopf's
    ``liveness`` endpoint (``""``: none); the Prometheus server's port (0:
    none) and address; kopf's watch timeout (seconds); the admission
    webhooks (None: not served); the namespace shards (``shards``, this
    replica's ``shard_identity``, the Leases' ``lease_namespace`` and
    ``lease_duration``; empty identity and namespace: ``POD_NAME`` and
    ``POD_NAMESPACE``, else the host name and ``default``); the log level flags."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    namespaces: tuple[str, ...] = ()
    liveness: str = DEFAULT_LIVENESS
    metrics_port: int = 9090
    metrics_address: str = "0.0.0.0"
    watch_timeout: float = 300.0
    webhook: WebhookConfig | None = None
    shards: int = 1
    shard_identity: str = ""
    lease_namespace: str = ""
    lease_duration: float = 30.0
    verbose: bool = False
    debug: bool = False
    quiet: bool = False
    log_format: str = "text"


class _TrueWord(click.ParamType):
    """``true`` (any case) is True, anything else False (as the chart and the
    tests spell ``VRAMGUARD_WEBHOOK_MANAGED``)."""

    name = "true|false"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> bool:
        return value if isinstance(value, bool) else str(value).strip().lower() == "true"


class KeyFile(click.ParamType):
    """A file holding the state key: at least 16 bytes once surrounding white
    space is stripped (a mounted Secret's key); ``""`` is none."""

    name = "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """The path, once the file is read and holds a key."""
        path = str(value)
        if path:
            try:
                key = read_key(path)
            except OSError as err:
                self.fail(f"cannot read the state key file {path!r}: {err.strerror or err}", param, ctx)
            if len(key) < MIN_STATE_KEY_BYTES:
                self.fail(f"the state key in {path!r} has {len(key)} bytes; want at least {MIN_STATE_KEY_BYTES}",
                          param, ctx)
        return path


def read_key(path: str) -> bytes:
    """The state key in ``path`` (surrounding white space stripped). Raises ``OSError``."""
    with open(path, "rb") as f:
        return f.read(4096).strip()


def default_key_path(environ: Mapping[str, str] = os.environ) -> str:
    """Where an operator started without ``--state-key-file`` keeps the key it
    generates: ``$XDG_STATE_HOME/vramguard/state-key`` (the XDG base directory
    spec's place for state that survives restarts; default ``~/.local/state``)."""
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "vramguard", "state-key")


def default_state_key(path: str) -> tuple[bytes, str]:
    """The key of an operator started without ``--state-key-file``, and one line
    saying where it comes from: the key in ``path`` when it holds one,
    else a new random key (32 bytes, hex) written there (mode 0600), else
    (``path`` cannot be written) a key held in memory only, so that state of
    an earlier run is not obeyed either. Never raises ``OSError``."""
    try:
        key = read_key(path)
        if len(key) >= MIN_STATE_KEY_BYTES:
            return key, f"state key: none given (--state-key-file); using the one kept in {path}"
    except OSError:
        pass
    key = secrets.token_hex(32).encode()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key + b"\n")
    except OSError as err:
        return key, (f"state key: none given (--state-key-file) and {path} cannot be written "
                     f"({err.strerror or err}): a key held in memory only; state on pods from before this "
                     "start is not obeyed")
    return key, (f"state key: none given (--state-key-file); generated one and kept it in {path}: "
                 "state on pods not sealed with it is not obeyed")


def parameters() -> list[click.Parameter]:
    """The options of ``vramguard operator``, fresh objects each call."""
    env = env_option
    return [
        click.Option(["-A", "--all-namespaces"], is_flag=True, help="watch every namespace (default)"),
        click.Option(["-n", "--namespace"], multiple=True, metavar="PATTERN",
                     help="watch these namespaces only (repeatable; glob patterns such as 'ml-*')"),
        env("--namespaces", "VRAMGUARD_NAMESPACES", "", hidden=True),
        click.Option(["--standalone"], is_flag=True, default=True,
                     help="accepted for compatibility and does nothing: the operator always runs without "
                     "kopf peering (standalone; one replica only)"),
        env("--liveness", "VRAMGUARD_LIVENESS", DEFAULT_LIVENESS,
            help=f"kopf's liveness endpoint; '' disables (env VRAMGUARD_LIVENESS; {DEFAULT_LIVENESS})"),
        env("--metrics-port", "VRAMGUARD_METRICS_PORT", "9090", type=WholeNumber(0, 65535),
            help="Prometheus /metrics port; 0 disables (env VRAMGUARD_METRICS_PORT; default 9090)"),
        env("--metrics-address", "VRAMGUARD_METRICS_ADDRESS", "0.0.0.0",
            help="address the metrics server binds (env VRAMGUARD_METRICS_ADDRESS; default 0.0.0.0)"),
        *(env(flag, var, default, type=Duration(), help=f"{text} (env {var}; default {default})")
          for flag, var, default, text in _DURATIONS),
        env("--eviction-rate-per-minute", "VRAMGUARD_EVICTION_RATE_PER_MINUTE", "2", type=WholeNumber(0),
            help="evictions per minute where no GPUMemoryPolicy selects the namespace "
            "(env VRAMGUARD_EVICTION_RATE_PER_MINUTE; default 2)"),
        env("--eviction-burst", "VRAMGUARD_EVICTION_BURST", "2", type=WholeNumber(1),
            help="eviction burst where no GPUMemoryPolicy selects the namespace "
            "(env VRAMGUARD_EVICTION_BURST; default 2)"),
        env("--dra-uuid-attribute", "VRAMGUARD_DRA_UUID_ATTRIBUTE", DEFAULT_UUID_ATTRIBUTE,
            help="ResourceSlice device attribute holding a GPU's UUID (env VRAMGUARD_DRA_UUID_ATTRIBUTE; "
            f"default {DEFAULT_UUID_ATTRIBUTE}, as NVIDIA's and HAMi's DRA drivers publish it)"),
        env("--dra-memory-capacity", "VRAMGUARD_DRA_MEMORY_CAPACITY", DEFAULT_MEMORY_CAPACITY,
            help="ResourceSlice device capacity that is a GPU's memory (env VRAMGUARD_DRA_MEMORY_CAPACITY; "
            f"default {DEFAULT_MEMORY_CAPACITY})"),
        env("--state-key-file", "VRAMGUARD_STATE_KEY_FILE", "", type=KeyFile(),
            help="file holding the key that seals the escalation state the operator writes on pods "
            "(docs/operator.md, 'Forged state'); '' for none (env VRAMGUARD_STATE_KEY_FILE)"),
        env("--unlabelled-pods", "VRAMGUARD_UNLABELLED_PODS", "watch", type=click.Choice(["watch", "ignore"]),
            help="pods without the webhook's vramguard.io/gpu-pod label: watch (default) or ignore "
            "(env VRAMGUARD_UNLABELLED_PODS)"),
        env("--shards", "VRAMGUARD_SHARDS", "1", type=WholeNumber(1),
            help="namespace shards, one Lease each; run this many replicas (env VRAMGUARD_SHARDS; default 1)"),
        env("--shard-identity", "VRAMGUARD_SHARD_IDENTITY", "",
            help="this replica's name in the shard Leases (env VRAMGUARD_SHARD_IDENTITY; default $POD_NAME)"),
        env("--lease-namespace", "VRAMGUARD_LEASE_NAMESPACE", "",
            help="namespace of the shard Leases (env VRAMGUARD_LEASE_NAMESPACE; default $POD_NAMESPACE)"),
        *_webhook_parameters(),
        click.Option(["-v", "--verbose"], is_flag=True, help="log at DEBUG level"),
        click.Option(["-d", "--debug"], is_flag=True, help="DEBUG, with asyncio's logs"),
        click.Option(["-q", "--quiet"], is_flag=True, help="log warnings and errors only"),
        env("--log-format", "VRAMGUARD_LOG_FORMAT", "text", type=click.Choice(LOG_FORMATS),
            help="text (kopf's: time, logger, level, message) or json (one object per line, for log "
            "collectors) (env VRAMGUARD_LOG_FORMAT; default text)"),
    ]


def _webhook_parameters() -> list[click.Parameter]:
    # The chart passes the port and the TLS directory as flags; the rest are
    # read from their variables (docs/policy.md) and kept out of --help.
    env = env_option
    return [
        env("--webhook-port", "VRAMGUARD_WEBHOOK_PORT", None, type=WholeNumber(1, 65535), empty_is_unset=True,
            help="serve the admission webhooks on this HTTPS port (off when unset; env VRAMGUARD_WEBHOOK_PORT; "
            "VRAMGUARD_WEBHOOK_* set the rest, see docs/policy.md)"),
        env("--webhook-tls-dir", "VRAMGUARD_WEBHOOK_TLS_DIR", DEFAULT_WEBHOOK_TLS_DIR,
            help=f"directory of the webhooks' tls.crt/tls.key (env VRAMGUARD_WEBHOOK_TLS_DIR; "
            f"default {DEFAULT_WEBHOOK_TLS_DIR})"),
        env("--webhook-address", "VRAMGUARD_WEBHOOK_ADDRESS", "0.0.0.0", hidden=True),
        env("--webhook-host", "VRAMGUARD_WEBHOOK_HOST", "127.0.0.1", hidden=True),
        env("--webhook-managed", "VRAMGUARD_WEBHOOK_MANAGED", "false", type=_TrueWord(), hidden=True),
        env("--webhook-extra-sans", "VRAMGUARD_WEBHOOK_EXTRA_SANS", "", hidden=True),
    ]


def _one_of(params: Mapping[str, Any], *names: str) -> None:
    given = [n for n in names if params[n]]
    if len(given) > 1:
        flags = " and ".join("--" + n.replace("_", "-") for n in given)
        raise click.UsageError(f"{flags} cannot be used together")


def from_params(params: Mapping[str, Any]) -> OperatorSettings:
    """``OperatorSettings`` from the values click read for ``parameters()``.
    Raises ``click.UsageError`` for flags that exclude each other (``-A`` and
    ``-n``; ``-v``, ``-d`` and ``-q``)."""
    _one_of(params, "all_namespaces", "namespace")
    namespaces = tuple(params["namespace"]) or tuple(
        p for p in params["namespaces"].replace(",", " ").split() if p)
    _one_of(params, "verbose", "debug", "quiet")
    config = OperatorConfig(
        evaluation_period=params["evaluation_period"],
        debounce=params["debounce"],
        freshness=params["freshness"],
        eviction_retry=params["eviction_retry"],
        default_rate_limit=EvictionRateLimit(
            perMinute=params["eviction_rate_per_minute"], burst=params["eviction_burst"]
        ),
        request_timeout=params["request_timeout"],
        dra=DRAConfig(params["dra_uuid_attribute"], params["dra_memory_capacity"]),
        evaluation_timeout=params["evaluation_timeout"],
        state_key_file=params["state_key_file"],
        state_key=read_key(params["state_key_file"]) if params["state_key_file"] else None,
        status_refresh=params["status_refresh"],
        unlabelled_pods=params["unlabelled_pods"] == "watch",
    )
    webhook = None
    if params["webhook_port"] is not None:
        webhook = WebhookConfig(
            port=params["webhook_port"],
            tls_dir=params["webhook_tls_dir"] or DEFAULT_WEBHOOK_TLS_DIR,
            addr=params["webhook_address"],
            host=params["webhook_host"],
            managed=params["webhook_managed"],
            extra_sans=tuple(s for s in params["webhook_extra_sans"].split(",") if s),
        )
    return OperatorSettings(
        config=config,
        namespaces=() if params["all_namespaces"] else namespaces,
        liveness=params["liveness"],
        metrics_port=params["metrics_port"],
        metrics_address=params["metrics_address"],
        watch_timeout=params["watch_timeout"],
        webhook=webhook,
        shards=params["shards"],
        shard_identity=params["shard_identity"],
        lease_namespace=params["lease_namespace"],
        lease_duration=params["lease_duration"],
        verbose=params["verbose"],
        debug=params["debug"],
        quiet=params["quiet"],
        log_format=params["log_format"],
    )


def parse_settings(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> OperatorSettings:
    """The settings ``vramguard operator ARGV`` would run with, reading the
    variables of ``env`` (default: the process's). Raises ``click.UsageError``
    (a ``click.BadParameter`` for a bad value, naming flag, variable and value)."""
    command = click.Command("operator", params=parameters())
    obj = Environment(env) if env is not None else None
    with command.make_context("vramguard operator", list(argv), obj=obj) as ctx:
        return from_params(ctx.params)


def settings_from_env(env: Mapping[str, str] | None = None) -> OperatorSettings:
    """The settings from the ``VRAMGUARD_*`` variables of ``env`` (default: the
    process's) and the defaults, for an operator started without ``vramguard
    operator`` (``kopf run``). Raises ``ValueError`` with the message of a bad
    value (flag, variable and value)."""
    try:
        return parse_settings((), env if env is not None else dict(os.environ))
    except click.UsageError as err:
        raise ValueError(err.format_message()) from None


def settings_of(memo: MutableMapping[str, Any]) -> OperatorSettings:
    """The settings in kopf's memo (``vramguard operator`` puts them there), or
    else those of the environment, kept in the memo for the other handlers.
    Raises ``ValueError`` as ``settings_from_env`` does."""
    settings = memo.get("settings")
    if not isinstance(settings, OperatorSettings):
        settings = settings_from_env()
        memo["settings"] = settings
    return settings
