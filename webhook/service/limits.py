"""Connection and request limits of the service's listeners.

The validating webhook fails closed, so a client that holds connections open can stop
pod creation cluster-wide. Every listener (the HTTPS webhook port and the plain health
port, each with its own count) therefore bounds, per worker process:

- the TLS handshake: it must finish within ``tls_handshake_timeout`` of the accept;
- the request headers: complete within ``header_timeout`` of the connection being
  ready (after the handshake; a plain connection from its accept) or, on a kept-alive
  connection, of the first byte of the next request; and at most
  :data:`MAX_HEADER_BYTES` of them. A connection over either is reset;
- idle keep-alive: ``idle_timeout`` from a response to the next request's complete
  headers (aiohttp's ``keepalive_timeout``), longer than the 90 s after which the
  apiserver's Go client drops an idle connection itself, so that the client always
  closes first and never sends a review into a connection being closed (a POST that
  meets a closed connection is not retried: the review would fail, closed);
- open connections, handshakes included: ``max_connections`` on the HTTPS port,
  :data:`HEALTH_MAX_CONNECTIONS` on the health port. At the cap a new connection
  evicts the one that has waited longest without a request in progress (handshake or
  headers first, then idle keep-alive); it is refused at once, before any TLS work,
  only when every connection has a request in progress. Held connections therefore
  cannot lock the apiserver out: they are the oldest waiting ones, while a real
  request completes its headers within milliseconds of its connect;
- requests in progress: ``max_in_flight``. An answer is computed synchronously once
  the body is in, so the requests in progress are those whose bodies are still
  arriving; over the cap such a request is answered at once with 429, a Kubernetes
  ``Status`` and ``Retry-After: 1``, which the apiserver's client (client-go retries
  429 with ``Retry-After``, up to 10 times, within the webhook's timeout) tries again a
  second later. Queueing it instead would hold its memory and the apiserver's whole
  budget behind the slow bodies that filled the slots, and fail it anyway. A request
  whose body has fully arrived is always answered: that costs less than refusing it.

Memory: asyncio gives every TLS connection a 256 KiB read buffer for its whole life;
here it is :data:`TLS_READ_BUFFER` (one TLS record). That buffer was ~90% of what a
held connection cost (2,000 of them: 58 -> 620 MB); now one costs 40-65 KB. What
connections and abandoned requests leave behind is returned to the OS by
:class:`HeapTrimmer`, and :func:`tune_malloc` gives large buffers (request bodies)
mappings of their own. With the defaults the worst case stays under the Deployment's
256 Mi limit: ~58 MB at rest, 512 x ~65 KB handshaking plus 512 x 32 KiB of headers on
the HTTPS port, 64 on the health port, and 16 bodies of at most 4 MiB in progress
(measured: +67 MB): ~180 MB.

aiohttp has no hooks for these phases, so :class:`_Handler` extends its
``RequestHandler`` and uses three private members (``_request_count``, ``_waiter``,
``_handle_request``); asyncio's ``sslproto.SSLProtocol`` is built directly to size its
buffer. ``tests/service/test_limits.py`` drives every limit through a real server, so
an upgrade that moves them fails there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import socket
import ssl
import struct
import sys
from asyncio import sslproto
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

# The apiserver's headers are well under 2 KiB (a bearer token included); aiohttp's own
# limits (128 headers of 8 KiB each) would let one connection buffer 2 MiB of them.
MAX_HEADER_BYTES: Final = 32 << 10
# One full TLS record. asyncio's 256 KiB default, allocated per connection for its
# whole life, made up ~90% of what each held connection cost.
TLS_READ_BUFFER: Final = 16 << 10
# Trim the heap once the open connections are this many fewer than their recent peak,
# this long after the drop began (one trim for a whole wave of closes), and at most
# once per interval: a trim pauses the event loop for tens of milliseconds.
TRIM_AFTER_DROP: Final = 256
# ... or once requests abandoned before their body was in (client reset, body timeout,
# 429) had received this much: each is kept by a reference cycle through its exception
# until a full collection, its TLS-record-sized chunks fragmenting the heap meanwhile.
TRIM_AFTER_ABANDONED: Final = 16 << 20
TRIM_DELAY: Final = 1.0
TRIM_INTERVAL: Final = 5.0
RETRY_AFTER: Final = 1  # seconds; client-go waits whole seconds, 0 would retry in a loop
# Probes and scrapes need a handful of connections; the health port gets no more than this.
HEALTH_MAX_CONNECTIONS: Final = 64
# Allocations this large get mappings of their own, unmapped when freed (glibc's
# M_MMAP_THRESHOLD, -3 for mallopt). glibc's default threshold starts at 128 KiB but
# rises to the size of every such block freed, so after one 4 MiB request body later
# ones grow by copying inside the heap and stay there until a trim (waves of 16 pending
# 4 MiB bodies peak at 137 MB that way, 124 MB with the threshold fixed). Answers,
# TLS reads and everything per connection stay below it.
MMAP_THRESHOLD: Final = 256 << 10
_M_MMAP_THRESHOLD: Final = -3

# Limit names, as the gpushare_connection_limits_total metric labels them.
LIMIT_NAMES: Final = (
    "max_connections",
    "evicted",
    "tls_handshake_timeout",
    "header_timeout",
    "header_bytes",
    "max_in_flight",
)

_RESET: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
_HANDSHAKE, _HEADERS, _BUSY, _IDLE = range(4)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per listener and process; ``serve`` documents each as a flag with these defaults."""

    tls_handshake_timeout: float = 5.0
    header_timeout: float = 5.0
    idle_timeout: float = 120.0
    max_connections: int = 512
    max_in_flight: int = 16

    def __post_init__(self) -> None:
        for name in ("tls_handshake_timeout", "header_timeout", "idle_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds")
        for name in ("max_connections", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


def _reset(transport: asyncio.BaseTransport) -> None:
    """Close at once with a RST: no lingering TLS shutdown, no TIME_WAIT here."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    if isinstance(transport, asyncio.Transport):
        transport.abort()
    else:
        transport.close()


def _libc_function(name: str, *argtypes: type[ctypes._SimpleCData[Any]]) -> Any:
    """A C library function of this process, or None (not Linux, or not in its libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: the C library's malloc
    except OSError:
        return None
    function = getattr(libc, name, None)
    if function is not None:
        function.argtypes = list(argtypes)
        function.restype = ctypes.c_int
    return function


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` (once per serving process)."""
    mallopt = _libc_function("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class HeapTrimmer:
    """Returns freed memory to the OS after a wave of connections or bytes has gone.

    Two things keep it otherwise. Every closed connection leaves its raw transport in
    a reference cycle (asyncio's transport holds a bound method of itself), freed only
    by a full collection, which a quiet server may not run for a long time; and glibc
    only gives back memory at the top of its heap, so buffers freed between
    longer-lived chunks stay resident until ``malloc_trim`` releases their pages.

    When the open count has dropped ``drop`` below its peak, or requests abandoned
    mid-body had received ``abandoned`` bytes: ``gc.collect()`` (15-35 ms at rest, up
    to 80 ms with 2,000 connections' garbage), then ``malloc_trim(0)`` (a few ms), on
    the event loop. ``delay`` after the trigger, so that a whole wave goes at once, and
    at most once per ``interval``. Normal traffic (kept-alive connections, complete
    requests) never triggers it.
    """

    def __init__(
        self,
        *,
        drop: int = TRIM_AFTER_DROP,
        abandoned: int = TRIM_AFTER_ABANDONED,
        delay: float = TRIM_DELAY,
        interval: float = TRIM_INTERVAL,
    ) -> None:
        self._trim: Callable[[int], int] | None = _libc_function("malloc_trim", ctypes.c_size_t)
        self._drop = drop
        self._abandoned = abandoned
        self._delay = delay
        self._interval = interval
        self._last = -interval
        self._handle: asyncio.TimerHandle | None = None
        self.open = 0
        self.peak = 0
        self.abandoned_bytes = 0
        self.trims = 0

    def opened(self) -> None:
        self.open += 1
        if self.open > self.peak:
            self.peak = self.open

    def closed(self) -> None:
        self.open -= 1
        if self.peak - self.open >= self._drop:
            self._schedule()

    def abandoned(self, size: int) -> None:
        self.abandoned_bytes += size
        if self.abandoned_bytes >= self._abandoned:
            self._schedule()

    def _schedule(self) -> None:
        if self._handle is None:
            loop = asyncio.get_running_loop()
            when = max(loop.time() + self._delay, self._last + self._interval)
            self._handle = loop.call_at(when, self._run)

    def _run(self) -> None:
        self._handle = None
        self._last = asyncio.get_running_loop().time()
        self.peak = self.open
        self.abandoned_bytes = 0
        gc.collect()
        if self._trim is not None:
            self._trim(0)
        self.trims += 1

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _Slot:
    """One accepted connection: its phase, its deadline, its place in the eviction order."""

    __slots__ = ("closed", "deadline", "gate", "header_bytes", "phase", "transport")

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate
        self.transport: asyncio.BaseTransport | None = None
        self.phase = _HANDSHAKE
        self.deadline: asyncio.TimerHandle | None = None
        self.header_bytes = 0
        self.closed = False

    def attach(self, transport: asyncio.BaseTransport, *, tls: bool) -> None:
        """The accepted socket's transport (TLS: before the handshake)."""
        if self.closed:  # evicted between the accept and this call
            _reset(transport)
            return
        self.transport = transport
        if tls:
            self._arm(self.gate.limits.tls_handshake_timeout, "tls_handshake_timeout")

    def expect_headers(self) -> None:
        """Ready for a request: the handshake is done, or its first byte has arrived."""
        if self.closed:
            return
        self.phase = _HEADERS
        self.header_bytes = 0
        gate = self.gate
        gate._idle.pop(self, None)
        gate._waiting[self] = None
        self._arm(gate.limits.header_timeout, "header_timeout")

    def header_data(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > MAX_HEADER_BYTES:
            self.cut("header_bytes")

    def busy(self) -> None:
        """A request's headers are in: no deadline until it has been answered."""
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.phase = _BUSY
        self.gate._waiting.pop(self, None)
        self.gate._idle.pop(self, None)

    def idle(self) -> None:
        """Answered; kept alive until the next request (aiohttp's keep-alive timer)."""
        if self.closed or self.phase != _BUSY:
            return
        self.phase = _IDLE
        self.gate._idle[self] = None

    def _arm(self, delay: float, limit: str) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = asyncio.get_running_loop().call_later(delay, self.cut, limit)

    def cut(self, limit: str | None) -> None:
        """Reset the connection now; ``limit`` names the limit it broke (for the metric)."""
        if self.closed:
            return
        if limit is not None:
            self.gate.hit(limit)
        transport = self.transport
        self.release()
        if transport is not None:
            _reset(transport)

    def release(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.transport = None
        self.gate._forget(self)


class ConnectionGate:
    """One listener's connections: the cap, the eviction order, requests in progress."""

    def __init__(
        self,
        name: str,
        limits: Limits,
        *,
        cap_in_flight: bool = True,
        on_limit: Callable[[str, str], None] | None = None,
        trimmer: HeapTrimmer | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.max_in_flight = limits.max_in_flight if cap_in_flight else 0
        self.in_flight = 0
        self._on_limit = on_limit
        self._trimmer = trimmer
        self._slots: set[_Slot] = set()
        # Oldest first: handshakes and headers still to come, then idle keep-alive.
        self._waiting: OrderedDict[_Slot, None] = OrderedDict()
        self._idle: OrderedDict[_Slot, None] = OrderedDict()

    @property
    def open(self) -> int:
        return len(self._slots)

    def hit(self, limit: str) -> None:
        if self._on_limit is not None:
            self._on_limit(self.name, limit)

    def abandoned(self, size: int) -> None:
        if self._trimmer is not None:
            self._trimmer.abandoned(size)

    def admit(self) -> _Slot | None:
        """A slot for a connection just accepted, or None when it must be refused."""
        if len(self._slots) >= self.limits.max_connections:
            tier = self._waiting or self._idle
            if not tier:
                self.hit("max_connections")
                return None
            next(iter(tier)).cut("evicted")
        slot = _Slot(self)
        self._slots.add(slot)
        self._waiting[slot] = None
        if self._trimmer is not None:
            self._trimmer.opened()
        return slot

    def _forget(self, slot: _Slot) -> None:
        self._slots.discard(slot)
        self._waiting.pop(slot, None)
        self._idle.pop(slot, None)
        if self._trimmer is not None:
            self._trimmer.closed()

    def close(self) -> None:
        """Reset whatever is still open (after the runner's own graceful shutdown)."""
        for slot in list(self._slots):
            slot.cut(None)


_TOO_MANY: Final = orjson.dumps(
    {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": 429,
        "reason": "TooManyRequests",
        "message": "too many admission requests in progress on this webhook replica; retry",
        "details": {"retryAfterSeconds": RETRY_AFTER},
    }
)


async def _too_many_requests(_: BaseRequest) -> StreamResponse:
    return web.Response(
        status=429,
        body=_TOO_MANY,
        content_type="application/json",
        headers={"Retry-After": str(RETRY_AFTER)},
    )


class _Handler(RequestHandler):
    """aiohttp's protocol, telling its slot when headers start, end and are answered."""

    __slots__ = ("_slot",)

    def __init__(self, manager: web.Server, *, slot: _Slot, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._slot = slot

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        slot = self._slot
        if slot.closed:  # evicted between the accept and now
            _reset(transport)
        elif slot.transport is None:  # plain TCP: the socket's own transport
            slot.attach(transport, tls=False)
        super().connection_made(transport)
        slot.expect_headers()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._slot.release()
        super().connection_lost(exc)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # A client gone mid-request (reset while its body was arriving) is no server
        # error: a traceback for each would let any client flood the log.
        if self.transport is None and isinstance(kw.get("exc_info"), ConnectionError):
            self.logger.debug(*args, **kw)
            return
        super().log_exception(*args, **kw)

    def data_received(self, data: bytes) -> None:
        count = self._request_count
        super().data_received(data)
        slot = self._slot
        if self._request_count != count:
            slot.busy()
        elif slot.phase == _HEADERS:
            slot.header_data(len(data))
        elif slot.phase == _IDLE and data:
            waiter = self._waiter
            # Waiting for the next request (not reading the rest of an answered one).
            if waiter is not None and not waiter.done():
                slot.expect_headers()
                slot.header_data(len(data))

    async def _handle_request(
        self,
        request: BaseRequest,
        start_time: float | None,
        request_handler: Callable[[BaseRequest], Awaitable[StreamResponse]],
    ) -> tuple[StreamResponse, bool]:
        slot = self._slot
        gate = slot.gate
        slot.busy()
        gate.in_flight += 1
        try:
            if 0 < gate.max_in_flight < gate.in_flight and not request.content.is_eof():
                gate.hit("max_in_flight")
                request_handler = _too_many_requests
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            gate.in_flight -= 1
            slot.idle()
            body = request.content
            if not body.is_eof():
                gate.abandoned(body.total_bytes)


class _TLSProtocol(sslproto.SSLProtocol):
    """asyncio's TLS layer with a one-record read buffer, counted by its slot."""

    max_size = TLS_READ_BUFFER

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        app: _Handler,
        context: ssl.SSLContext,
        slot: _Slot,
    ) -> None:
        timeout = slot.gate.limits.tls_handshake_timeout
        # The two ignores: typeshed wants a Future and an int where asyncio itself passes
        # None (no one awaits the handshake) and float seconds (loop._make_ssl_transport).
        super().__init__(
            loop,
            app,
            context,
            None,  # type: ignore[arg-type]
            server_side=True,
            # The slot's own timer cuts first and counts it; this one is a backstop.
            ssl_handshake_timeout=timeout + 1,  # type: ignore[arg-type]
            # A peer that never answers our close_notify keeps nothing for long.
            ssl_shutdown_timeout=timeout,
        )
        self._slot = slot

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._slot.attach(transport, tls=True)
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._slot.release()
        super().connection_lost(exc)


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _reset(transport)


class LimitedSite(web.BaseSite):
    """A listening socket served under a :class:`ConnectionGate`.

    ``web.SockSite`` with the gate in front of every accept; TLS, when given a context,
    is layered here rather than by ``create_server`` so that a refused connection costs
    no handshake and the TLS layer gets its smaller buffer. The socket is used as given
    (``SO_REUSEPORT`` included); :meth:`stop` closes it like any site.
    """

    __slots__ = ("_gate", "_name", "_sock")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        *,
        gate: ConnectionGate,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._sock = sock
        self._gate = gate
        host, port = sock.getsockname()[:2]
        self._name = f"{'https' if ssl_context else 'http'}://{host}:{port}"

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None  # BaseSite refuses a runner that is not set up
        gate = self._gate
        context = self._ssl_context
        idle = gate.limits.idle_timeout

        def accept() -> asyncio.BaseProtocol:
            slot = gate.admit()
            if slot is None:
                return _Refused()
            # No access log: the audit log is the service's record of every review.
            handler = _Handler(
                server, slot=slot, loop=loop, keepalive_timeout=idle, access_log=None
            )
            if context is None:
                return handler
            return _TLSProtocol(loop, handler, context, slot)

        self._server = await loop.create_server(accept, sock=self._sock, backlog=self._backlog)
