"""Held connections against ``gpushare-webhook serve``: the server's RSS before, during and after.

For each kind of held connection it starts ``python -m webhook serve`` in a temporary
directory (development certificates, audit log to a file), then opens ``--count``
connections of that kind from this process and holds them for ``--hold`` seconds:

- ``idle-tls``: TCP connect and a complete TLS handshake, then nothing;
- ``trickle``: TLS, then ``POST /validate HTTP/1.1`` and one more header line every
  second, never the blank line that ends the headers;
- ``silent-tcp``: a TCP connect to the HTTPS port and nothing at all (no ClientHello).

It prints the server's RSS (``VmRSS``): before (after 20 warm-up reviews), at its
peak while the connections are opened and held, at the end of the hold, when the
server has let go of all of them (this side aborts whatever is left) and ``--settle``
seconds later ("after": the server trims its heap at most every 5 s). Also how many
connections the server kept (its open descriptors above the warm state, from
``/proc/PID/fd``) and how many this side still had open at the end of the hold; and,
measured from a thread during the opening and the hold, the latency of legitimate
``/validate`` reviews, on a new TLS connection each time and on one keep-alive
connection opened before the attack. ``--repeat N`` runs each kind N times and prints
medians. Extra ``serve`` flags go through ``--server-arg``
(``--server-arg=--max-connections=100000``); ``--checkout DIR`` runs another
checkout's ``webhook`` package (before/after: ``git archive HEAD | tar -x -C
/tmp/before``, whose ``serve`` may not know the new flags). Only 127.0.0.1 is ever
connected to. A printout, not a test: nothing fails on a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import logging
import os
import resource
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # the only address this benchmark ever connects to
KINDS = ("idle-tls", "trickle", "silent-tcp")
# Connections are opened in batches with a pause between them, so that the kernel's
# accept queue (aiohttp listens with a backlog of 128) never overflows: a connect that
# overflows it completes here but is never accepted there, and would be counted wrong.
OPEN_BATCH = 100
OPEN_PAUSE = 0.05
PROBE_INTERVAL = 0.2  # seconds between two legitimate reviews while connections are held


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def review_body() -> bytes:
    sys.path.insert(0, str(ROOT))
    from webhook.dev.testing import admission_review

    pod = yaml.safe_load((ROOT / "tests" / "manifests" / "plain-pod.yaml").read_text())
    return orjson.dumps(admission_review(pod, uid="bench", namespace="default"))


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Server:
    """``python -m webhook serve`` on loopback; killed on exit whatever happens."""

    def __init__(self, workdir: Path, checkout: Path, extra: Sequence[str]) -> None:
        self.port = free_port()
        self.health_port = free_port()
        self.workdir = workdir
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["PYTHONPATH"] = str(checkout)
        self._err = (workdir / "server.err").open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook",
                "serve",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--health-port",
                str(self.health_port),
                "--audit-log",
                str(workdir / "audit.log"),
                "--log-level",
                "WARNING",
                *extra,
            ],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"server exited:\n{self.log()}")
            try:
                with socket.create_connection((HOST, self.health_port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"server not ready:\n{self.log()}")

    def log(self) -> str:
        return (self.workdir / "server.err").read_text(errors="replace")

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.workdir / "certs" / "ca.crt"))

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._err.close()


# -- legitimate reviews, from a thread, while the connections are held -------------------


def _post(conn: http.client.HTTPSConnection, body: bytes) -> None:
    conn.request(
        "POST",
        "/validate?timeout=3s",
        body=body,
        headers={"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise OSError(f"status {response.status}")


@dataclass
class Probe:
    """New-connection and keep-alive review latencies (ms) and failures, while running."""

    new_ms: list[float] = field(default_factory=list)
    kept_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, server: Server, body: bytes) -> None:
        context = server.context()
        kept = http.client.HTTPSConnection(HOST, server.port, context=context, timeout=5)
        _post(kept, body)  # opened before the attack, like the apiserver's pooled connection
        for _ in range(10_000):  # bounded: the hold ends long before
            if self.stop.wait(PROBE_INTERVAL):
                break
            started = time.perf_counter()
            fresh = http.client.HTTPSConnection(HOST, server.port, context=context, timeout=5)
            try:
                _post(fresh, body)
                self.new_ms.append((time.perf_counter() - started) * 1000)
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(f"new: {type(exc).__name__}: {exc}")
            finally:
                fresh.close()
            started = time.perf_counter()
            try:
                _post(kept, body)
                self.kept_ms.append((time.perf_counter() - started) * 1000)
            except (OSError, http.client.HTTPException) as exc:
                self.failures.append(f"keep-alive: {type(exc).__name__}: {exc}")
                kept.close()
                kept = http.client.HTTPSConnection(HOST, server.port, context=context, timeout=5)
        kept.close()


# -- the held connections ---------------------------------------------------------------


@dataclass
class Held:
    opened: int = 0
    refused: int = 0
    open_now: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    watchers: list[asyncio.Task[None]] = field(default_factory=list)


async def _watch(reader: asyncio.StreamReader, held: Held) -> None:
    """Until the server closes the connection (or this side does)."""
    try:
        for _ in range(1_000_000):  # bounded; a held connection gets no data anyway
            if not await reader.read(4096):
                break
    except (OSError, ssl.SSLError):
        pass
    finally:
        held.open_now -= 1


async def _open_one(kind: str, server: Server, context: ssl.SSLContext, held: Held) -> None:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                HOST,
                server.port,
                ssl=None if kind == "silent-tcp" else context,
                server_hostname=None if kind == "silent-tcp" else "localhost",
            ),
            timeout=10,
        )
    except (OSError, ssl.SSLError, TimeoutError):
        held.refused += 1
        return
    held.opened += 1
    held.open_now += 1
    held.writers.append(writer)
    if kind == "trickle":
        writer.write(b"POST /validate HTTP/1.1\r\nHost: localhost\r\n")
    held.watchers.append(asyncio.create_task(_watch(reader, held)))


async def _trickle(held: Held, stop: asyncio.Event) -> None:
    for line in range(100_000):  # one header line a second per connection, until stopped
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        if stop.is_set():
            return
        for writer in held.writers:
            if not writer.is_closing():
                writer.write(b"X-Trickle-%d: 1\r\n" % line)


@dataclass
class Figures:
    kind: str
    rss_before: float
    rss_peak: float
    rss_end_of_hold: float
    rss_closed: float
    rss_after: float
    server_kept_peak: int
    server_kept_end: int
    opened: int
    refused: int
    client_open_end: int
    open_seconds: float
    new_ms: list[float]
    kept_ms: list[float]
    failures: list[str]


async def _hold(
    kind: str, server: Server, count: int, hold: float, body: bytes, settle: float
) -> Figures:
    context = server.context()
    for _ in range(20):  # warm up: the steady state of a server that has answered reviews
        conn = http.client.HTTPSConnection(HOST, server.port, context=context, timeout=5)
        await asyncio.to_thread(_post, conn, body)
        conn.close()
    await asyncio.sleep(1.0)
    rss_before = server.rss_mib()
    fds_before = server.fds()

    probe = Probe()
    prober = threading.Thread(target=probe.run, args=(server, body), daemon=True)
    prober.start()
    held = Held()

    async def batches() -> None:
        for first in range(0, count, OPEN_BATCH):
            size = min(OPEN_BATCH, count - first)
            await asyncio.gather(*(_open_one(kind, server, context, held) for _ in range(size)))
            await asyncio.sleep(OPEN_PAUSE)

    rss_peak = rss_before
    kept_peak = 0
    started = time.monotonic()
    opening = asyncio.ensure_future(batches())
    stop_trickle = asyncio.Event()
    if kind == "trickle":
        trickler = asyncio.create_task(_trickle(held, stop_trickle))
    for _ in range(int(600 / 0.25)):  # sample while opening, at most 10 minutes
        if opening.done():
            break
        await asyncio.sleep(0.25)
        rss_peak = max(rss_peak, server.rss_mib())
        kept_peak = max(kept_peak, server.fds() - fds_before)
    await opening
    open_seconds = time.monotonic() - started
    hold_end = time.monotonic() + hold
    for _ in range(int(hold / 0.25) + 1):
        if time.monotonic() >= hold_end:
            break
        await asyncio.sleep(0.25)
        rss_peak = max(rss_peak, server.rss_mib())
        kept_peak = max(kept_peak, server.fds() - fds_before)
    rss_end = server.rss_mib()
    kept_end = server.fds() - fds_before
    client_open_end = held.open_now
    probe.stop.set()
    await asyncio.to_thread(prober.join, 30)

    stop_trickle.set()
    if kind == "trickle":
        await trickler
    for writer in held.writers:
        writer.transport.abort()
    await asyncio.gather(*held.watchers, return_exceptions=True)
    for _ in range(100):  # until the server has let go of them, at most 10 s
        if server.fds() <= fds_before + 1:
            break
        await asyncio.sleep(0.1)
    rss_closed = server.rss_mib()
    await asyncio.sleep(settle)
    return Figures(
        kind=kind,
        rss_before=rss_before,
        rss_peak=rss_peak,
        rss_end_of_hold=rss_end,
        rss_closed=rss_closed,
        rss_after=server.rss_mib(),
        server_kept_peak=kept_peak,
        server_kept_end=kept_end,
        opened=held.opened,
        refused=held.refused,
        client_open_end=client_open_end,
        open_seconds=open_seconds,
        new_ms=probe.new_ms,
        kept_ms=probe.kept_ms,
        failures=probe.failures,
    )


def run_kind(kind: str, args: argparse.Namespace, body: bytes) -> Figures:
    with tempfile.TemporaryDirectory(prefix="bench-conn-") as tmp:
        server = Server(Path(tmp), args.checkout, args.server_arg)
        try:
            server.wait_ready()
            return asyncio.run(_hold(kind, server, args.count, args.hold, body, args.settle))
        finally:
            server.stop()


# -- report -----------------------------------------------------------------------------


def _ms(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"{statistics.median(ordered):.1f}/{p95:.1f}/{ordered[-1]:.1f}"


def _med(values: Sequence[float]) -> float:
    return statistics.median(values)


def report(kind: str, runs: Sequence[Figures]) -> None:
    n = len(runs)
    new = [v for r in runs for v in r.new_ms]
    kept = [v for r in runs for v in r.kept_ms]
    failures = [f for r in runs for f in r.failures]
    label = f"{kind} (median of {n})" if n > 1 else kind
    print(f"\n{label}")
    print(
        f"  RSS MiB    before {_med([r.rss_before for r in runs]):6.1f}"
        f"   peak {_med([r.rss_peak for r in runs]):6.1f}"
        f"   end of hold {_med([r.rss_end_of_hold for r in runs]):6.1f}"
        f"   all closed {_med([r.rss_closed for r in runs]):6.1f}"
        f"   after {_med([r.rss_after for r in runs]):6.1f}"
    )
    print(
        f"  connections opened {_med([r.opened for r in runs]):.0f}"
        f" refused {_med([r.refused for r in runs]):.0f}"
        f" in {_med([r.open_seconds for r in runs]):.1f} s;"
        f" server kept peak {_med([r.server_kept_peak for r in runs]):.0f},"
        f" end of hold {_med([r.server_kept_end for r in runs]):.0f};"
        f" still open here at end of hold {_med([r.client_open_end for r in runs]):.0f}"
    )
    print(
        f"  legitimate /validate ms (median/p95/max): new connection {_ms(new)} ({len(new)}),"
        f" keep-alive {_ms(kept)} ({len(kept)}), failures {len(failures)}"
    )
    for failure in sorted(set(failures))[:5]:
        print(f"    {failure}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=2000, help="connections per kind")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds to hold them")
    parser.add_argument(
        "--settle",
        type=float,
        default=7.0,
        help="seconds from the server letting go of them to 'after' (default 7: the "
        "server trims its heap at most every 5 s)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per kind (medians)")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}"
    )
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra serve flag (repeatable)"
    )
    parser.add_argument(
        "--checkout", type=Path, default=ROOT, help="the checkout whose webhook package serves"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Thousands of connections cut by the server: asyncio's per-connection error logs
    # would drown the figures.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown kinds: {', '.join(sorted(unknown))}")
    limit = raise_fd_limit()
    if limit < args.count + 200:
        raise SystemExit(f"open-file limit {limit} is too low for --count {args.count}")
    body = review_body()
    print(
        f"{args.count} connections per kind, held {args.hold:.0f} s, checkout {args.checkout},"
        f" serve flags: {' '.join(args.server_arg) or '(defaults)'}"
    )
    for kind in kinds:
        runs = [run_kind(kind, args, body) for _ in range(args.repeat)]
        report(kind, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
