"""Access to the Kubernetes API: a ``kubernetes`` ApiClient from a kubeconfig or a Pod."""

from __future__ import annotations

import os
from typing import Any


class ClusterAccessError(Exception):
    """No usable API access; the message says where it looked and what to pass."""


def api_client(kubeconfig: str | None = None, *, context: str | None = None) -> Any:
    """A ``kubernetes`` ApiClient: ``kubeconfig`` when given, the Pod's service account
    in a cluster, else ``$KUBECONFIG`` or ``~/.kube/config``.

    In a Pod the client re-reads the projected service-account token before it expires,
    so a long-running watch keeps working across token rotations.
    """
    from kubernetes import client
    from kubernetes import config as kube_config

    # The loaders carry no annotations.
    config: Any = kube_config
    try:
        if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return config.new_client_from_config(config_file=kubeconfig, context=context)
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ClusterAccessError(
            f"{where}: no Kubernetes API access: {exc} (in a Pod the service account is "
            "used; elsewhere pass --kubeconfig, or set $KUBECONFIG)"
        ) from None
