"""Certificates and SSL contexts: generation, files on disk, and reload without downtime.

The apiserver only talks to a webhook over TLS, and it pins the CA it was given in
the webhook configuration's ``caBundle``. This module issues that CA and the serving
certificate (``certs generate`` for a cluster, :func:`ensure_dev_certificates` for a
laptop), builds the server's :class:`ssl.SSLContext`, and swaps in renewed
certificates (cert-manager, a rotated Secret) while connections stay open.

File names follow ``kubernetes.io/tls`` Secrets and cert-manager (``ca.crt``,
``tls.crt``, ``tls.key``), so a Secret mounted as a volume is read as is. The CA's
private key is never written: nothing else can be signed with it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
import re
import ssl
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, Literal, get_args

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.files import Fingerprint, fingerprint

log = logging.getLogger(__name__)

KeyType = Literal["ecdsa-p256", "rsa-2048"]
KEY_TYPES: Final[tuple[KeyType, ...]] = get_args(KeyType)
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CA_FILE: Final = "ca.crt"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"

DEV_VALIDITY: Final = timedelta(days=365)
# A certificate that expires within a day would lapse during a working session.
DEV_MIN_REMAINING: Final = timedelta(days=1)
DEV_SANS: Final = ("localhost", "127.0.0.1", "::1")
# ::1 is issued but not required: hosts without IPv6 still reuse their certificates.
_DEV_REQUIRED_SANS: Final = ("localhost", "127.0.0.1")

# Backdating absorbs clock skew between the host that issues and the apiserver that verifies.
_BACKDATE: Final = timedelta(minutes=5)
# RFC 5280 caps commonName at 64 characters; longer names live only in the SAN.
_MAX_COMMON_NAME: Final = 64
_DNS_1035_LABEL: Final = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class CertificateError(Exception):
    """A certificate, key or CA file that cannot be used, and why."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: PrivateKey

    @property
    def not_after(self) -> datetime:
        return self.cert.not_valid_after_utc

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True, slots=True)
class CertPaths:
    """Where a CA certificate, a serving certificate and its key are stored."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def in_directory(cls, directory: str | os.PathLike[str]) -> CertPaths:
        base = Path(directory)
        return cls(base / CA_FILE, base / CERT_FILE, base / KEY_FILE)


# -- generation ------------------------------------------------------------------------


def _new_key(key_type: KeyType) -> PrivateKey:
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa-2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unknown key type {key_type!r}, expected one of {', '.join(KEY_TYPES)}")


def _name(common_name: str) -> x509.Name:
    if not common_name or len(common_name) > _MAX_COMMON_NAME:
        return x509.Name([])
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    *,
    subject: x509.Name,
    issuer: x509.Name,
    key: PrivateKey,
    valid_for: timedelta,
    not_after_cap: datetime | None = None,
    now: datetime | None = None,
) -> x509.CertificateBuilder:
    if valid_for <= timedelta(0):
        raise ValueError(f"valid_for must be positive, got {valid_for}")
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    not_after = now + valid_for
    if not_after_cap is not None:
        not_after = min(not_after, not_after_cap)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def generate_ca(
    *,
    common_name: str,
    valid_for: timedelta,
    key_type: KeyType = "ecdsa-p256",
    now: datetime | None = None,
) -> KeyPair:
    """A self-signed CA that may sign end-entity certificates only (path length 0).

    ``now`` (default: the current time) is when its validity starts, less a backdate
    for clock skew.
    """
    key = _new_key(key_type)
    name = _name(common_name)
    if not name:
        raise ValueError(f"a CA needs a common name of 1..{_MAX_COMMON_NAME} characters")
    cert = (
        _builder(subject=name, issuer=name, key=key, valid_for=valid_for, now=now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_cert_sign=True), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def _key_usage(
    *, digital_signature: bool, key_encipherment: bool = False, key_cert_sign: bool = False
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _issue_leaf(
    *,
    ca: KeyPair,
    common_name: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    valid_for: timedelta,
    key_type: KeyType,
    now: datetime | None = None,
) -> KeyPair:
    key = _new_key(key_type)
    subject = _name(common_name)
    # A leaf that outlives its CA fails verification at the CA's expiry anyway; its
    # notAfter should say so, since that is what expiry monitoring reads.
    builder = _builder(
        subject=subject,
        issuer=ca.cert.subject,
        key=key,
        valid_for=valid_for,
        not_after_cap=ca.not_after,
        now=now,
    )
    try:
        ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key())
    if sans:
        # RFC 5280 4.2.1.6: with an empty subject the SAN must be critical.
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=not subject)
    cert = (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            # RSA key exchange (TLS 1.2 without ECDHE) encrypts to the key itself.
            _key_usage(digital_signature=True, key_encipherment=isinstance(key, rsa.RSAPrivateKey)),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(aki, critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return KeyPair(cert, key)


def generate_serving(
    *,
    ca: KeyPair,
    dns_names: Iterable[str],
    ip_addresses: Iterable[str | IPAddress],
    valid_for: timedelta,
    key_type: KeyType = "ecdsa-p256",
    now: datetime | None = None,
) -> KeyPair:
    """A TLS server certificate for ``dns_names`` and ``ip_addresses``, signed by ``ca``
    (valid from ``now``, default the current time, and never beyond the CA)."""
    names = list(dns_names)
    ips = [ipaddress.ip_address(address) for address in ip_addresses]
    if not names and not ips:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    sans += [x509.IPAddress(ip) for ip in ips]
    return _issue_leaf(
        ca=ca,
        common_name=names[0] if names else str(ips[0]),
        sans=sans,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        valid_for=valid_for,
        key_type=key_type,
        now=now,
    )


def generate_client(
    *, ca: KeyPair, common_name: str, valid_for: timedelta, key_type: KeyType = "ecdsa-p256"
) -> KeyPair:
    """A TLS client certificate (what the apiserver presents when the webhook asks for mTLS)."""
    if not _name(common_name):
        raise ValueError(
            f"a client certificate needs a common name of 1..{_MAX_COMMON_NAME} characters"
        )
    return _issue_leaf(
        ca=ca,
        common_name=common_name,
        sans=[],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        valid_for=valid_for,
        key_type=key_type,
    )


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by; the apiserver uses ``<svc>.<ns>.svc``."""
    if not _DNS_1035_LABEL.fullmatch(service):
        raise ValueError(f"service name {service!r} is not a DNS-1035 label")
    if not _DNS_1123_LABEL.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} is not a DNS-1123 label")
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


# -- files -----------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    """Replace ``path`` with ``data`` at ``mode``; readers see the old or the new file."""
    # mkstemp creates the file 0600, so a key is never readable by others, not even
    # for the moment before a chmod; rename makes readers see the old or the new file.
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise CertificateError(path, f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
            os.fchmod(file.fileno(), mode)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise CertificateError(path, f"cannot write: {exc.strerror or exc}") from None


def _make_directory(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CertificateError(
            directory, f"cannot create directory: {exc.strerror or exc}"
        ) from None


def write_files(directory: str | os.PathLike[str], *, ca: KeyPair, serving: KeyPair) -> CertPaths:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (mode 0600), each atomically."""
    paths = CertPaths.in_directory(directory)
    _make_directory(Path(directory))
    write_atomic(paths.ca_file, ca.cert_pem(), mode=0o644)
    write_atomic(paths.key_file, serving.key_pem(), mode=0o600)
    write_atomic(paths.cert_file, serving.cert_pem(), mode=0o644)
    return paths


def issue_service_certificates(
    directory: str | os.PathLike[str],
    *,
    service: str,
    namespace: str,
    valid_for: timedelta,
    key_type: KeyType = "ecdsa-p256",
) -> tuple[CertPaths, KeyPair]:
    """A fresh CA and a serving certificate for a Service, written to ``directory``.

    Returns the paths and the serving pair. ``ca.crt`` is what goes into the webhook
    configurations' ``caBundle``.
    """
    names = service_dns_names(service, namespace)
    ca = generate_ca(
        common_name=f"gpushare-webhook CA {service}.{namespace}"[:_MAX_COMMON_NAME],
        valid_for=valid_for,
        key_type=key_type,
    )
    serving = generate_serving(
        ca=ca, dns_names=names, ip_addresses=(), valid_for=valid_for, key_type=key_type
    )
    return write_files(directory, ca=ca, serving=serving), serving


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    # Several workers starting at once must not interleave two generations' files.
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _split_sans(sans: Iterable[str]) -> tuple[list[str], list[IPAddress]]:
    names: list[str] = []
    ips: list[IPAddress] = []
    for san in sans:
        try:
            ip = ipaddress.ip_address(san)
        except ValueError:
            if san not in names:
                names.append(san)
        else:
            if ip not in ips:
                ips.append(ip)
    return names, ips


def _dev_certificates_problem(
    paths: CertPaths, *, names: list[str], ips: list[IPAddress]
) -> str | None:
    """Why the certificates in ``paths`` cannot be reused, or None when they can."""
    try:
        ca = _parse_certificates(paths.ca_file, _read(paths.ca_file))[0]
        leaf = _parse_certificates(paths.cert_file, _read(paths.cert_file))[0]
        _check_key_matches(paths.cert_file, leaf, _parse_key(paths.key_file, _read(paths.key_file)))
    except CertificateError as exc:
        return str(exc)
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"{paths.cert_file}: not issued by {paths.ca_file}"
    now = datetime.now(UTC)
    if leaf.not_valid_before_utc > now:
        return f"{paths.cert_file}: not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M}Z"
    if leaf.not_valid_after_utc - now <= DEV_MIN_REMAINING:
        return f"{paths.cert_file}: expires {leaf.not_valid_after_utc:%Y-%m-%d %H:%M}Z"
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return f"{paths.cert_file}: no subjectAltName"
    missing = [n for n in names if n not in san.get_values_for_type(x509.DNSName)]
    missing += [str(ip) for ip in ips if ip not in san.get_values_for_type(x509.IPAddress)]
    if missing:
        return f"{paths.cert_file}: does not cover {', '.join(missing)}"
    return None


def ensure_dev_certificates(
    directory: str | os.PathLike[str], *, extra_sans: Iterable[str] = ()
) -> CertPaths:
    """Reuse the development certificates in ``directory`` or issue new ones.

    They are reused when the serving certificate is signed by ``ca.crt``, matches
    ``tls.key``, stays valid for more than :data:`DEV_MIN_REMAINING` and covers
    localhost, 127.0.0.1 and ``extra_sans`` (IP literals as IP addresses). Otherwise a
    new CA and serving certificate replace them, so clients must trust the new ``ca.crt``.
    """
    base = Path(directory)
    paths = CertPaths.in_directory(base)
    extra = list(extra_sans)
    _make_directory(base)
    with _locked(base):
        required_names, required_ips = _split_sans([*_DEV_REQUIRED_SANS, *extra])
        problem = _dev_certificates_problem(paths, names=required_names, ips=required_ips)
        if problem is None:
            return paths
        log.info("issuing development certificates in %s (%s)", base, problem)
        names, ips = _split_sans([*DEV_SANS, *extra])
        ca = generate_ca(common_name="gpushare-webhook development CA", valid_for=DEV_VALIDITY)
        serving = generate_serving(ca=ca, dns_names=names, ip_addresses=ips, valid_for=DEV_VALIDITY)
        return write_files(base, ca=ca, serving=serving)


# -- SSL contexts ----------------------------------------------------------------------


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CertificateError(path, "file not found") from None
    except OSError as exc:
        raise CertificateError(path, f"cannot read: {exc.strerror or exc}") from None


def _parse_certificates(path: Path, data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateError(path, "not a PEM certificate (or chain)") from None


def _parse_key(path: Path, data: bytes) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        # Caught here because OpenSSL would otherwise prompt for a passphrase on the TTY.
        raise CertificateError(
            path, "the private key is encrypted; a plain key is required"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise CertificateError(path, "not a PEM private key") from None


def _check_key_matches(path: Path, leaf: x509.Certificate, key: PrivateKeyTypes) -> None:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        certified = leaf.public_key().public_bytes(*spki)
    except (ValueError, UnsupportedAlgorithm):
        raise CertificateError(path, "the certificate's public key type is not supported") from None
    if certified != key.public_key().public_bytes(*spki):
        raise CertificateError(path, "the private key does not match the certificate")


def _check_validity(path: Path, leaf: x509.Certificate) -> None:
    now = datetime.now(UTC)
    if now > leaf.not_valid_after_utc:
        raise CertificateError(
            path, f"certificate expired at {leaf.not_valid_after_utc:%Y-%m-%d %H:%M:%S}Z"
        )
    if now < leaf.not_valid_before_utc:
        raise CertificateError(
            path, f"certificate not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M:%S}Z"
        )


@dataclass(frozen=True, slots=True)
class _Material:
    cert: bytes
    key: bytes
    client_ca: bytes | None


@dataclass(frozen=True, slots=True)
class _Loaded:
    context: ssl.SSLContext
    leaf: x509.Certificate
    material: _Material


def _read_material(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> _Material:
    return _Material(
        _read(cert_file), _read(key_file), None if client_ca_file is None else _read(client_ca_file)
    )


def _load(
    cert_file: Path, key_file: Path, client_ca_file: Path | None, material: _Material
) -> _Loaded:
    leaf = _parse_certificates(cert_file, material.cert)[0]
    _check_key_matches(key_file, leaf, _parse_key(key_file, material.key))
    _check_validity(cert_file, leaf)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise CertificateError(cert_file, f"cannot load with {key_file}: {exc}") from None
    if client_ca_file is not None and material.client_ca is not None:
        _parse_certificates(client_ca_file, material.client_ca)
        try:
            context.load_verify_locations(cadata=material.client_ca.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError) as exc:
            raise CertificateError(client_ca_file, f"cannot load CA: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    # load_cert_chain reads the files again by path; a writer in between would leave
    # a context holding a pair that was never checked.
    if _read(cert_file) != material.cert or _read(key_file) != material.key:
        raise CertificateError(cert_file, "changed while being loaded")
    return _Loaded(context, leaf, material)


def build_server_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    *,
    client_ca_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A TLS 1.2+ server context; with ``client_ca_file``, clients must present a
    certificate signed by that CA (mutual TLS with the apiserver).

    Raises :class:`CertificateError` for a missing or unparseable file, a key that
    does not match the certificate, or a certificate outside its validity period.
    """
    cert, key = Path(cert_file), Path(key_file)
    client_ca = None if client_ca_file is None else Path(client_ca_file)
    return _load(cert, key, client_ca, _read_material(cert, key, client_ca)).context


# -- reload ----------------------------------------------------------------------------

_Signature = tuple[Fingerprint, ...]


class CertificateReloader:
    """Serves the newest valid certificate pair without restarting or dropping connections.

    Hand :attr:`server_context` to the server once. Each new handshake is moved to
    the context in force via ``sni_callback`` (OpenSSL calls it for every ClientHello,
    with or without SNI); established connections keep the context they started with.
    A new pair is loaded into a new context and checked before it is put in force,
    because ``load_cert_chain`` on a live context leaves it broken when the pair is bad.
    """

    def __init__(
        self,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        *,
        client_ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._cert_file = Path(cert_file)
        self._key_file = Path(key_file)
        self._client_ca_file = None if client_ca_file is None else Path(client_ca_file)
        # Taken before reading, so a change made while loading is seen by the next poll.
        self._signature = self._files_signature()
        self._last_seen = self._signature
        self._current = self._load_files()
        self._reloads_ok = 0
        self._reloads_failed = 0
        # The outer context decides what the per-connection switch cannot change
        # (protocol versions, whether a client certificate is requested), so it is
        # built by the same function as every context that replaces it.
        self._outer = self._load_files().context
        self._outer.sni_callback = self._select_context

    @property
    def server_context(self) -> ssl.SSLContext:
        return self._outer

    @property
    def not_after(self) -> datetime:
        """Expiry of the serving certificate in force."""
        return self._current.leaf.not_valid_after_utc

    @property
    def serial_number(self) -> int:
        return self._current.leaf.serial_number

    @property
    def reloads_ok(self) -> int:
        return self._reloads_ok

    @property
    def reloads_failed(self) -> int:
        return self._reloads_failed

    def _select_context(
        self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext
    ) -> None:
        ssl_object.context = self._current.context

    def _load_files(self) -> _Loaded:
        paths = self._cert_file, self._key_file, self._client_ca_file
        return _load(*paths, _read_material(*paths))

    def _files_signature(self) -> _Signature:
        return tuple(
            fingerprint(path) for path in (self._cert_file, self._key_file, self._client_ca_file)
        )

    def reload(self) -> bool:
        """Load the files again; True when a new pair is now in force.

        A pair that cannot be used is logged and counted; the one in force stays.
        """
        self._signature = self._files_signature()
        try:
            material = _read_material(self._cert_file, self._key_file, self._client_ca_file)
            if material == self._current.material:
                return False
            loaded = _load(self._cert_file, self._key_file, self._client_ca_file, material)
        # Whatever goes wrong with new files, the pair in force keeps serving.
        except Exception as exc:
            self._reloads_failed += 1
            log.error(
                "certificate reload failed, still serving serial %x (expires %s): %s",
                self.serial_number,
                self.not_after.isoformat(),
                exc,
                exc_info=not isinstance(exc, CertificateError),
            )
            return False
        self._current = loaded
        self._reloads_ok += 1
        log.info(
            "serving certificate serial %x (expires %s)",
            self.serial_number,
            self.not_after.isoformat(),
        )
        return True

    def poll(self) -> bool:
        """One look at the files; reload when they changed and have since settled.

        A change is acted on once the files look the same on two polls in a row, so
        a writer that replaces the certificate and the key one after the other is
        not caught halfway (which would count as a failed reload). True when a new
        pair was put in force.
        """
        signature = self._files_signature()
        settled = signature == self._last_seen
        self._last_seen = signature
        if settled and signature != self._signature:
            return self.reload()
        return False

    async def watch(self, interval: float) -> None:
        """:meth:`poll` every ``interval`` seconds until cancelled."""
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        while True:
            await asyncio.sleep(interval)
            self.poll()
