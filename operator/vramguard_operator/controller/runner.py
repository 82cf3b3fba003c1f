"""Running the operator: kopf, standalone, with the metrics server and, when
configured, the admission webhooks. ``vramguard operator`` calls ``run`` with
the settings it read (``settings.OperatorSettings``).

Logs go to stderr (kopf's handler; the command's own errors too), so that
stdout stays free for what a command prints.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace

import kopf

from vramguard_api.cliargs import one_line
from vramguard_operator.controller.metrics import process_metrics, serve_metrics
from vramguard_operator.controller.settings import OperatorSettings, default_key_path, default_state_key

log = logging.getLogger("vramguard.operator")

# At INFO, kopf logs every event handler's success (one line per pod event) and
# every liveness probe with its HTTP access line.
_CHATTY_LOGGERS = ("kopf.objects", "kopf.activities.probe", "aiohttp.access")


def configure_logging(settings: OperatorSettings) -> None:
    """kopf's log handler (stderr) at the level the flags ask for; kopf's
    per-event and per-probe lines only at DEBUG."""
    kopf.configure(debug=settings.debug, verbose=settings.verbose, quiet=settings.quiet,
                   log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL)
    if not (settings.verbose or settings.debug):
        for name in _CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def no_credentials() -> str | None:
    """Why the operator has no way to reach an API server, or None when it has one: kopf
    would otherwise log a traceback and retry every minute. The sources are kopf's (and
    kubectl's): the in-cluster service account, else $KUBECONFIG or ~/.kube/config."""
    from kubernetes import config

    try:
        config.load_incluster_config()
        return None
    except config.ConfigException:
        pass
    try:
        config.load_kube_config()
        return None
    except (config.ConfigException, OSError, TypeError, ValueError) as err:  # TypeError: an empty file
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        return (f"no Kubernetes credentials: not in a cluster (no service account token) and no usable "
                f"kubeconfig at {where} ({one_line(str(err))}); set KUBECONFIG or run in a pod")


def run(settings: OperatorSettings) -> int:
    """Run the operator until SIGINT/SIGTERM; returns the exit status.

    Importing ``handlers`` registers the operator's handlers with kopf's
    default registry; ``webhooks`` only when a webhook port is set (its
    admission handlers need a server). A metrics port that cannot be bound
    ends it with status 1 and the reason on stderr."""
    from vramguard_operator.controller import handlers  # noqa: F401

    if settings.webhook is not None:
        from vramguard_operator.controller import webhooks  # noqa: F401
    configure_logging(settings)
    missing = no_credentials()
    if missing is not None:
        print(f"vramguard operator: {missing}", file=sys.stderr)
        return 1
    if settings.config.state_key is None:
        # never obey state that cannot be verified: a key of our own, kept
        key, note = default_state_key(default_key_path())
        settings = replace(settings, config=replace(settings.config, state_key=key))
        log.warning("%s", note)
    try:
        serve_metrics(settings.metrics_port, settings.metrics_address)
    except OSError as err:
        print(f"vramguard operator: --metrics-port: cannot serve on {settings.metrics_address}:"
              f"{settings.metrics_port}: {err}", file=sys.stderr)
        return 1
    kopf.run(
        standalone=True,  # always: no kopf peering (shards are vramguard's own, docs/operator.md)
        # kopf watches nothing itself (vramguard's informers do, and they apply -n);
        # cluster-wide only says where its admission handlers may be called from
        clusterwide=True,
        liveness_endpoint=settings.liveness or None,
        memo=kopf.Memo(settings=settings, metrics=process_metrics()),
    )
    return 0
