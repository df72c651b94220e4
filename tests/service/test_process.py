"""The `serve` process as operators run it: defaults, SIGTERM drain, SIGHUP, workers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from tests.paths import ROOT
from webhook.dev.testing import admission_review

POD = yaml.safe_load((ROOT / "tests" / "manifests" / "hami-vgpu-pod.yaml").read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def body(uid: str) -> bytes:
    return orjson.dumps(admission_review(POD, uid=uid, namespace="ml"))


class Server:
    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.health_port = free_port()
        self.workdir = workdir
        self.stderr = (workdir / "server.err").open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--health-port",
                str(self.health_port),
                "--audit-log",
                str(workdir / "audit.log"),
                *extra,
            ],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            # Its own process group, so stop() also ends the workers of --workers N.
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.health_port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"server not ready: {self.log()}")

    def log(self) -> str:
        return (self.workdir / "server.err").read_text()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.stderr.close()

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.workdir / "certs" / "ca.crt"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def session(server: Server) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(ssl=server.context())
    async with aiohttp.ClientSession(connector=connector) as client:
        yield client


async def test_defaults_generate_dev_certificates_and_serve(
    server: Server, session: aiohttp.ClientSession
) -> None:
    certs = server.workdir / "certs"
    assert (certs / "tls.key").stat().st_mode & 0o777 == 0o600
    url = f"https://localhost:{server.port}/mutate"
    async with session.post(
        url, data=body("u1"), headers={"Content-Type": "application/json"}
    ) as r:
        answer = await r.json()
    assert answer["response"]["uid"] == "u1"
    assert answer["response"]["patchType"] == "JSONPatch"


async def _slow_body(
    uid: str, started: asyncio.Event, release: asyncio.Event
) -> AsyncIterator[bytes]:
    data = body(uid)
    yield data[:100]
    started.set()
    await release.wait()
    yield data[100:]


async def test_sigterm_drains_in_flight_requests(
    server: Server, session: aiohttp.ClientSession
) -> None:
    url = f"https://127.0.0.1:{server.port}/mutate"
    started = asyncio.Event()
    release = asyncio.Event()
    headers = {"Content-Type": "application/json"}

    async def in_flight() -> Any:
        async with session.post(
            url, data=_slow_body("slow", started, release), headers=headers
        ) as r:
            return r.status, await r.json()

    task = asyncio.create_task(in_flight())
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(0.2)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.5)
    # No longer accepting new connections while the old request is still open.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
    release.set()
    status, answer = await asyncio.wait_for(task, 10)
    assert status == 200
    assert answer["response"]["uid"] == "slow"
    code = await asyncio.to_thread(server.process.wait, 20)
    assert code == 0
    assert time.monotonic() - sent < 15
    lines = (server.workdir / "audit.log").read_bytes().splitlines()
    assert [orjson.loads(line)["auditID"] for line in lines] == ["slow"]


async def test_sighup_reloads_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    server = Server(tmp_path, "--policy", str(policy))
    try:
        server.wait_ready()
        async with aiohttp.ClientSession() as plain:
            url = f"http://127.0.0.1:{server.health_port}/readyz"
            async with plain.get(url) as r:
                before = (await r.json())["policy"]
            policy.write_text((ROOT / "policies" / "examples" / "strict.yaml").read_text())
            server.process.send_signal(signal.SIGHUP)
            after = before
            for _ in range(50):
                await asyncio.sleep(0.1)
                async with plain.get(url) as r:
                    after = (await r.json())["policy"]
                if after != before:
                    break
        assert after != before
    finally:
        server.stop()


async def test_workers_share_the_port(tmp_path: Path) -> None:
    server = Server(tmp_path, "--workers", "2")
    try:
        server.wait_ready()
        pids: set[int] = set()
        # The second worker may start a moment after the first answers: ask for a while.
        deadline = time.monotonic() + 20
        async with aiohttp.ClientSession() as plain:
            while time.monotonic() < deadline:
                # A new connection each time, so the kernel spreads them across workers.
                async with plain.get(
                    f"http://127.0.0.1:{server.health_port}/readyz",
                    headers={"Connection": "close"},
                ) as r:
                    pids.add((await r.json())["pid"])
                if len(pids) == 2:
                    break
        assert len(pids) == 2
        assert server.process.pid not in pids
        server.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.process.wait, 20) == 0
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        server.stop()


def test_bad_policy_at_start_is_one_line(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec: {onError: x}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--policy", str(policy), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "line 3: spec.onError" in result.stderr
    assert "Traceback" not in result.stderr


def test_readme_curl_example_runs_as_written(server: Server) -> None:
    """The quick start's curl line, against a server started the way `make run` starts it."""
    readme = (ROOT / "README.md").read_text()  # the quick start stays on the front page
    start = readme.index("    curl -s --cacert certs/ca.crt")
    end = readme.index("base64 -d", start) + len("base64 -d")
    command = readme[start:end].replace("localhost:8443", f"localhost:{server.port}")
    reviews = server.workdir / "tests" / "reviews"
    reviews.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "reviews" / "hami-vgpu-pod.json", reviews)
    result = subprocess.run(
        ["bash", "-c", command], cwd=server.workdir, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    patch = json.loads(result.stdout)
    env = next(op["value"] for op in patch if op["path"] == "/spec/containers/0/env")
    assert {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "3000m"} in env


def test_shipped_review_is_what_the_builder_makes() -> None:
    shipped = json.loads((ROOT / "tests" / "reviews" / "hami-vgpu-pod.json").read_text())
    assert shipped == admission_review(POD, uid=shipped["request"]["uid"])


def _pids(health_port: int) -> set[int]:
    """The pids behind the health port: a new connection each time, so the kernel spreads
    them over the workers; a few dozen asks find every worker alive."""
    found: set[int] = set()
    for _ in range(40):
        with contextlib.suppress(OSError, ValueError):
            request = urllib.request.Request(
                f"http://127.0.0.1:{health_port}/readyz", headers={"Connection": "close"}
            )
            with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310  # our loopback port
                found.add(json.load(response)["pid"])
    return found


def _wait_for(check: Callable[[], bool], what: str, server: Server, within: float = 30) -> None:
    """Bounded wait for a state of processes we do not control (not a speed check)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within:g}s: {what}\n{server.log()}")
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    """No process, not even a zombie, holds ``pid``."""
    return not Path(f"/proc/{pid}").exists()


def test_a_killed_worker_is_replaced_and_reaped(tmp_path: Path) -> None:
    server = Server(tmp_path, "--workers", "2")
    try:
        server.wait_ready()
        workers: set[int] = set()

        def both() -> bool:
            workers.update(_pids(server.health_port))
            return len(workers) == 2

        _wait_for(both, "2 workers", server)
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        _wait_for(lambda: _gone(victim), f"worker {victim} reaped", server)
        survivors = workers - {victim}
        now: set[int] = set()

        def replaced() -> bool:
            nonlocal now
            now = _pids(server.health_port)
            return len(now) == 2 and victim not in now

        _wait_for(replaced, "a replacement answering beside the survivor", server)
        assert survivors < now
        assert f"(pid {victim}) exited with signal 9" in server.log()
        # The replacement serves admission requests, not only probes.
        context = server.context()
        for uid in ("after-1", "after-2", "after-3", "after-4"):
            request = urllib.request.Request(
                f"https://localhost:{server.port}/mutate",
                data=body(uid),
                headers={"Content-Type": "application/json", "Connection": "close"},
            )
            with urllib.request.urlopen(request, timeout=5, context=context) as response:  # noqa: S310
                assert json.load(response)["response"]["uid"] == uid
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        for pid in now:
            _wait_for(functools.partial(_gone, pid), f"worker {pid} stopped", server)
    finally:
        server.stop()


def test_workers_stop_when_their_parent_is_killed(tmp_path: Path) -> None:
    server = Server(tmp_path, "--workers", "2")
    try:
        server.wait_ready()
        workers: set[int] = set()

        def both() -> bool:
            workers.update(_pids(server.health_port))
            return len(workers) == 2

        _wait_for(both, "2 workers", server)
        server.process.kill()  # the parent only: the workers are left to notice
        server.process.wait()
        for pid in workers:
            _wait_for(functools.partial(_gone, pid), f"orphaned worker {pid} stopped", server)
    finally:
        server.stop()


def test_workers_that_cannot_boot_stop_the_parent(tmp_path: Path) -> None:
    """Replacements that die at start (here: the policy file turned invalid after the
    start) are not forked forever: the parent gives up and exits 1."""
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    server = Server(tmp_path, "--workers", "2", "--policy", str(policy))
    try:
        server.wait_ready()
        workers: set[int] = set()

        def both() -> bool:
            workers.update(_pids(server.health_port))
            return len(workers) == 2

        _wait_for(both, "2 workers", server)
        policy.write_text("spec: {onError: x}\n")
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        assert server.process.wait(60) == 1
        assert "to fail to boot: stopping" in server.log()
    finally:
        server.stop()


def test_plain_serve_is_ready_without_duties(server: Server) -> None:
    """Nothing is configured beyond serving: /readyz reports no duties."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.health_port}/readyz") as response:
        ready = json.load(response)
    assert ready["status"] == "ready"
    assert "duties" not in ready
