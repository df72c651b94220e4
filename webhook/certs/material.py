"""Certificate material: the files a webhook serves from, and the checks on reading them.

File names follow ``kubernetes.io/tls`` Secrets and cert-manager (``ca.crt``,
``tls.crt``, ``tls.key``), so a Secret mounted as a volume is read as is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

CA_FILE: Final = "ca.crt"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"


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


def read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CertificateError(path, "file not found") from None
    except OSError as exc:
        raise CertificateError(path, f"cannot read: {exc.strerror or exc}") from None


def parse_certificates(path: Path, data: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateError(path, "not a PEM certificate (or chain)") from None


def parse_key(path: Path, data: bytes) -> PrivateKeyTypes:
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        # Caught here because OpenSSL would otherwise prompt for a passphrase on the TTY.
        raise CertificateError(
            path, "the private key is encrypted; a plain key is required"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise CertificateError(path, "not a PEM private key") from None


def check_key_matches(path: Path, leaf: x509.Certificate, key: PrivateKeyTypes) -> None:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        certified = leaf.public_key().public_bytes(*spki)
    except (ValueError, UnsupportedAlgorithm):
        raise CertificateError(path, "the certificate's public key type is not supported") from None
    if certified != key.public_key().public_bytes(*spki):
        raise CertificateError(path, "the private key does not match the certificate")


def check_validity(path: Path, leaf: x509.Certificate) -> None:
    now = datetime.now(UTC)
    if now > leaf.not_valid_after_utc:
        raise CertificateError(
            path, f"certificate expired at {leaf.not_valid_after_utc:%Y-%m-%d %H:%M:%S}Z"
        )
    if now < leaf.not_valid_before_utc:
        raise CertificateError(
            path, f"certificate not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M:%S}Z"
        )
