"""The serving event loop (:mod:`webhook.service.loop`): uvloop when it is installed,
asyncio's otherwise; and what the service needs from either: TLS with the certificate
switch, the body deadline, signal handlers."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from cryptography import x509

from tests.paths import MANIFESTS
from webhook.certs.contexts import CertificateReloader
from webhook.certs.files import write_files
from webhook.certs.issue import generate_ca, generate_serving
from webhook.certs.material import KeyPair
from webhook.dev.testing import admission_review
from webhook.service import loop
from webhook.service.process import ServerConfig, start

Run = Callable[[Coroutine[Any, Any, None]], None]
HAS_UVLOOP = loop.loop_factory() is not None


@pytest.fixture(
    params=[
        pytest.param("asyncio"),
        pytest.param(
            "serving",
            marks=pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed"),
        ),
    ]
)
def run(request: pytest.FixtureRequest) -> Run:
    """asyncio.run, or loop.run as `serve` runs (uvloop)."""
    return asyncio.run if request.param == "asyncio" else loop.run


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_serving_loop_is_uvloop_when_installed() -> None:
    assert loop.run(_loop_module()).startswith("uvloop")


def test_serving_loop_falls_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now raises ImportError
    assert loop.loop_factory() is None
    assert loop.run(_loop_module()).startswith("asyncio")


def test_signal_handlers_and_timeouts(run: Run) -> None:
    async def main() -> None:
        running = asyncio.get_running_loop()
        received = asyncio.Event()
        running.add_signal_handler(signal.SIGUSR1, received.set)
        try:
            os.kill(os.getpid(), signal.SIGUSR1)
            async with asyncio.timeout(10):
                await received.wait()
        finally:
            running.remove_signal_handler(signal.SIGUSR1)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(10)

    run(main())


def _pair(ca: KeyPair) -> KeyPair:
    return generate_serving(
        ca=ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], valid_for=timedelta(days=1)
    )


async def _serial(port: int, client: ssl.SSLContext) -> int:
    """The serial of the certificate a new connection is shown."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


def test_service_on_the_loop(run: Run, tmp_path: Path) -> None:
    """An answer, a stalled body cut at the apiserver's deadline, a certificate switch
    while serving, and the audit log drained at stop: on each loop."""
    ca = generate_ca(common_name="test CA", valid_for=timedelta(days=1))
    old, new = _pair(ca), _pair(ca)
    paths = write_files(tmp_path / "tls", ca=ca, serving=old)
    pod = yaml.safe_load((MANIFESTS / "hami-vgpu-pod.yaml").read_text())
    config = ServerConfig(
        host="127.0.0.1", port=0, health_port=0, audit_log=str(tmp_path / "audit.log")
    )

    async def main() -> None:
        reloader = CertificateReloader(paths.cert_file, paths.key_file)
        client = ssl.create_default_context(cafile=str(paths.ca_file))
        service = await start(config, ssl_context=reloader.server_context)
        try:
            url = f"https://127.0.0.1:{service.port}/mutate"
            connector = aiohttp.TCPConnector(ssl=client)
            async with aiohttp.ClientSession(connector=connector) as session:
                body = orjson.dumps(admission_review(pod, uid="on-loop"))
                headers = {"Content-Type": "application/json"}
                async with session.post(url, data=body, headers=headers) as response:
                    assert response.status == 200
                    answer = await response.json()
            assert answer["response"]["uid"] == "on-loop"
            assert answer["response"]["patchType"] == "JSONPatch"

            # Half a body, then silence: answered 408 at 90% of ?timeout (asyncio.timeout).
            reader, writer = await asyncio.open_connection("127.0.0.1", service.port, ssl=client)
            writer.write(
                b"POST /mutate?timeout=200ms HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            async with asyncio.timeout(10):
                assert (await reader.readline()).startswith(b"HTTP/1.1 408 ")
            writer.close()

            assert await _serial(service.port, client) == old.cert.serial_number
            write_files(tmp_path / "tls", ca=ca, serving=new)
            assert reloader.reload()
            assert await _serial(service.port, client) == new.cert.serial_number
        finally:
            await service.stop()

    run(main())
    lines = (tmp_path / "audit.log").read_bytes().splitlines()
    assert [orjson.loads(line)["auditID"] for line in lines] == ["on-loop"]
