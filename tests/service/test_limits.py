"""Connection and request limits, against a real ``serve`` process on loopback.

Raw sockets play the clients a security review found holding the server open (trickled
headers, silent TCP, half-done and idle TLS, oversized headers, idle keep-alive, a flood
of connections, slow bodies), with short limits passed as ``serve`` flags. Every wait
is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.paths import MANIFESTS
from webhook.cli import build_parser
from webhook.dev.testing import admission_review
from webhook.service.limits import MAX_HEADER_BYTES, HeapTrimmer, Limits

HOST = "127.0.0.1"
# Timers fire on the server's clock, which starts after ours: a cut may come up to this
# much later than the limit on a loaded machine, never earlier.
SLACK = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def review_body() -> bytes:
    pod = yaml.safe_load((MANIFESTS / "plain-pod.yaml").read_text())
    return orjson.dumps(admission_review(pod, uid="limits", namespace="default"))


class Server:
    def __init__(self, workdir: Path, tls: dict[str, Path], *flags: str) -> None:
        self.port = free_port()
        self.health_port = free_port()
        self.workdir = workdir
        self.tls_files = tls
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
                "--tls-cert",
                str(tls["cert"]),
                "--tls-key",
                str(tls["key"]),
                "--audit-log",
                str(workdir / "audit.log"),
                *flags,
            ],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited: {self.log()}")
            try:
                with socket.create_connection((HOST, self.health_port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"server not ready: {self.log()}")

    def log(self) -> str:
        return (self.workdir / "server.err").read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._err.close()

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.tls_files["ca"]))

    def connect_tls(self, timeout: float = 5.0) -> ssl.SSLSocket:
        raw = socket.create_connection((HOST, self.port), timeout=timeout)
        return self.context().wrap_socket(raw, server_hostname="localhost")

    def connections(self) -> int:
        """Established connections the server holds on its HTTPS port."""
        inodes: set[str] = set()
        for fd in Path(f"/proc/{self.process.pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[len("socket:[") : -1])
        count = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            established = state == "01"
            count += (
                established and int(local.rsplit(":", 1)[1], 16) == self.port and inode in inodes
            )
        return count

    def wait_connections(self, count: int) -> None:
        for _ in range(100):  # at most 5 s
            if self.connections() == count:
                return
            time.sleep(0.05)
        raise AssertionError(f"server holds {self.connections()} connections, expected {count}")

    def hits(self) -> dict[tuple[str, str], float]:
        url = f"http://{HOST}:{self.health_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:  # loopback http
            text = response.read().decode()
        hits: dict[tuple[str, str], float] = {}
        for labels, value in re.findall(
            r"^gpushare_connection_limits_total\{(.*)\} (\S+)$", text, re.MULTILINE
        ):
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            hits[pairs["listener"], pairs["limit"]] = float(value)
        return hits


def closed_within(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes ``sock`` (reset or EOF); fails after ``limit``."""
    started = time.monotonic()
    sock.settimeout(0.1)
    for _ in range(int(limit / 0.1) + 20):
        try:
            data = sock.recv(4096)
        except TimeoutError:
            if time.monotonic() - started > limit:
                break
            continue
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
            return time.monotonic() - started
        if not data:
            return time.monotonic() - started
    raise AssertionError(f"connection still open after {limit} s")


def still_open(sock: socket.socket, wait: float = 0.3) -> bool:
    sock.settimeout(wait)
    try:
        return bool(sock.recv(1))
    except TimeoutError:
        return True
    except (OSError, ssl.SSLError):
        return False


def request_head(length: int, path: str = "/validate") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def read_response(sock: socket.socket, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    sock.settimeout(timeout)
    data = b""
    for _ in range(1000):  # bounded: a response is a few KB
        if b"\r\n\r\n" in data:
            break
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    for _ in range(1000):
        if len(rest) >= length:
            break
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:length]


def tls_answer(server: Server) -> bytes:
    """What the server sends back to a ClientHello on a new connection (b"" if reset)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    hello = server.context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        hello.do_handshake()
    try:
        with socket.create_connection((HOST, server.port), timeout=5) as sock:
            sock.sendall(outgoing.read())
            sock.settimeout(2)
            return sock.recv(65536)
    except (ConnectionResetError, BrokenPipeError):  # reset before or after the connect
        return b""


def post(sock: socket.socket, body: bytes) -> tuple[int, dict[str, str], bytes]:
    sock.sendall(request_head(len(body)) + body)
    return read_response(sock)


def delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> Any:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


# -- timeouts: one server with short ones, shared --------------------------------------

HANDSHAKE = 1.0
HEADERS = 1.0
IDLE = 1.5


@pytest.fixture(scope="module")
def timeouts(
    tls_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    server = Server(
        tmp_path_factory.mktemp("timeouts"),
        tls_files,
        "--tls-handshake-timeout",
        str(HANDSHAKE),
        "--header-timeout",
        str(HEADERS),
        "--idle-timeout",
        str(IDLE),
    )
    try:
        yield server
    finally:
        server.stop()


def test_trickled_headers_are_cut_after_the_header_timeout(timeouts: Server) -> None:
    before = timeouts.hits()
    sock = timeouts.connect_tls()
    started = time.monotonic()
    sock.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\n")
    lines = 0
    closed_after: float | None = None
    sock.settimeout(0.2)
    for _ in range(int((HEADERS + SLACK) / 0.2) + 5):  # one header line every 0.2 s
        try:
            if not sock.recv(1):
                closed_after = time.monotonic() - started
                break
        except TimeoutError:
            pass
        except (ConnectionResetError, ssl.SSLError):
            closed_after = time.monotonic() - started
            break
        try:
            sock.sendall(b"X-Trickle-%d: 1\r\n" % lines)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            closed_after = time.monotonic() - started
            break
        lines += 1
    sock.close()
    assert closed_after is not None, "trickled headers were never cut"
    assert HEADERS * 0.9 <= closed_after <= HEADERS + SLACK
    assert lines >= 3  # it really was trickling when cut
    assert delta(timeouts.hits(), before) == {("webhook", "header_timeout"): 1.0}


def test_silent_tcp_is_cut_after_the_handshake_timeout(timeouts: Server) -> None:
    before = timeouts.hits()
    with socket.create_connection((HOST, timeouts.port), timeout=5) as sock:
        elapsed = closed_within(sock, HANDSHAKE + SLACK)
    assert elapsed >= HANDSHAKE * 0.9
    assert delta(timeouts.hits(), before) == {("webhook", "tls_handshake_timeout"): 1.0}


def test_handshake_started_and_never_finished_is_cut(timeouts: Server) -> None:
    before = timeouts.hits()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = timeouts.context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    with socket.create_connection((HOST, timeouts.port), timeout=5) as sock:
        sock.sendall(outgoing.read())  # the ClientHello; then never the Finished
        sock.settimeout(2)
        assert sock.recv(65536)  # the server's half of the handshake
        elapsed = closed_within(sock, HANDSHAKE + SLACK)
    assert elapsed <= HANDSHAKE + SLACK
    assert delta(timeouts.hits(), before) == {("webhook", "tls_handshake_timeout"): 1.0}


def test_idle_tls_that_sends_nothing_is_cut_after_the_header_timeout(timeouts: Server) -> None:
    before = timeouts.hits()
    with timeouts.connect_tls() as sock:
        elapsed = closed_within(sock, HEADERS + SLACK)
    assert elapsed >= HEADERS * 0.9
    assert delta(timeouts.hits(), before) == {("webhook", "header_timeout"): 1.0}


def test_silent_health_connection_is_cut_too(timeouts: Server) -> None:
    before = timeouts.hits()
    with socket.create_connection((HOST, timeouts.health_port), timeout=5) as sock:
        elapsed = closed_within(sock, HEADERS + SLACK)
    assert elapsed >= HEADERS * 0.9
    assert delta(timeouts.hits(), before) == {("health", "header_timeout"): 1.0}


def test_headers_over_the_byte_limit_are_cut_at_once(timeouts: Server) -> None:
    before = timeouts.hits()
    lines = b"".join(b"X-Big-%d: %s\r\n" % (i, b"a" * 1000) for i in range(40))
    assert len(lines) > MAX_HEADER_BYTES
    with timeouts.connect_tls() as sock:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError, ssl.SSLError):
            sock.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\n" + lines)
        elapsed = closed_within(sock, HEADERS / 2)
    assert elapsed < HEADERS / 2
    assert delta(timeouts.hits(), before) == {("webhook", "header_bytes"): 1.0}


def test_idle_keepalive_is_cut_and_a_busy_one_is_not(timeouts: Server) -> None:
    body = review_body()
    with timeouts.connect_tls() as sock:
        # Used more often than the idle timeout, for longer than it: kept.
        for _ in range(5):
            status, _, _ = post(sock, body)
            assert status == 200
            time.sleep(IDLE / 3)
        status, headers, _ = post(sock, body)
        assert status == 200
        assert headers.get("connection", "keep-alive").lower() != "close"
        elapsed = closed_within(sock, IDLE + SLACK)
    assert IDLE * 0.9 <= elapsed <= IDLE + SLACK


def test_keepalive_request_trickled_after_idle_is_cut(timeouts: Server) -> None:
    """On a reused connection the header clock starts at the next request's first byte.

    (aiohttp's idle timer, from the previous answer, keeps running until the headers are
    complete too, so a request begun late in the idle allowance is cut at its end.)
    """
    before = timeouts.hits()
    with timeouts.connect_tls() as sock:
        assert post(sock, review_body())[0] == 200
        time.sleep(0.1)
        sock.sendall(b"POST /validate HTTP/1.1\r\n")
        elapsed = closed_within(sock, HEADERS + SLACK)
    assert HEADERS * 0.9 <= elapsed <= HEADERS + SLACK
    assert delta(timeouts.hits(), before) == {("webhook", "header_timeout"): 1.0}


def test_cuts_are_not_logged(timeouts: Server) -> None:
    """Thousands of cut connections must not turn into thousands of log lines."""
    body = review_body()
    for _ in range(3):  # and clients that reset in the middle of their body
        sock = timeouts.connect_tls()
        sock.sendall(request_head(len(body)) + body[:100])
        time.sleep(0.1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    with timeouts.connect_tls() as sock:  # the server is still there, and answers
        assert post(sock, body)[0] == 200
    lines = timeouts.log().splitlines()
    assert len(lines) == 1, lines
    assert "serving https://" in lines[0]


# -- the connection cap ---------------------------------------------------------------

CAP = 20


def test_connection_cap_evicts_held_connections_and_keeps_answering(
    tls_files: dict[str, Path], tmp_path: Path
) -> None:
    server = Server(
        tmp_path,
        tls_files,
        "--max-connections",
        str(CAP),
        "--tls-handshake-timeout",
        "30",
        "--header-timeout",
        "30",
    )
    held: list[socket.socket] = []
    legit: list[ssl.SSLSocket] = []
    try:
        for _ in range(CAP):  # fill the cap with silent connections
            held.append(socket.create_connection((HOST, server.port), timeout=5))
        server.wait_connections(CAP)
        before = server.hits()
        # A legitimate client still gets answers: each new connection evicts the oldest
        # held one instead of being refused, and its kept-alive connections are not
        # evicted while held ones are waiting.
        body = review_body()
        for _ in range(3):
            sock = server.connect_tls()
            legit.append(sock)
            status, _, answer = post(sock, body)
            assert status == 200
            assert orjson.loads(answer)["response"]["allowed"] is True
        assert delta(server.hits(), before) == {("webhook", "evicted"): 3.0}
        evicted = [not still_open(silent, 0.05) for silent in held]
        assert evicted[:3] == [True, True, True]  # oldest first
        assert not any(evicted[3:])
        assert server.connections() <= CAP
        for sock in legit:
            assert post(sock, body)[0] == 200
    finally:
        for conn in [*held, *legit]:
            conn.close()
        server.stop()


def test_connection_cap_refuses_when_every_connection_is_busy(
    tls_files: dict[str, Path], tmp_path: Path
) -> None:
    server = Server(
        tmp_path,
        tls_files,
        "--max-connections",
        str(CAP),
        "--max-in-flight",
        str(CAP * 2),
    )
    body = review_body()
    busy: list[ssl.SSLSocket] = []
    try:
        for _ in range(CAP):  # requests in progress: headers in, body still coming
            sock = server.connect_tls()
            sock.sendall(request_head(len(body)) + body[:10])
            busy.append(sock)
        time.sleep(0.3)  # the server reads the heads
        before = server.hits()
        assert tls_answer(server) == b""  # refused at once: no ServerHello, a reset
        assert delta(server.hits(), before) == {("webhook", "max_connections"): 1.0}
        # Once one has been answered it is idle, and the next new connection evicts it.
        busy[0].sendall(body[10:])
        assert read_response(busy[0])[0] == 200
        with server.connect_tls() as sock:
            assert post(sock, body)[0] == 200
        for sock in busy[1:]:
            sock.sendall(body[10:])
            assert read_response(sock)[0] == 200
    finally:
        for sock in busy:
            sock.close()
        server.stop()


# -- requests in progress -------------------------------------------------------------


def test_requests_over_the_in_flight_cap_get_429_with_a_status(
    tls_files: dict[str, Path], tmp_path: Path
) -> None:
    server = Server(tmp_path, tls_files, "--max-in-flight", "2")
    body = review_body()
    slow: list[ssl.SSLSocket] = []
    try:
        for _ in range(2):
            sock = server.connect_tls()
            sock.sendall(request_head(len(body)) + body[:100])
            slow.append(sock)
        time.sleep(0.3)  # both dispatched, waiting for their bodies
        before = server.hits()
        with server.connect_tls() as sock:
            started = time.monotonic()
            sock.sendall(request_head(len(body)) + body[:100])
            status, headers, answer = read_response(sock)
            assert time.monotonic() - started < 1.0  # answered at once, not queued
        assert status == 429
        assert headers["retry-after"] == "1"
        assert headers["content-type"].startswith("application/json")
        status_body = orjson.loads(answer)
        assert status_body["kind"] == "Status"
        assert status_body["code"] == 429
        assert status_body["reason"] == "TooManyRequests"
        assert status_body["details"] == {"retryAfterSeconds": 1}
        # A request whose body is complete is answered even over the cap.
        with server.connect_tls() as sock:
            assert post(sock, body)[0] == 200
        assert delta(server.hits(), before) == {("webhook", "max_in_flight"): 1.0}
        for sock in slow:
            sock.sendall(body[100:])
            status, _, answer = read_response(sock)
            assert status == 200
            assert orjson.loads(answer)["response"]["uid"] == "limits"
    finally:
        for sock in slow:
            sock.close()
        server.stop()


# -- flags and memory -----------------------------------------------------------------


def test_serve_flag_defaults_are_the_limits_defaults() -> None:
    args = build_parser().parse_args(["serve"])
    defaults = Limits()
    assert (
        Limits(
            tls_handshake_timeout=args.tls_handshake_timeout,
            header_timeout=args.header_timeout,
            idle_timeout=args.idle_timeout,
            max_connections=args.max_connections,
            max_in_flight=args.max_in_flight,
        )
        == defaults
    )


def test_bad_limit_flag_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--header-timeout", "0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpushare-webhook: --header-timeout must be a positive number of seconds"
    ]


async def test_heap_is_trimmed_once_after_a_wave_of_closes() -> None:
    trimmer = HeapTrimmer(drop=100, delay=0.05, interval=0.2)
    for _ in range(150):
        trimmer.opened()
    for _ in range(60):  # a small dip: nothing to give back
        trimmer.closed()
    await asyncio.sleep(0.1)
    assert trimmer.trims == 0
    for _ in range(90):
        trimmer.closed()
    assert trimmer.trims == 0  # not in the middle of the wave
    for _ in range(50):  # bounded wait for the one trim
        if trimmer.trims:
            break
        await asyncio.sleep(0.02)
    assert trimmer.trims == 1
    assert trimmer.peak == trimmer.open == 0
    trimmer.abandoned(10 << 20)  # requests given up mid-body: trimmed too, once enough
    trimmer.abandoned(10 << 20)
    for _ in range(50):
        if trimmer.trims == 2:
            break
        await asyncio.sleep(0.02)
    assert trimmer.trims == 2
    assert trimmer.abandoned_bytes == 0
    trimmer.cancel()
