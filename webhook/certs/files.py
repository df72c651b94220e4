"""Certificates on disk: writing a pair atomically, and development certificates.

:func:`ensure_dev_certificates` gives a laptop a CA and a serving certificate that
are reused while they are valid; :func:`issue_service_certificates` is ``certs
generate`` for a cluster's Service.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from webhook.certs.issue import (
    MAX_COMMON_NAME,
    IPAddress,
    KeyType,
    generate_ca,
    generate_serving,
    service_dns_names,
)
from webhook.certs.material import (
    CertificateError,
    CertPaths,
    KeyPair,
    check_key_matches,
    parse_certificates,
    parse_key,
    read_file,
)
from webhook.files import write_atomic

log = logging.getLogger(__name__)

DEV_VALIDITY: Final = timedelta(days=365)
# A certificate that expires within a day would lapse during a working session.
DEV_MIN_REMAINING: Final = timedelta(days=1)
DEV_SANS: Final = ("localhost", "127.0.0.1", "::1")
# ::1 is issued but not required: hosts without IPv6 still reuse their certificates.
_DEV_REQUIRED_SANS: Final = ("localhost", "127.0.0.1")


def _write(path: Path, data: bytes, *, mode: int) -> None:
    try:
        write_atomic(path, data, mode=mode)
    except OSError as exc:
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
    _write(paths.ca_file, ca.cert_pem(), mode=0o644)
    _write(paths.key_file, serving.key_pem(), mode=0o600)
    _write(paths.cert_file, serving.cert_pem(), mode=0o644)
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
        common_name=f"gpushare-webhook CA {service}.{namespace}"[:MAX_COMMON_NAME],
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
        ca = parse_certificates(paths.ca_file, read_file(paths.ca_file))[0]
        leaf = parse_certificates(paths.cert_file, read_file(paths.cert_file))[0]
        check_key_matches(
            paths.cert_file, leaf, parse_key(paths.key_file, read_file(paths.key_file))
        )
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
