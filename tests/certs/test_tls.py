"""Certificates, SSL contexts and reload, against a real aiohttp HTTPS server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import ssl
import stat
import warnings
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from webhook.certs import contexts, files, issue, material
from webhook.cli import main
from webhook.service import loop as serving_loop

ONE_DAY = timedelta(days=1)
ONE_WEEK = timedelta(days=7)
LOOPBACK = "127.0.0.1"
KEY_CLASSES = (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)  # in the order of issue.KEY_TYPES


# -- helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> material.KeyPair:
    return issue.generate_ca(common_name="test CA", valid_for=timedelta(days=30))


def serving_pair(
    ca: material.KeyPair, *, key_type: issue.KeyType = "ecdsa-p256"
) -> material.KeyPair:
    return issue.generate_serving(
        ca=ca,
        dns_names=["localhost"],
        ip_addresses=[LOOPBACK],
        valid_for=ONE_WEEK,
        key_type=key_type,
    )


def expired_serving_pair(ca: material.KeyPair) -> material.KeyPair:
    # The generator only issues certificates valid from now on, so build one in the past.
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - 2 * ONE_DAY)
        .not_valid_after(now - ONE_DAY)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return material.KeyPair(cert, key)


def client_pair(ca: material.KeyPair, *, common_name: str) -> material.KeyPair:
    """What the apiserver presents when the webhook asks for a client certificate
    (nothing in the webhook issues one, so the tests build it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(ca.not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return material.KeyPair(cert, key)


def read_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans_of(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return san.get_values_for_type(x509.DNSName), ips


def verify_chain(
    ca: x509.Certificate, leaf: x509.Certificate, subject: x509.verification.Subject
) -> None:
    PolicyBuilder().store(Store([ca])).build_server_verifier(subject).verify(leaf, [])


def client_context(ca_file: Path, client: material.CertPaths | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file)
    if client is not None:
        context.load_cert_chain(client.cert_file, client.key_file)
    return context


BadPair = Callable[[material.CertPaths, material.KeyPair], None]


def _mismatched_key(paths: material.CertPaths, ca: material.KeyPair) -> None:
    paths.key_file.write_bytes(serving_pair(ca).key_pem())


def _garbage_cert(paths: material.CertPaths, ca: material.KeyPair) -> None:
    paths.cert_file.write_bytes(
        b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
    )


def _garbage_key(paths: material.CertPaths, ca: material.KeyPair) -> None:
    paths.key_file.write_bytes(b"this is not a key\n")


def _encrypted_key(paths: material.CertPaths, ca: material.KeyPair) -> None:
    key = serialization.load_pem_private_key(paths.key_file.read_bytes(), password=None)
    paths.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )


def _expired(paths: material.CertPaths, ca: material.KeyPair) -> None:
    files.write_files(paths.cert_file.parent, ca=ca, serving=expired_serving_pair(ca))


def _missing_key(paths: material.CertPaths, ca: material.KeyPair) -> None:
    paths.key_file.unlink()


# (how to spoil a good pair, which file the error names, what it says)
BAD_PAIRS: dict[str, tuple[BadPair, str, str]] = {
    "mismatched-key": (_mismatched_key, "key_file", "does not match"),
    "garbage-cert": (_garbage_cert, "cert_file", "not a PEM certificate"),
    "garbage-key": (_garbage_key, "key_file", "not a PEM private key"),
    "encrypted-key": (_encrypted_key, "key_file", "encrypted"),
    "expired": (_expired, "cert_file", "expired"),
    "missing-key": (_missing_key, "key_file", "file not found"),
}


@contextlib.asynccontextmanager
async def https_server(context: ssl.SSLContext) -> AsyncIterator[str]:
    """A real aiohttp server on loopback; responses say which client connection and cert."""

    async def whoami(request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None
        peercert = transport.get_extra_info("peercert") or {}
        subject = dict(pair for rdn in peercert.get("subject", ()) for pair in rdn)
        return web.json_response(
            {
                "client_port": transport.get_extra_info("peername")[1],
                "client_cn": subject.get("commonName"),
            }
        )

    app = web.Application()
    app.router.add_get("/", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, LOOPBACK, 0, ssl_context=context)
        await site.start()
        port = runner.addresses[0][1]
        yield f"https://{LOOPBACK}:{port}/"
    finally:
        await runner.cleanup()


async def get(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


class Connection:
    """One TLS connection speaking HTTP/1.1 keep-alive, which knows the certificate it
    was shown (aiohttp's client lets go of the connection before that can be read)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        self.serial: int = x509.load_der_x509_certificate(der).serial_number

    async def get(self) -> dict[str, Any]:
        self.writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert (await self.reader.readline()).startswith(b"HTTP/1.1 200 ")
        length = 0
        while (line := await self.reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body: dict[str, Any] = json.loads(await self.reader.readexactly(length))
        return body


@contextlib.asynccontextmanager
async def connect(
    url: str, context: ssl.SSLContext, *, server_hostname: str = LOOPBACK
) -> AsyncIterator[Connection]:
    """A new connection; Python sends no SNI when server_hostname is an IP address."""
    port = int(url.rsplit(":", 1)[1].strip("/"))
    reader, writer = await asyncio.open_connection(
        LOOPBACK, port, ssl=context, server_hostname=server_hostname
    )
    try:
        yield Connection(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()


async def handshake_serial(
    url: str, context: ssl.SSLContext, *, server_hostname: str = LOOPBACK
) -> int:
    """Serial of the certificate a brand-new connection gets."""
    async with connect(url, context, server_hostname=server_hostname) as connection:
        return connection.serial


# -- generation ------------------------------------------------------------------------


@pytest.mark.parametrize("key_type", issue.KEY_TYPES)
def test_generated_chain_verifies_for_every_service_name(key_type: issue.KeyType) -> None:
    ca = issue.generate_ca(common_name="webhook CA", valid_for=ONE_DAY, key_type=key_type)
    names = issue.service_dns_names("gpushare-webhook", "gpu-system")
    serving = issue.generate_serving(
        ca=ca, dns_names=names, ip_addresses=["10.96.0.10"], valid_for=ONE_DAY, key_type=key_type
    )
    for name in names:
        verify_chain(ca.cert, serving.cert, x509.DNSName(name))
    verify_chain(ca.cert, serving.cert, x509.IPAddress(ipaddress.ip_address("10.96.0.10")))
    with pytest.raises(VerificationError):
        verify_chain(ca.cert, serving.cert, x509.DNSName("other.gpu-system.svc"))
    stranger = issue.generate_ca(common_name="webhook CA", valid_for=ONE_DAY, key_type=key_type)
    with pytest.raises(VerificationError):
        verify_chain(stranger.cert, serving.cert, x509.DNSName(names[2]))


@pytest.mark.parametrize(
    ("key_type", "key_class", "size"),
    [("ecdsa-p256", ec.EllipticCurvePrivateKey, 256), ("rsa-2048", rsa.RSAPrivateKey, 2048)],
)
def test_serving_certificate_is_a_server_leaf(
    key_type: issue.KeyType, key_class: type, size: int
) -> None:
    ca = issue.generate_ca(common_name="webhook CA", valid_for=ONE_DAY)
    serving = issue.generate_serving(
        ca=ca,
        dns_names=["a", "a.b.svc"],
        ip_addresses=["::1"],
        valid_for=ONE_DAY,
        key_type=key_type,
    )
    extensions = serving.cert.extensions
    assert sans_of(serving.cert) == (["a", "a.b.svc"], ["::1"])
    assert list(extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    basic = extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and not basic.value.ca
    assert not extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    aki = extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ca_ski.digest
    ski = extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(serving.key.public_key())
    assert isinstance(serving.key, key_class)
    assert serving.key.key_size == size
    reloaded = serialization.load_pem_private_key(serving.key_pem(), password=None)
    assert reloaded.public_key() == serving.cert.public_key()


def test_ca_certificate_may_sign_leaves_only() -> None:
    ca = issue.generate_ca(common_name="webhook CA", valid_for=ONE_DAY)
    basic = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    usage = ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    ca.cert.verify_directly_issued_by(ca.cert)
    assert isinstance(ca.key, ec.EllipticCurvePrivateKey)
    assert ca.key.curve.name == "secp256r1"


def test_serving_certificate_never_outlives_its_ca() -> None:
    ca = issue.generate_ca(common_name="short CA", valid_for=ONE_DAY)
    serving = issue.generate_serving(
        ca=ca, dns_names=["a"], ip_addresses=[], valid_for=timedelta(days=365)
    )
    assert serving.not_after == ca.not_after


def test_service_dns_names_and_bad_names() -> None:
    assert issue.service_dns_names("hook", "gpu") == [
        "hook",
        "hook.gpu",
        "hook.gpu.svc",
        "hook.gpu.svc.cluster.local",
    ]
    with pytest.raises(ValueError, match="DNS-1035"):
        issue.service_dns_names("Hook", "gpu")
    with pytest.raises(ValueError, match="DNS-1123"):
        issue.service_dns_names("hook", "gpu.system")


# -- files -----------------------------------------------------------------------------


def test_write_files_creates_directory_and_private_key(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    directory = tmp_path / "a" / "b"
    paths = files.write_files(directory, ca=ca, serving=serving_pair(ca))
    assert sorted(os.listdir(directory)) == ["ca.crt", "tls.crt", "tls.key"]
    assert stat.S_IMODE(paths.key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(paths.cert_file.stat().st_mode) == 0o644
    assert read_cert(paths.ca_file) == ca.cert


def test_write_files_replaces_files_instead_of_rewriting_them(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    before = {path: path.stat().st_ino for path in (paths.cert_file, paths.key_file)}
    with paths.key_file.open("rb") as reader_of_old_key:
        new = serving_pair(ca)
        files.write_files(tmp_path, ca=ca, serving=new)
        assert reader_of_old_key.read() != new.key_pem()
    assert all(path.stat().st_ino != inode for path, inode in before.items())
    assert paths.key_file.read_bytes() == new.key_pem()
    assert sorted(os.listdir(tmp_path)) == ["ca.crt", "tls.crt", "tls.key"]


def test_write_files_under_a_regular_file_is_a_certificate_error(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(material.CertificateError, match="cannot create directory") as error:
        files.write_files(tmp_path / "file" / "certs", ca=ca, serving=serving_pair(ca))
    assert error.value.path == tmp_path / "file" / "certs"


def test_ensure_dev_certificates_issues_then_reuses(tmp_path: Path) -> None:
    paths = files.ensure_dev_certificates(
        tmp_path / "certs", extra_sans=["webhook.test", "10.1.2.3"]
    )
    leaf = read_cert(paths.cert_file)
    assert sans_of(leaf) == (["localhost", "webhook.test"], ["127.0.0.1", "::1", "10.1.2.3"])
    verify_chain(read_cert(paths.ca_file), leaf, x509.IPAddress(ipaddress.ip_address("10.1.2.3")))
    assert stat.S_IMODE(paths.key_file.stat().st_mode) == 0o600
    issued = [path.read_bytes() for path in (paths.ca_file, paths.cert_file, paths.key_file)]

    for extra in (["webhook.test", "10.1.2.3"], [], ["10.1.2.3"]):
        again = files.ensure_dev_certificates(tmp_path / "certs", extra_sans=extra)
        assert again == paths
        assert [
            path.read_bytes() for path in (paths.ca_file, paths.cert_file, paths.key_file)
        ] == issued


def _short_lived(paths: material.CertPaths, ca: material.KeyPair) -> None:
    serving = issue.generate_serving(
        ca=ca, dns_names=["localhost"], ip_addresses=[LOOPBACK], valid_for=timedelta(hours=12)
    )
    files.write_files(paths.cert_file.parent, ca=ca, serving=serving)


def _foreign_ca(paths: material.CertPaths, ca: material.KeyPair) -> None:
    stranger = issue.generate_ca(common_name="test CA", valid_for=ONE_DAY)
    paths.ca_file.write_bytes(stranger.cert_pem())


def _not_covering_localhost(paths: material.CertPaths, ca: material.KeyPair) -> None:
    serving = issue.generate_serving(
        ca=ca, dns_names=["webhook.test"], ip_addresses=[LOOPBACK], valid_for=ONE_WEEK
    )
    files.write_files(paths.cert_file.parent, ca=ca, serving=serving)


def assert_fresh_dev_certificates(
    paths: material.CertPaths, *, replaced_ca: material.KeyPair
) -> None:
    leaf = read_cert(paths.cert_file)
    assert read_cert(paths.ca_file) != replaced_ca.cert
    assert leaf.not_valid_after_utc - datetime.now(UTC) > ONE_DAY
    names, ips = sans_of(leaf)
    assert "localhost" in names and {"127.0.0.1", "::1"} <= set(ips)
    contexts.build_server_context(paths.cert_file, paths.key_file)


@pytest.mark.parametrize(
    "spoil",
    [
        _short_lived,
        BAD_PAIRS["expired"][0],
        BAD_PAIRS["mismatched-key"][0],
        BAD_PAIRS["garbage-cert"][0],
        BAD_PAIRS["missing-key"][0],
        _foreign_ca,
        _not_covering_localhost,
    ],
    ids=lambda spoil: spoil.__name__.strip("_"),
)
def test_ensure_dev_certificates_replaces_unusable_ones(
    tmp_path: Path, ca: material.KeyPair, spoil: BadPair
) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    # Control: before spoiling, the pair is good enough to keep.
    files.ensure_dev_certificates(tmp_path)
    assert read_cert(paths.ca_file) == ca.cert

    spoil(paths, ca)
    assert files.ensure_dev_certificates(tmp_path) == paths
    assert_fresh_dev_certificates(paths, replaced_ca=ca)


def test_ensure_dev_certificates_adds_missing_extra_sans(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    files.ensure_dev_certificates(tmp_path, extra_sans=["webhook.test", "10.0.0.1"])
    assert_fresh_dev_certificates(paths, replaced_ca=ca)
    assert sans_of(read_cert(paths.cert_file)) == (
        ["localhost", "webhook.test"],
        ["127.0.0.1", "::1", "10.0.0.1"],
    )


# -- SSL contexts ----------------------------------------------------------------------


def test_build_server_context_requires_tls_1_2(tmp_path: Path, ca: material.KeyPair) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    context = contexts.build_server_context(paths.cert_file, paths.key_file)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_NONE
    mutual = contexts.build_server_context(
        paths.cert_file, paths.key_file, client_ca_file=paths.ca_file
    )
    assert mutual.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("bad", list(BAD_PAIRS))
def test_build_server_context_rejects_unusable_pairs(
    tmp_path: Path, ca: material.KeyPair, bad: str
) -> None:
    spoil, blamed, reason = BAD_PAIRS[bad]
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    spoil(paths, ca)
    with pytest.raises(material.CertificateError) as error:
        contexts.build_server_context(paths.cert_file, paths.key_file)
    assert error.value.path == getattr(paths, blamed)
    assert reason in error.value.reason
    assert str(error.value).startswith(f"{getattr(paths, blamed)}: ")


def test_build_server_context_rejects_a_bad_client_ca(tmp_path: Path, ca: material.KeyPair) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    with pytest.raises(material.CertificateError, match="file not found"):
        contexts.build_server_context(
            paths.cert_file, paths.key_file, client_ca_file=tmp_path / "none.crt"
        )
    with pytest.raises(material.CertificateError, match="not a PEM certificate"):
        contexts.build_server_context(
            paths.cert_file, paths.key_file, client_ca_file=paths.key_file
        )


def legacy_context(context: ssl.SSLContext) -> ssl.SSLContext:
    # OpenSSL 3 refuses TLS 1.1 below security level 0 on both sides; lowering it
    # leaves minimum_version as the only thing that can refuse the handshake.
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


@pytest.mark.asyncio
async def test_server_refuses_tls_1_1(tmp_path: Path, ca: material.KeyPair) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    client = legacy_context(client_context(paths.ca_file))
    server = legacy_context(contexts.build_server_context(paths.cert_file, paths.key_file))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # naming TLS 1.0/1.1 is deprecated
        client.minimum_version = ssl.TLSVersion.TLSv1
        client.maximum_version = ssl.TLSVersion.TLSv1_1
    async with https_server(server) as url:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await handshake_serial(url, client)

        # Control: the same client does get through once the server's floor is lowered,
        # so the refusal above is the minimum version's doing.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            server.minimum_version = ssl.TLSVersion.TLSv1
        assert await handshake_serial(url, client)


# -- reload against a real server --------------------------------------------------------


@pytest.mark.asyncio
async def test_hot_swap_keeps_connections_and_serves_new_pair(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    old, new = serving_pair(ca), serving_pair(ca)
    paths = files.write_files(tmp_path, ca=ca, serving=old)
    reloader = contexts.CertificateReloader(paths.cert_file, paths.key_file)
    client = client_context(paths.ca_file)
    async with (
        https_server(reloader.server_context) as url,
        connect(url, client) as kept,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client, limit=1)) as session,
    ):
        first = await kept.get()
        assert kept.serial == old.cert.serial_number
        first_aiohttp = await get(session, url)

        files.write_files(tmp_path, ca=ca, serving=new)
        assert reloader.reload() is True
        assert (reloader.reloads_ok, reloader.reloads_failed) == (1, 0)
        assert reloader.serial_number == new.cert.serial_number
        assert reloader.not_after == new.not_after

        # Open connections carry on, with the certificate they were opened with.
        second = await kept.get()
        assert second["client_port"] == first["client_port"]
        assert kept.serial == old.cert.serial_number
        assert (await get(session, url))["client_port"] == first_aiohttp["client_port"]

        async with connect(url, client) as fresh:
            assert fresh.serial == new.cert.serial_number
            assert (await fresh.get())["client_port"] != first["client_port"]

        assert reloader.reload() is False
        assert (reloader.reloads_ok, reloader.reloads_failed) == (1, 0)


@pytest.mark.asyncio
async def test_clients_without_sni_get_the_current_certificate(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    old, new = serving_pair(ca), serving_pair(ca)
    paths = files.write_files(tmp_path, ca=ca, serving=old)
    reloader = contexts.CertificateReloader(paths.cert_file, paths.key_file)
    context = reloader.server_context
    select = context.sni_callback
    assert select is not None
    server_names: list[str | None] = []

    def record(
        ssl_object: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext
    ) -> int | None:
        server_names.append(server_name)
        return select(ssl_object, server_name, ctx)  # type: ignore[arg-type]  # typeshed says str; OpenSSL passes None without SNI

    context.sni_callback = record
    client = client_context(paths.ca_file)
    async with https_server(context) as url:
        files.write_files(tmp_path, ca=ca, serving=new)
        assert reloader.reload()
        assert await handshake_serial(url, client) == new.cert.serial_number
        assert (
            await handshake_serial(url, client, server_hostname="localhost")
            == new.cert.serial_number
        )
    assert server_names == [None, "localhost"]


@pytest.mark.skipif(serving_loop.loop_factory() is None, reason="uvloop is not installed")
@pytest.mark.parametrize(
    "scenario",
    [
        test_hot_swap_keeps_connections_and_serves_new_pair,
        test_clients_without_sni_get_the_current_certificate,
    ],
)
def test_reload_switches_certificates_on_the_serving_loop(
    tmp_path: Path, ca: material.KeyPair, scenario: Callable[..., Any]
) -> None:
    """The two tests above on the loop a server runs on (uvloop, whose TLS transport
    is its own code): its handshake must call the context's sni_callback too."""

    async def on_serving_loop() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        await scenario(tmp_path, ca)

    serving_loop.run(on_serving_loop())


@pytest.mark.asyncio
@pytest.mark.parametrize("bad", list(BAD_PAIRS))
async def test_bad_pair_is_refused_and_old_one_keeps_serving(
    tmp_path: Path, ca: material.KeyPair, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    spoil, blamed, reason = BAD_PAIRS[bad]
    good = serving_pair(ca)
    paths = files.write_files(tmp_path, ca=ca, serving=good)
    reloader = contexts.CertificateReloader(paths.cert_file, paths.key_file)
    client = client_context(paths.ca_file)
    async with https_server(reloader.server_context) as url:
        spoil(paths, ca)
        with caplog.at_level(logging.ERROR, logger="webhook.certs.contexts"):
            assert reloader.reload() is False
        assert (reloader.reloads_ok, reloader.reloads_failed) == (0, 1)
        assert reloader.serial_number == good.cert.serial_number
        assert reloader.not_after == good.not_after
        assert [r.levelno for r in caplog.records] == [logging.ERROR]
        assert str(getattr(paths, blamed)) in caplog.text and reason in caplog.text
        assert await handshake_serial(url, client) == good.cert.serial_number

        # Fixing the files brings reloads back.
        fixed = serving_pair(ca)
        files.write_files(tmp_path, ca=ca, serving=fixed)
        assert reloader.reload() is True
        assert await handshake_serial(url, client) == fixed.cert.serial_number


def test_reloader_refuses_to_start_without_a_usable_pair(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    _mismatched_key(paths, ca)
    with pytest.raises(material.CertificateError, match="does not match"):
        contexts.CertificateReloader(paths.cert_file, paths.key_file)


def replace_file(path: Path, data: bytes) -> None:
    path.with_name(path.name + ".new").write_bytes(data)
    os.replace(path.with_name(path.name + ".new"), path)


def test_poll_waits_for_files_to_settle(tmp_path: Path, ca: material.KeyPair) -> None:
    paths = files.write_files(tmp_path, ca=ca, serving=serving_pair(ca))
    reloader = contexts.CertificateReloader(paths.cert_file, paths.key_file)
    assert reloader.poll() is False

    # A writer that replaces the key first and the certificate a moment later. Each
    # is renamed into place: an in-place rewrite of equal size within one filesystem
    # clock tick would leave (inode, mtime, size) unchanged.
    new = serving_pair(ca)
    replace_file(paths.key_file, new.key_pem())
    assert reloader.poll() is False
    replace_file(paths.cert_file, new.cert_pem())
    assert reloader.poll() is False
    assert reloader.poll() is True
    assert (reloader.reloads_ok, reloader.reloads_failed) == (1, 0)
    assert reloader.serial_number == new.cert.serial_number
    assert reloader.poll() is False


def project_secret(
    volume: Path, *, ca: material.KeyPair, serving: material.KeyPair, generation: str
) -> None:
    """Lay out a Secret volume as the kubelet does: files in a timestamped directory,
    ``..data`` pointing at it, swapped by renaming a new symlink over it."""
    data = volume / f"..{generation}"
    data.mkdir(parents=True)
    (data / "ca.crt").write_bytes(ca.cert_pem())
    (data / "tls.crt").write_bytes(serving.cert_pem())
    (data / "tls.key").write_bytes(serving.key_pem())
    current = volume / "..data"
    previous = current.resolve() if current.is_symlink() else None
    (volume / "..data_tmp").symlink_to(data.name)
    os.replace(volume / "..data_tmp", current)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")
    if previous is not None:
        shutil.rmtree(previous)


@pytest.mark.asyncio
async def test_watch_follows_a_kubernetes_secret_volume_swap(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    old, new = serving_pair(ca), serving_pair(ca)
    volume = tmp_path / "secret"
    project_secret(volume, ca=ca, serving=old, generation="2026_01_01_00_00_00.1")
    paths = material.CertPaths.in_directory(volume)
    reloader = contexts.CertificateReloader(paths.cert_file, paths.key_file)
    client = client_context(paths.ca_file)
    async with https_server(reloader.server_context) as url:
        watcher = asyncio.create_task(reloader.watch(0.01))
        try:
            project_secret(volume, ca=ca, serving=new, generation="2026_01_02_00_00_00.2")
            # A hang guard, not a speed requirement: the watcher needs a few polls.
            async with asyncio.timeout(30):
                while reloader.reloads_ok == 0:
                    await asyncio.sleep(0.01)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        assert reloader.reloads_failed == 0
        assert await handshake_serial(url, client) == new.cert.serial_number


@pytest.mark.asyncio
async def test_mutual_tls_requires_a_client_certificate_from_the_client_ca(
    tmp_path: Path, ca: material.KeyPair
) -> None:
    paths = files.write_files(tmp_path / "server", ca=ca, serving=serving_pair(ca))
    client_ca = issue.generate_ca(common_name="apiserver client CA", valid_for=ONE_DAY)
    client_ca_file = tmp_path / "client-ca.crt"
    client_ca_file.write_bytes(client_ca.cert_pem())
    apiserver = files.write_files(
        tmp_path / "apiserver",
        ca=client_ca,
        serving=client_pair(client_ca, common_name="kube-apiserver"),
    )
    impostor_ca = issue.generate_ca(common_name="apiserver client CA", valid_for=ONE_DAY)
    impostor = files.write_files(
        tmp_path / "impostor",
        ca=impostor_ca,
        serving=client_pair(impostor_ca, common_name="kube-apiserver"),
    )
    reloader = contexts.CertificateReloader(
        paths.cert_file, paths.key_file, client_ca_file=client_ca_file
    )

    async def check(url: str) -> None:
        for refused in (client_context(paths.ca_file), client_context(paths.ca_file, impostor)):
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=refused)
            ) as session:
                with pytest.raises(aiohttp.ClientError):
                    await get(session, url)
        accepted = client_context(paths.ca_file, apiserver)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=accepted)) as session:
            assert (await get(session, url))["client_cn"] == "kube-apiserver"
        assert await handshake_serial(url, accepted) == reloader.serial_number

    async with https_server(reloader.server_context) as url:
        await check(url)
        # The per-connection switch to a reloaded context must not drop the client check.
        files.write_files(tmp_path / "server", ca=ca, serving=serving_pair(ca))
        assert reloader.reload()
        await check(url)


# -- CLI -------------------------------------------------------------------------------


def test_cli_certs_generate_writes_service_certificates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    argv = ["certs", "generate", "--service", "gpushare-webhook", "--namespace", "gpu-system"]
    assert main([*argv, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    paths = material.CertPaths.in_directory(out)
    for path in (paths.ca_file, paths.cert_file, paths.key_file):
        assert str(path) in stdout
    leaf = read_cert(paths.cert_file)
    names = issue.service_dns_names("gpushare-webhook", "gpu-system")
    assert sans_of(leaf) == (names, [])
    verify_chain(read_cert(paths.ca_file), leaf, x509.DNSName("gpushare-webhook.gpu-system.svc"))
    assert stat.S_IMODE(paths.key_file.stat().st_mode) == 0o600
    assert isinstance(
        serialization.load_pem_private_key(paths.key_file.read_bytes(), None),
        ec.EllipticCurvePrivateKey,
    )
    assert timedelta(days=364) < leaf.not_valid_after_utc - datetime.now(UTC) <= timedelta(days=365)

    # Every key type the library offers is accepted on the command line.
    for key_type, key_class in zip(issue.KEY_TYPES, KEY_CLASSES, strict=True):
        assert main([*argv, "--out", str(out), "--key-type", key_type, "--days", "30"]) == 0
        key = serialization.load_pem_private_key(paths.key_file.read_bytes(), None)
        assert isinstance(key, key_class)
        remaining = read_cert(paths.cert_file).not_valid_after_utc - datetime.now(UTC)
        assert timedelta(days=29) < remaining <= timedelta(days=30)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--out", "{file}/certs"], "cannot create directory"),
        (["--out", "{dir}", "--days", "0"], "--days"),
        (["--out", "{dir}", "--namespace", "Not_A_Label"], "DNS-1123"),
    ],
)
def test_cli_certs_generate_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], expected: str
) -> None:
    (tmp_path / "file").write_text("")
    argv = ["certs", "generate", "--service", "hook", "--namespace", "gpu"]
    argv += [arg.format(file=tmp_path / "file", dir=tmp_path / "out") for arg in extra]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and expected in captured.err
    assert not (tmp_path / "out").exists()
