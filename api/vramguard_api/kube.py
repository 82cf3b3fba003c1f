"""Kubernetes API clients: the one factory of the operator, its commands and
the node agent.

The kubernetes client is imported inside the functions, so that importing this
module loads nothing: ``vramguard analyze`` and ``replay`` never load the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


def api_client(kubeconfig: str | None = None, context: str | None = None) -> ApiClient:
    """An ``ApiClient`` with a configuration of its own (the library's global
    default configuration is left alone).

    With neither ``kubeconfig`` nor ``context`` the pod's service account is
    used when the process runs in a pod (the in-cluster configuration, as
    client-go's ``rest.InClusterConfig``); otherwise, and outside a pod, the
    kubeconfig file ``kubeconfig`` (default: ``$KUBECONFIG``, then
    ``~/.kube/config``) with ``context`` (default: its current context).

    Raises ``kubernetes.config.ConfigException`` when no configuration loads
    (no service account and no kubeconfig, an unknown context) and ``OSError``
    or ``yaml.YAMLError`` for an unreadable or malformed file.
    """
    from kubernetes import client, config

    if kubeconfig is None and context is None:
        try:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException:
            pass  # not in a pod: the kubeconfig file
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return client.ApiClient(configuration)


def current_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace of kubeconfig context ``context`` (default: the current
    one), as kubectl picks it; ``"default"`` when the context names none or no
    kubeconfig can be read."""
    from kubernetes import config

    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError):
        return "default"
    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")
