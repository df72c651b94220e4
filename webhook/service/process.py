"""The service as a process: listeners, background tasks, signals, workers, shutdown.

``serve`` runs :func:`run`; tests and benchmarks start a :class:`Service` in their
own event loop with :func:`start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider

from webhook.certs.contexts import CertificateReloader
from webhook.certs.files import ensure_dev_certificates
from webhook.certs.material import CertificateError, CertPaths
from webhook.cluster.reports import ReportKeeper, ReportSettings
from webhook.cluster.watch import ClusterWatch
from webhook.cluster.watch import Settings as WatchSettings
from webhook.service import loop as serving_loop
from webhook.service.audit import AuditSink
from webhook.service.duties import DutyStatus, exit_on_failure, hold
from webhook.service.limits import (
    HEALTH_MAX_CONNECTIONS,
    LIMIT_NAMES,
    ConnectionGate,
    HeapTrimmer,
    LimitedSite,
    Limits,
    tune_malloc,
)
from webhook.service.metrics import Metrics
from webhook.service.server import ServiceState, create_app, create_health_app
from webhook.service.store import PolicyStore
from webhook.service.supervisor import Supervisor
from webhook.service.tracing import configure as configure_tracing

if TYPE_CHECKING:
    # Imported when used: it loads the kubernetes client, which only this mode needs.
    from webhook.certs.selfmanaged import SelfManagedCertificates, SelfManagedConfig

log = logging.getLogger(__name__)

LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
LISTEN_BACKLOG: Final = 1024


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
    # Handshake, header, idle and connection/request caps, per listener and process.
    limits: Limits = field(default_factory=Limits)
    # Certificates from a Secret the webhook keeps itself, written to cert_dir.
    self_managed: SelfManagedConfig | None = None
    # The watched cluster view (serve --cluster): from this kubeconfig, else in-cluster.
    cluster: bool = False
    cluster_kubeconfig: str | None = None
    cluster_settings: WatchSettings = field(default_factory=WatchSettings)
    # Policy reports from the cluster view (serve --cluster --reports).
    reports: ReportSettings | None = None


class ListenError(OSError):
    """A listener's address that cannot be bound: which listener, where, and why."""

    def __init__(self, cause: OSError, *, listener: str, host: str, port: int) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.listener = listener
        self.host = host
        self.port = port

    def __str__(self) -> str:
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        return f"cannot listen on {address} for the {self.listener} port: {self.strerror}"


def _listen(host: str, port: int, *, reuse_port: bool, listener: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError(exc, listener=listener, host=host, port=port) from exc
    sock.setblocking(False)
    return sock


def _listen_both(config: ServerConfig) -> tuple[socket.socket, socket.socket]:
    """The webhook's and the health port's sockets, or neither."""
    sock = _listen(config.host, config.port, reuse_port=config.reuse_port, listener="webhook")
    try:
        health = _listen(
            config.host, config.health_port, reuse_port=config.reuse_port, listener="health"
        )
    except OSError:
        sock.close()
        raise
    return sock, health


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
    gates: list[ConnectionGate] = field(default_factory=list)
    trimmer: HeapTrimmer | None = None
    cluster: ClusterWatch | None = None
    reports: ReportKeeper | None = None

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
        # Connections aiohttp does not know yet (mid-handshake, or refused) go too.
        for gate in self.gates:
            gate.close()
        if self.trimmer is not None:
            self.trimmer.cancel()
        await self.sink.aclose()
        if self.tracer_provider is not None:
            await asyncio.to_thread(self.tracer_provider.shutdown)


async def start(
    config: ServerConfig,
    *,
    ssl_context: ssl.SSLContext,
    extra_tasks: list[Any] | None = None,
    store: PolicyStore | None = None,
    leading: Callable[[], bool] | None = None,
    duties: DutyStatus | None = None,
) -> Service:
    """Start both listeners; returns once they accept connections.

    ``leading`` says whether this process writes policy reports (default: it does).
    ``duties`` is what ``/readyz`` reports and requires of the duties configured (none:
    ready once listening)."""
    store = store or PolicyStore(config.policy)
    # The ports before the audit file: one in use fails here, with nothing open to undo.
    try:
        sock, health_sock = _listen_both(config)
    except OSError:
        for coroutine in extra_tasks or []:
            coroutine.close()  # never to run; closed, they do not warn "never awaited"
        raise
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
    cluster = _cluster_watch(config, metrics, store) if config.cluster else None
    reports = None
    if cluster is not None and config.reports is not None:
        reports = ReportKeeper(
            cluster.api_client,
            cluster,
            lambda: store.policy,
            settings=config.reports,
            leading=leading or (lambda: True),
            metrics=metrics.track_reports(),
        )
    app = create_app(
        store=store,
        sink=sink,
        metrics=metrics,
        state=state,
        observers=[tracing[0]] if tracing else [],
        cluster=cluster,
    )
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=config.shutdown_timeout, handle_signals=False
    )
    await runner.setup()

    def on_limit(listener: str, limit: str) -> None:
        metrics.connection_limits.labels(listener, limit).inc()

    for listener in ("webhook", "health"):  # zeros from the start, for rate()
        for limit in LIMIT_NAMES:
            metrics.connection_limits.labels(listener, limit)

    trimmer = HeapTrimmer()
    gate = ConnectionGate("webhook", config.limits, on_limit=on_limit, trimmer=trimmer)
    # Probes and scrapes answer at once: only the connection limits apply there, with
    # a cap of their own, so neither port can crowd out the other.
    health_limits = replace(
        config.limits,
        max_connections=min(config.limits.max_connections, HEALTH_MAX_CONNECTIONS),
    )
    health_gate = ConnectionGate(
        "health", health_limits, cap_in_flight=False, on_limit=on_limit, trimmer=trimmer
    )
    await LimitedSite(
        runner, sock, gate=gate, ssl_context=ssl_context, backlog=LISTEN_BACKLOG
    ).start()
    health = create_health_app(
        state=state,
        metrics=metrics,
        store=store,
        cluster=cluster.status if cluster else None,
        duties=duties.report if duties else None,
    )
    health_runner = web.AppRunner(health, access_log=None, handle_signals=False)
    await health_runner.setup()
    await LimitedSite(health_runner, health_sock, gate=health_gate, backlog=LISTEN_BACKLOG).start()
    tasks = [asyncio.create_task(store.watch(config.policy_poll_interval))]
    tasks.extend(asyncio.create_task(coro) for coro in extra_tasks or [])
    if cluster is not None:
        # Ready at once: until the view is synced, decisions fall back to the pod spec.
        tasks.append(asyncio.create_task(cluster.run()))
    if reports is not None:
        tasks.append(asyncio.create_task(reports.run()))
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
        gates=[gate, health_gate],
        trimmer=trimmer,
        cluster=cluster,
        reports=reports,
    )


def _cluster_watch(config: ServerConfig, metrics: Metrics, store: PolicyStore) -> ClusterWatch:
    """The cluster view of ``serve --cluster``, reported in metrics, watching ConfigMaps
    and Secrets only while the policy in force judges env taken from them (its threads
    start with :meth:`ClusterWatch.run`)."""
    from kubernetes import client

    from webhook.cluster.client import api_client

    # The client's stubs know only its models; the raw list calls take plain kwargs.
    access = api_client(config.cluster_kubeconfig)
    core: Any = client.CoreV1Api(access)
    watch = ClusterWatch(core, settings=config.cluster_settings, pods=config.reports is not None)
    watch.api_client = access
    policy = store.policy
    watch.want("configmaps", policy.config_map_env)
    watch.want("secrets", policy.secret_env)

    def on_reload(ok: bool) -> None:
        if ok:
            watch.want("configmaps", store.policy.config_map_env)
            watch.want("secrets", store.policy.secret_env)

    store.listeners.append(on_reload)
    watch.on_event = metrics.track_cluster(
        synced=lambda: watch.view.synced,
        age=watch.age,
        objects=watch.objects,
        kinds=watch.kind_names,
    )
    return watch


async def serve_forever(
    config: ServerConfig,
    *,
    ssl_context: ssl.SSLContext,
    extra_tasks: list[Any] | None = None,
    certificate: CertificateReloader | None = None,
    store: PolicyStore | None = None,
    leading: Callable[[], bool] | None = None,
    duties: DutyStatus | None = None,
    held: Coroutine[Any, Any, None] | None = None,
    parent_sentinel: int | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (or until the parent that supervises this worker is
    gone); SIGHUP reloads the policy. ``held`` runs the duties in this process: if it
    fails, the process stops with status 1. The exit status."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    code = 0

    def stop_with(status: int) -> None:
        nonlocal code
        code = max(code, status)
        stop.set()

    service = await start(
        config,
        ssl_context=ssl_context,
        extra_tasks=extra_tasks,
        store=store,
        leading=leading,
        duties=duties,
    )
    duty_task = None
    if held is not None:
        duty_task = asyncio.create_task(held)
        duty_task.add_done_callback(exit_on_failure(stop_with))
    if certificate is not None:
        service.metrics.track_certificate(lambda: certificate.not_after.timestamp())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, service.store.reload)
    if parent_sentinel is not None:
        # A worker outliving its parent would serve on with no one holding the duties.
        loop.add_reader(parent_sentinel, stop_with, 1)
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
    if parent_sentinel is not None:
        loop.remove_reader(parent_sentinel)
    log.info("stopping: draining %d in-flight requests", service.state.in_flight)
    await service.stop()
    if duty_task is not None:
        # After the drain: a leader gives its Lease up last.
        await _finish(duty_task)
    log.info("stopped after %d answers", service.state.served)
    return code


async def _finish(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it; a failure was reported when it happened."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


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
        # Written there by webhook.certs.selfmanaged before the server starts.
        paths = CertPaths.in_directory(config.cert_dir)
        return CertificateReloader(paths.cert_file, paths.key_file, client_ca_file=config.client_ca)
    paths = ensure_dev_certificates(config.cert_dir, extra_sans=config.sans)
    return CertificateReloader(paths.cert_file, paths.key_file, client_ca_file=config.client_ca)


def _serve_process(config: ServerConfig) -> int:
    """One process that serves and, with ``--self-managed``, holds the duties."""
    tune_malloc()
    return serving_loop.run(_serve(config, hold_duties=True))


def _worker(
    config: ServerConfig, log_level: int, duties: DutyStatus | None, writes_reports: bool
) -> None:
    """A supervised worker: it serves; the parent holds the duties."""
    # A forked worker starts with logging unconfigured: log like the parent.
    logging.basicConfig(level=log_level, stream=sys.stderr, format=LOG_FORMAT)
    tune_malloc()
    parent = multiprocessing.parent_process()
    code = serving_loop.run(
        _serve(
            config,
            hold_duties=False,
            duties=duties,
            parent_sentinel=parent.sentinel if parent is not None else None,
            writes_reports=writes_reports,
        )
    )
    sys.exit(code)


async def _serve(
    config: ServerConfig,
    *,
    hold_duties: bool,
    duties: DutyStatus | None = None,
    parent_sentinel: int | None = None,
    writes_reports: bool = True,
) -> int:
    store = PolicyStore(config.policy)
    # Reports are written by one process of each replica (a supervised replica's worker
    # 0, which its replacement takes over), and only while the replica leads the Lease
    # (without --self-managed: always; run one replica for reports). The other processes
    # of a replica never write: they neither watch pods nor scan.
    if not writes_reports:
        config = replace(config, reports=None)
    leading: Callable[[], bool] = lambda: True  # noqa: E731
    held = None
    if config.self_managed is not None and hold_duties:
        manager, duties = await _prepare_duties(config, config.self_managed, store)
        held = hold(duties, manager)
        leading = lambda: manager.is_leader  # noqa: E731
    elif duties is not None and "certificates" in duties.names:
        # The parent holds the Lease: its state comes through the shared block.
        leading = duties.leader
    reloader = tls_for(config)
    return await serve_forever(
        config,
        ssl_context=reloader.server_context,
        extra_tasks=[reloader.watch(config.cert_poll_interval)],
        certificate=reloader,
        store=store,
        leading=leading,
        duties=duties,
        held=held,
        parent_sentinel=parent_sentinel,
    )


async def _prepare_duties(
    config: ServerConfig, self_managed: SelfManagedConfig, store: PolicyStore
) -> tuple[SelfManagedCertificates, DutyStatus]:
    """The certificate manager, with scope keeping when configured, once the first
    serving pair is on disk (the server loads it at start)."""
    from webhook.certs.selfmanaged import SelfManagedCertificates

    manager = SelfManagedCertificates.from_config(self_managed, cert_dir=config.cert_dir)
    names: tuple[str, ...] = ("certificates",)
    if self_managed.keep_scope:
        _keep_scope(manager, store, self_managed)
        names += ("scope",)
    await manager.ensure_ready(self_managed.ready_timeout)
    return manager, DutyStatus.create(names)


def _keep_scope(
    manager: SelfManagedCertificates, store: PolicyStore, config: SelfManagedConfig
) -> None:
    """The leader keeps the webhooks' matchConditions and the CEL policies rendered from
    the policy in force, and re-renders them at once when a new policy takes over."""
    from webhook.install.reconcile import ScopeKeeper

    keeper = ScopeKeeper(
        manager.api_client, webhook_config=config.webhook_config, namespace=config.namespace
    )
    manager.duties.append(lambda: keeper.reconcile(store.policy, text=store.text()))

    def on_reload(ok: bool) -> None:
        if ok:
            manager.wake()

    store.listeners.append(on_reload)


async def _supervise(config: ServerConfig) -> int:
    """The parent of ``--workers N``: holds the duties, keeps N workers serving."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    code = 0

    def stop_with(status: int) -> None:
        nonlocal code
        code = max(code, status)
        stop.set()

    tasks: list[asyncio.Task[None]] = []
    duties: DutyStatus | None = None
    store: PolicyStore | None = None
    if config.self_managed is not None:
        # Scope keeping re-renders when the policy changes: the parent watches it too.
        store = PolicyStore(config.policy)
        manager, duties = await _prepare_duties(config, config.self_managed, store)
        held = asyncio.create_task(hold(duties, manager))
        held.add_done_callback(exit_on_failure(stop_with))
        tasks += [held, asyncio.create_task(store.watch(config.policy_poll_interval))]
    else:
        tls_for(config)  # development certificates: generated once, before any worker
    shared = replace(config, reuse_port=True)
    # A port held by another program fails here, in one line, not once per worker.
    for probe in _listen_both(shared):
        probe.close()
    level = logging.getLogger().getEffectiveLevel()
    context = multiprocessing.get_context("forkserver")
    preload = [__name__]
    if config.cluster:
        # The view's client too, or each replacement would pay its imports before it
        # listens: ~0.5 s for the client, ~0.4 s more for CoreV1Api's ~250 lazy modules.
        preload += [
            "webhook.cluster.watch",
            "webhook.cluster.client",
            "kubernetes.client",
            "kubernetes.client.api.core_v1_api",
        ]
    context.set_forkserver_preload(preload)
    supervisor = Supervisor(
        context=context,
        target=_worker,
        args=lambda index: (shared, level, duties, index == 0),
        count=config.workers,
    )

    def hang_up() -> None:
        if store is not None:
            store.reload()
        supervisor.signal_all(signal.SIGHUP)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hang_up)
    supervisor.start()
    log.info("supervising %d workers, pid %d", config.workers, os.getpid())
    broken = asyncio.create_task(supervisor.broken.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([broken, stopped], return_when=asyncio.FIRST_COMPLETED)
    if broken.done():
        code = 1
    for waiter in (broken, stopped):
        waiter.cancel()
    # The workers drain first; then the duties stop, and a leader gives its Lease up.
    code = max(code, await supervisor.stop(grace=config.shutdown_timeout + 5))
    for task in tasks:
        await _finish(task)
    return code


def run(config: ServerConfig) -> int:
    """Serve in this process, or supervise ``workers`` processes sharing the ports."""
    if config.workers <= 1:
        if config.self_managed is None:
            tls_for(config)
        return _serve_process(config)
    return serving_loop.run(_supervise(config))
