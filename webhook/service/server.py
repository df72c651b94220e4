"""The HTTPS admission application: a thin aiohttp layer around :mod:`webhook.core.admission`.

Domain errors become HTTP answers here and nowhere else: a malformed review is a 400
with a JSON Status body, an oversized one a 413, a failure inside the decision an
answer that follows the policy's ``onError``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson
from aiohttp import hdrs, web

from webhook.core.admission import Answer, answer, error_answer
from webhook.core.cluster import ClusterView
from webhook.core.wire import Endpoint, ReviewError, parse_review
from webhook.service.audit import AuditSink, build_record
from webhook.service.metrics import CONTENT_TYPE, Metrics
from webhook.service.store import PolicyStore
from webhook.version import version

log = logging.getLogger(__name__)

MAX_BODY: Final = 4 << 20  # UPDATE carries object and oldObject; 4 MiB is ample
DEFAULT_TIMEOUT: Final = 10.0  # the apiserver's own default webhook timeout
_TIMEOUT_PARAM: Final = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")

Observer = Callable[[Answer, str, float, "str | None"], None]


class ViewSource(Protocol):
    """Where a request takes the cluster view from (``serve --cluster``)."""

    @property
    def view(self) -> ClusterView | None: ...


@dataclass(frozen=True, slots=True)
class NoView:
    """Without ``--cluster``: every decision decides from the pod spec alone."""

    view: None = None


@dataclass(slots=True)
class ServiceState:
    ready: bool = False
    in_flight: int = 0
    served: int = 0


STORE: Final = web.AppKey("store", PolicyStore)
SINK: Final = web.AppKey("sink", AuditSink)
METRICS: Final = web.AppKey("metrics", Metrics)
STATE: Final = web.AppKey("state", ServiceState)
OBSERVERS: Final = web.AppKey("observers", list[Observer])


def _status(code: int, message: str) -> web.Response:
    """A Kubernetes-style Status body for answers that are not AdmissionReviews."""
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "message": message,
    }
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def parse_timeout(raw: str | None) -> float:
    """The apiserver's ``?timeout=10s`` as seconds (default 10 s, at most 30 s)."""
    if not raw:
        return DEFAULT_TIMEOUT
    match = _TIMEOUT_PARAM.match(raw.strip())
    if match is None:
        return DEFAULT_TIMEOUT
    value = float(match.group(1))
    unit = match.group(2) or "s"
    seconds = value / 1000 if unit == "ms" else value * 60 if unit == "m" else value
    return min(max(seconds, 0.05), 30.0)


@dataclass(frozen=True, slots=True)
class _Edge:
    """What the handlers use, bound once in :func:`create_app`: no app lookups per request."""

    store: PolicyStore
    sink: AuditSink
    metrics: Metrics
    state: ServiceState
    observers: tuple[Observer, ...]
    cluster: ViewSource


async def _handle(request: web.Request, endpoint: Endpoint, edge: _Edge) -> web.Response:
    state = edge.state
    started = time.perf_counter()
    state.in_flight += 1
    try:
        # The header as the apiserver sends it first: the content_type property parses
        # it (~1 us) and is only needed for anything else, e.g. a charset parameter.
        if (
            request.headers.get(hdrs.CONTENT_TYPE) != "application/json"
            and request.content_type != "application/json"
        ):
            return _status(415, f"content type {request.content_type!r} is not application/json")
        try:
            content = request.content
            if content.is_eof():
                # The whole body is buffered (the parser saw its end): take it without
                # read()'s bytearray copy and second readany(), and without a timer
                # (~4% CPU). read() enforced client_max_size; this enforces MAX_BODY.
                raw = content.read_nowait()
                if len(raw) > MAX_BODY:
                    return _status(413, f"body over {MAX_BODY} bytes")
            else:
                # Leave headroom inside the apiserver's deadline so our answer is not wasted.
                deadline = parse_timeout(request.query.get("timeout")) * 0.9
                async with asyncio.timeout(deadline):
                    raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _status(413, f"body over {MAX_BODY} bytes")
        except TimeoutError:
            return _status(408, "request body not received before the deadline")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return _status(400, f"body is not JSON: {exc}")
        try:
            version, review = parse_review(body)
        except ReviewError as exc:
            edge.metrics.errors.labels(endpoint, "malformed").inc()
            return _status(400, str(exc))
        policy = edge.store.policy
        error: str | None = None
        try:
            # The day exceptions' expiry is read against, only where a policy has any.
            today = time.strftime("%Y-%m-%d", time.gmtime()) if policy.exceptions else ""
            result = answer(
                version, review, policy, endpoint=endpoint, cluster=edge.cluster.view, today=today
            )
        except Exception as exc:  # any bug becomes an onError answer, never a 500
            log.exception("evaluation failed uid=%s endpoint=%s", review["uid"], endpoint)
            error = type(exc).__name__
            result = error_answer(version, review, policy, endpoint=endpoint, error=error)
        latency = time.perf_counter() - started
        edge.sink.emit(
            build_record(
                result, endpoint=endpoint, policy_hash=policy.digest, latency_s=latency, error=error
            )
        )
        edge.metrics.observe(result, endpoint=endpoint, latency_s=latency, error=error)
        for observer in edge.observers:  # tracing, when configured
            observer(result, endpoint, latency, error)
        state.served += 1
        return web.Response(body=orjson.dumps(result.review), content_type="application/json")
    finally:
        state.in_flight -= 1


def create_app(
    *,
    store: PolicyStore,
    sink: AuditSink,
    metrics: Metrics,
    state: ServiceState | None = None,
    observers: Sequence[Observer] = (),
    cluster: ViewSource | None = None,
) -> web.Application:
    """The webhook application (HTTPS side); ``cluster`` is read once per request."""
    app = web.Application(client_max_size=MAX_BODY)
    app[STORE] = store
    app[SINK] = sink
    app[METRICS] = metrics
    app[STATE] = state or ServiceState(ready=True)
    app[OBSERVERS] = list(observers)  # beyond metrics, which the handler calls itself
    # The handlers read these from here: set once, never replaced on a running app.
    edge = _Edge(store, sink, metrics, app[STATE], tuple(observers), cluster or NoView())

    async def mutate(request: web.Request) -> web.Response:
        return await _handle(request, "mutate", edge)

    async def validate(request: web.Request) -> web.Response:
        return await _handle(request, "validate", edge)

    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    return app


def create_health_app(
    *,
    state: ServiceState,
    metrics: Metrics,
    store: PolicyStore,
    cluster: Callable[[], Mapping[str, Any]] | None = None,
    duties: Callable[[], tuple[bool, Mapping[str, Any]]] | None = None,
) -> web.Application:
    """Plain-HTTP probes and metrics, on their own port so probes need no TLS.

    ``cluster`` reports the cluster view for ``/readyz``. A stale view does not make
    the service unready: decisions fall back to the pod spec, so it still admits.
    ``duties`` reports the duties configured (self-managed certificates, scope
    keeping): while their holder has stopped or hangs, ``/readyz`` is 503. Without
    duties the service is ready as soon as it listens.
    """

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": version()})

    async def readyz(_: web.Request) -> web.Response:
        if not state.ready:
            return web.json_response({"status": "not ready"}, status=503)
        body: dict[str, Any] = {
            "status": "ready",
            "policy": store.policy.digest,
            "pid": os.getpid(),
        }
        if cluster is not None:
            body["cluster"] = cluster()
        if duties is not None:
            running, body["duties"] = duties()
            if not running:
                body["status"] = "not ready"
                return web.json_response(body, status=503)
        return web.json_response(body)

    async def metrics_handler(_: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app
