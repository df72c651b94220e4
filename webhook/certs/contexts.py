"""SSL contexts: TLS 1.2+ server contexts, and swapping in renewed certificates live.

Renewed certificates (cert-manager, a rotated Secret) are put in force while
connections stay open.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509

from webhook.certs.material import (
    CertificateError,
    check_key_matches,
    check_validity,
    parse_certificates,
    parse_key,
    read_file,
)
from webhook.files import Fingerprint, fingerprint

log = logging.getLogger(__name__)


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
        read_file(cert_file),
        read_file(key_file),
        None if client_ca_file is None else read_file(client_ca_file),
    )


def _load(
    cert_file: Path, key_file: Path, client_ca_file: Path | None, material: _Material
) -> _Loaded:
    leaf = parse_certificates(cert_file, material.cert)[0]
    check_key_matches(key_file, leaf, parse_key(key_file, material.key))
    check_validity(cert_file, leaf)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise CertificateError(cert_file, f"cannot load with {key_file}: {exc}") from None
    if client_ca_file is not None and material.client_ca is not None:
        parse_certificates(client_ca_file, material.client_ca)
        try:
            context.load_verify_locations(cadata=material.client_ca.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError) as exc:
            raise CertificateError(client_ca_file, f"cannot load CA: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    # load_cert_chain reads the files again by path; a writer in between would leave
    # a context holding a pair that was never checked.
    if read_file(cert_file) != material.cert or read_file(key_file) != material.key:
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
