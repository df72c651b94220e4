"""The Nodes and running Pods of a cluster, listed once, for ``inspect``.

The client comes from :func:`webhook.cluster.client.api_client`.

Lists come page by page (``limit``/``continue``) so that a cluster of thousands of
nodes is never one huge response, and arrive as plain dicts (parsed with orjson; the
client's models drop unknown fields and cost ~20x more to build). Pods that finished
are filtered out by the apiserver (field selector on ``status.phase``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

PAGE_SIZE: Final = 500
# Seconds to connect, then to read one page.
TIMEOUT: Final = (10, 60)
RUNNING_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"
# An expired continue token (410 Gone) restarts a listing; it should not happen twice.
_RESTARTS: Final = 2

Obj = dict[str, Any]


class InventoryError(Exception):
    """The cluster cannot be read: the message is one line that says what to change."""


@dataclass(frozen=True, slots=True)
class Listing:
    nodes: list[Obj]
    pods: list[Obj]


def _pages(call: Callable[..., Any], **selectors: str) -> list[Obj]:
    items: list[Obj] = []
    token: str | None = None
    while True:
        response = call(
            limit=PAGE_SIZE,
            _continue=token,
            _preload_content=False,
            _request_timeout=TIMEOUT,
            **selectors,
        )
        body = orjson.loads(response.data)
        items.extend(item for item in body.get("items") or () if isinstance(item, dict))
        token = (body.get("metadata") or {}).get("continue") or None
        if token is None:
            return items


def _listed(call: Callable[..., Any], **selectors: str) -> list[Obj]:
    from kubernetes.client import ApiException

    for _ in range(_RESTARTS):
        try:
            return _pages(call, **selectors)
        except ApiException as exc:
            if exc.status != 410:
                raise
    return _pages(call, **selectors)


def list_cluster(api: Any, *, node: str | None = None) -> Listing:
    """Every Node (or ``node`` alone) and every Pod that has not finished (on ``node``)."""
    import urllib3
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    host = api.configuration.host
    node_selector = {"field_selector": f"metadata.name={node}"} if node else {}
    pod_selector = RUNNING_PODS + (f",spec.nodeName={node}" if node else "")
    try:
        nodes = _listed(core.list_node, **node_selector)
        pods = _listed(core.list_pod_for_all_namespaces, field_selector=pod_selector)
    except client.ApiException as exc:
        reason = _reason(exc)
        if exc.status in (401, 403):
            raise InventoryError(
                f"{host}: {reason}; inspect needs get/list on nodes and pods "
                "in all namespaces (a ClusterRole)"
            ) from None
        raise InventoryError(f"{host}: {reason}") from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        detail = " ".join(str(getattr(exc, "reason", None) or exc).split())
        raise InventoryError(
            f"cannot reach the Kubernetes API at {host}: {detail}; "
            "check --kubeconfig/--context and that the cluster is up"
        ) from None
    except orjson.JSONDecodeError:
        raise InventoryError(f"{host}: the answer is not JSON; is this a Kubernetes API?") from None
    return Listing(nodes=nodes, pods=pods)


def _reason(exc: Any) -> str:
    """The apiserver's own message (its Status object), else the HTTP reason."""
    try:
        status = orjson.loads(exc.body or b"")
    except (orjson.JSONDecodeError, TypeError):
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return f"{exc.status} {message or exc.reason}"
