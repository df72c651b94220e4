"""The HTTPS admission service: a thin aiohttp layer around :func:`webhook.admission.answer`.

Domain errors become HTTP answers here and nowhere else: a malformed review is a 400
with a JSON Status body, an oversized one a 413, a failure inside the decision an
answer that follows the policy's ``onError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import re
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

import orjson
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from webhook.admission import Answer, Endpoint, ReviewError, answer, error_answer
from webhook.audit import AuditSink, build_record
from webhook.metrics import CONTENT_TYPE, Metrics
from webhook.store import PolicyStore
from webhook.tls import CertificateError, CertificateReloader, CertPaths, ensure_dev_certificates
from webhook.tracing import configure as configure_tracing

if TYPE_CHECKING:
    # Imported when used: it loads the kubernetes client, which only this mode needs.
    from webhook.selfmanaged import SelfManagedConfig

log = logging.getLogger(__name__)

LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
MAX_BODY: Final = 4 << 20  # UPDATE carries object and oldObject; 4 MiB is ample
DEFAULT_TIMEOUT: Final = 10.0  # the apiserver's own default webhook timeout
_TIMEOUT_PARAM: Final = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")

Observer = Callable[[Answer, str, float, "str | None"], None]


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


@dataclass(slots=True)
class ServerConfig:
    host: str = "0.0.0.0"  # noqa: S104  # a webhook must be reachable from the apiserver
    port: int = 8443
    health_port: int = 8080
    policy: str | None = None
    cert_dir: str = "certs"
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    audit_log: str = "-"
    audit_max_bytes: int = 100 << 20
    audit_backups: int = 5
    workers: int = 1
    sans: list[str] = field(default_factory=list)
    shutdown_timeout: float = 15.0
    policy_poll_interval: float = 1.0
    cert_poll_interval: float = 10.0
    reuse_port: bool = False
    # Certificates from a Secret the webhook keeps itself, written to cert_dir.
    self_managed: SelfManagedConfig | None = None


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


async def _handle(request: web.Request, endpoint: Endpoint) -> web.Response:
    app = request.app
    state = app[STATE]
    started = time.perf_counter()
    state.in_flight += 1
    try:
        if request.content_type != "application/json":
            return _status(415, f"content type {request.content_type!r} is not application/json")
        try:
            if request.content.is_eof():  # the whole body is here: no timer (~4% CPU) needed
                raw = await request.read()
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
        policy = app[STORE].policy
        error: str | None = None
        try:
            result = answer(body, policy, endpoint=endpoint)
        except ReviewError as exc:
            app[METRICS].errors.labels(endpoint, "malformed").inc()
            return _status(400, str(exc))
        except Exception as exc:  # any bug becomes an onError answer, never a 500
            uid = body.get("request", {}).get("uid") if isinstance(body, dict) else None
            log.exception("evaluation failed uid=%s endpoint=%s", uid, endpoint)
            error = type(exc).__name__
            result = error_answer(body, policy, endpoint=endpoint, error=error)
        latency = time.perf_counter() - started
        app[SINK].emit(
            build_record(
                result, endpoint=endpoint, policy_hash=policy.digest, latency_s=latency, error=error
            )
        )
        for observer in app[OBSERVERS]:
            observer(result, endpoint, latency, error)
        state.served += 1
        return web.Response(body=orjson.dumps(result.review), content_type="application/json")
    finally:
        state.in_flight -= 1


async def mutate(request: web.Request) -> web.Response:
    return await _handle(request, "mutate")


async def validate(request: web.Request) -> web.Response:
    return await _handle(request, "validate")


def create_app(
    *,
    store: PolicyStore,
    sink: AuditSink,
    metrics: Metrics,
    state: ServiceState | None = None,
    observers: Sequence[Observer] = (),
) -> web.Application:
    """The webhook application (HTTPS side)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[STORE] = store
    app[SINK] = sink
    app[METRICS] = metrics
    app[STATE] = state or ServiceState(ready=True)
    app[OBSERVERS] = [
        lambda result, endpoint, latency, error: metrics.observe(
            result, endpoint=endpoint, latency_s=latency, error=error
        ),
        *observers,
    ]
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/validate", validate)
    return app


def create_health_app(
    *, state: ServiceState, metrics: Metrics, store: PolicyStore
) -> web.Application:
    """Plain-HTTP probes and metrics, on their own port so probes need no TLS."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if not state.ready:
            return web.json_response({"status": "not ready"}, status=503)
        return web.json_response(
            {"status": "ready", "policy": store.policy.digest, "pid": os.getpid()}
        )

    async def metrics_handler(_: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app


def _listen(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


@dataclass(slots=True)
class Service:
    """A running service: both runners and the background tasks, for a clean stop."""

    runner: web.AppRunner
    health_runner: web.AppRunner
    state: ServiceState
    store: PolicyStore
    sink: AuditSink
    tasks: list[asyncio.Task[None]]
    port: int
    health_port: int
    metrics: Metrics
    shutdown_timeout: float
    tracer_provider: TracerProvider | None = None

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, flush the audit log."""
        self.state.ready = False
        # Stop listening first but keep open connections reading: aiohttp's own
        # shutdown stops reading at once, which would strand a request whose body
        # is still arriving.
        for site in list(self.runner.sites):
            await site.stop()
        deadline = time.monotonic() + self.shutdown_timeout
        # A counter shared by every handler: a 10 ms poll while stopping costs nothing.
        while self.state.in_flight and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.runner.cleanup()
        await self.health_runner.cleanup()
        await self.sink.aclose()
        if self.tracer_provider is not None:
            await asyncio.to_thread(self.tracer_provider.shutdown)


async def start(
    config: ServerConfig, *, ssl_context: ssl.SSLContext, extra_tasks: list[Any] | None = None
) -> Service:
    """Start both listeners; returns once they accept connections."""
    store = PolicyStore(config.policy)
    sink = AuditSink(
        config.audit_log, max_bytes=config.audit_max_bytes, backups=config.audit_backups
    )
    metrics = Metrics()
    metrics.set_policy(store.policy.name, store.policy.digest)

    def on_reload(ok: bool) -> None:
        metrics.reloaded(ok)
        metrics.set_policy(store.policy.name, store.policy.digest)

    store.listeners.append(on_reload)
    state = ServiceState()
    tracing = configure_tracing()
    app = create_app(
        store=store,
        sink=sink,
        metrics=metrics,
        state=state,
        observers=[tracing[0]] if tracing else [],
    )
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=config.shutdown_timeout, handle_signals=False
    )
    await runner.setup()
    sock = _listen(config.host, config.port, reuse_port=config.reuse_port)
    await web.SockSite(runner, sock, ssl_context=ssl_context).start()
    health = create_health_app(state=state, metrics=metrics, store=store)
    health_runner = web.AppRunner(health, access_log=None, handle_signals=False)
    await health_runner.setup()
    health_sock = _listen(config.host, config.health_port, reuse_port=config.reuse_port)
    await web.SockSite(health_runner, health_sock).start()
    tasks = [asyncio.create_task(store.watch(config.policy_poll_interval))]
    tasks.extend(asyncio.create_task(coro) for coro in extra_tasks or [])
    state.ready = True
    return Service(
        runner=runner,
        health_runner=health_runner,
        state=state,
        store=store,
        sink=sink,
        tasks=tasks,
        port=sock.getsockname()[1],
        health_port=health_sock.getsockname()[1],
        metrics=metrics,
        shutdown_timeout=config.shutdown_timeout,
        tracer_provider=tracing[1] if tracing else None,
    )


async def serve_forever(
    config: ServerConfig,
    *,
    ssl_context: ssl.SSLContext,
    extra_tasks: list[Any] | None = None,
    certificate: CertificateReloader | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; SIGHUP reloads the policy."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    service = await start(config, ssl_context=ssl_context, extra_tasks=extra_tasks)
    if certificate is not None:
        service.metrics.track_certificate(lambda: certificate.not_after.timestamp())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, service.store.reload)
    log.info(
        "serving https://%s:%d (/mutate, /validate), health http://%s:%d, policy %s (%s), pid %d",
        config.host,
        service.port,
        config.host,
        service.health_port,
        service.store.policy.name,
        service.store.policy.digest,
        os.getpid(),
    )
    await stop.wait()
    log.info("stopping: draining %d in-flight requests", service.state.in_flight)
    await service.stop()
    log.info("stopped after %d answers", service.state.served)


def tls_for(config: ServerConfig) -> CertificateReloader:
    """The certificate source: given files, the self-managed pair in ``cert_dir``, or
    development certificates in ``cert_dir``."""
    if config.tls_cert or config.tls_key:
        if not (config.tls_cert and config.tls_key):
            raise CertificateError(
                config.tls_cert or config.tls_key or "", "--tls-cert and --tls-key go together"
            )
        return CertificateReloader(config.tls_cert, config.tls_key, client_ca_file=config.client_ca)
    if config.self_managed is not None:
        # Written there by webhook.selfmanaged before the server starts.
        paths = CertPaths.in_directory(config.cert_dir)
        return CertificateReloader(paths.cert_file, paths.key_file, client_ca_file=config.client_ca)
    paths = ensure_dev_certificates(config.cert_dir, extra_sans=config.sans)
    return CertificateReloader(paths.cert_file, paths.key_file, client_ca_file=config.client_ca)


def _serve_process(config: ServerConfig, manage_certificates: bool = True) -> None:
    """One serving process; with ``manage_certificates`` it also runs the self-managed
    certificate loop (in one process of a pod only)."""
    asyncio.run(_serve(config, manage_certificates=manage_certificates))


def _worker(config: ServerConfig, manage_certificates: bool, log_level: int) -> None:
    # A spawned process starts with logging unconfigured: log like the parent.
    logging.basicConfig(level=log_level, stream=sys.stderr, format=LOG_FORMAT)
    _serve_process(config, manage_certificates)


async def _serve(config: ServerConfig, *, manage_certificates: bool) -> None:
    extra_tasks: list[Any] = []
    if config.self_managed is not None and manage_certificates:
        from webhook.selfmanaged import SelfManagedCertificates

        manager = SelfManagedCertificates.from_config(config.self_managed, cert_dir=config.cert_dir)
        # The first serving pair must be on disk before the server loads it.
        await manager.ensure_ready(config.self_managed.ready_timeout)
        extra_tasks.append(manager.run())
    reloader = tls_for(config)
    extra_tasks.append(reloader.watch(config.cert_poll_interval))
    await serve_forever(
        config, ssl_context=reloader.server_context, extra_tasks=extra_tasks, certificate=reloader
    )


async def _fetch_self_managed(config: SelfManagedConfig, cert_dir: str) -> None:
    from webhook.selfmanaged import SelfManagedCertificates

    manager = SelfManagedCertificates.from_config(config, cert_dir=cert_dir)
    await manager.ensure_ready(config.ready_timeout)


def run(config: ServerConfig) -> int:
    """Serve in this process, or in ``workers`` processes sharing the ports."""
    # Certificates are on disk before any worker starts: development certificates are
    # generated once here; self-managed ones are fetched (or issued) once here, then
    # kept current by the first worker, all workers sharing one Lease identity.
    if config.self_managed is None:
        tls_for(config)
    elif config.workers > 1:
        asyncio.run(_fetch_self_managed(config.self_managed, config.cert_dir))
    if config.workers <= 1:
        _serve_process(config)
        return 0
    context = multiprocessing.get_context("spawn")
    shared = replace(config, reuse_port=True)
    level = logging.getLogger().getEffectiveLevel()
    workers = [
        context.Process(target=_worker, args=(shared, i == 0, level), name=f"worker-{i}")
        for i in range(config.workers)
    ]
    for worker in workers:
        worker.start()

    def forward(signum: int, _frame: object) -> None:
        for worker in workers:
            if worker.pid is not None and worker.is_alive():
                os.kill(worker.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for worker in workers:
        worker.join()
    return max((w.exitcode or 0) for w in workers)
