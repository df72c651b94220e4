"""Issuing keys and certificates: a CA and the serving certificates it signs.

The apiserver only talks to a webhook over TLS, and it pins the CA it was given in
the webhook configuration's ``caBundle``. The CA's private key is never written by
the development path: nothing else can be signed with it later.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, get_args

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.certs.material import KeyPair, PrivateKey

KeyType = Literal["ecdsa-p256", "rsa-2048"]
KEY_TYPES: Final[tuple[KeyType, ...]] = get_args(KeyType)
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Backdating absorbs clock skew between the host that issues and the apiserver that verifies.
_BACKDATE: Final = timedelta(minutes=5)
# RFC 5280 caps commonName at 64 characters; longer names live only in the SAN.
MAX_COMMON_NAME: Final = 64
_DNS_1035_LABEL: Final = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _new_key(key_type: KeyType) -> PrivateKey:
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa-2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unknown key type {key_type!r}, expected one of {', '.join(KEY_TYPES)}")


def _name(common_name: str) -> x509.Name:
    if not common_name or len(common_name) > MAX_COMMON_NAME:
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
        raise ValueError(f"a CA needs a common name of 1..{MAX_COMMON_NAME} characters")
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


def _issue_serving(
    *,
    ca: KeyPair,
    common_name: str,
    sans: list[x509.GeneralName],
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
    cert = (
        # RFC 5280 4.2.1.6: with an empty subject the SAN must be critical.
        builder.add_extension(x509.SubjectAlternativeName(sans), critical=not subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            # RSA key exchange (TLS 1.2 without ECDHE) encrypts to the key itself.
            _key_usage(digital_signature=True, key_encipherment=isinstance(key, rsa.RSAPrivateKey)),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
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
    return _issue_serving(
        ca=ca,
        common_name=names[0] if names else str(ips[0]),
        sans=sans,
        valid_for=valid_for,
        key_type=key_type,
        now=now,
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
