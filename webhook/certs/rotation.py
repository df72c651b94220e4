"""When to issue, renew and roll the self-managed certificates, decided without I/O.

The self-managed mode keeps a CA and the serving certificate in one Secret
(:mod:`webhook.certs.selfmanaged` reads and writes it); this module only looks at the
Secret's content and a clock and says what the content should be next:

- nothing usable: a new CA and a serving certificate signed by it;
- the serving certificate ends within ``leaf_renew_before``, is not signed by the
  current CA, or lacks one of the Service's DNS names: a new one from the same CA;
- the CA ends within ``ca_renew_before`` (or its key is lost): a new CA, and the
  bundle becomes new CA + old CA. The serving certificate signed by the old CA is
  kept for this step when it is still good, and replaced on the next one: by then
  the webhook configurations carry the new bundle, so no replica ever presents a
  certificate the apiserver cannot verify. A replica that still serves the old
  certificate verifies against the new bundle too;
- the old CA leaves the bundle once it has expired or ``old_ca_grace`` after the roll
  (the roll time is an annotation on the Secret).

Applying :func:`decide` again to its own output converges in at most two steps.

Secret layout (``kubernetes.io/tls`` compatible): ``tls.crt``, ``tls.key`` (serving
pair), ``ca.crt``, ``ca.key`` (current CA), ``ca-bundle.crt`` (what the webhook
configurations' ``caBundle`` holds: current CA, then the previous one during a roll).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from webhook.certs.issue import KeyType, generate_ca, generate_serving, service_dns_names
from webhook.certs.material import KeyPair, PrivateKey

CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
SERVING_CERT: Final = "tls.crt"
SERVING_KEY: Final = "tls.key"
CA_BUNDLE: Final = "ca-bundle.crt"
ROLLED_AT: Final = "gpushare.io/ca-rolled-at"

# A serving certificate kept through a CA roll must outlive the step after it.
_KEEP_THROUGH_ROLL: Final = timedelta(hours=1)
_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    """Validity periods and renewal margins (defaults: leaf 90 d renewed 30 d before
    expiry, CA 365 d rolled 60 d before, old CA kept 7 d after a roll)."""

    leaf_valid_for: timedelta = timedelta(days=90)
    leaf_renew_before: timedelta = timedelta(days=30)
    ca_valid_for: timedelta = timedelta(days=365)
    ca_renew_before: timedelta = timedelta(days=60)
    old_ca_grace: timedelta = timedelta(days=7)
    key_type: KeyType = "ecdsa-p256"

    def __post_init__(self) -> None:
        zero = timedelta(0)
        if not zero < self.leaf_renew_before < self.leaf_valid_for:
            raise ValueError("leaf_renew_before must be positive and shorter than leaf_valid_for")
        if not zero < self.ca_renew_before < self.ca_valid_for:
            raise ValueError("ca_renew_before must be positive and shorter than ca_valid_for")
        # A serving certificate never outlives its CA; were its margin the longer one,
        # every certificate issued late in a CA's life would be due at once, forever.
        if self.leaf_renew_before >= self.ca_renew_before:
            raise ValueError("leaf_renew_before must be shorter than ca_renew_before")
        if self.old_ca_grace < zero:
            raise ValueError("old_ca_grace must not be negative")


@dataclass(frozen=True, slots=True)
class Material:
    """What a Secret holds, parsed; a part that cannot be read is None and named in
    :attr:`problems`."""

    ca_cert: x509.Certificate | None = None
    ca_key: PrivateKey | None = None
    serving_cert: x509.Certificate | None = None
    serving_key: PrivateKey | None = None
    previous_ca: x509.Certificate | None = None
    rolled_at: datetime | None = None
    problems: tuple[str, ...] = ()

    @classmethod
    def from_secret(cls, data: Mapping[str, bytes], annotations: Mapping[str, str]) -> Material:
        problems: list[str] = []
        ca_cert = _certificate(data, CA_CERT, problems)
        serving_cert = _certificate(data, SERVING_CERT, problems)
        previous = None
        for cert in _bundle(data, problems):
            if ca_cert is None or cert != ca_cert:
                previous = cert
                break
        rolled_at = None
        raw = annotations.get(ROLLED_AT)
        if raw is not None:
            try:
                rolled_at = datetime.fromisoformat(raw)
            except ValueError:
                problems.append(f"annotation {ROLLED_AT}: not a time: {raw!r}")
            else:
                if rolled_at.tzinfo is None:
                    problems.append(f"annotation {ROLLED_AT}: no time zone: {raw!r}")
                    rolled_at = None
        return cls(
            ca_cert=ca_cert,
            ca_key=_key(data, CA_KEY, problems),
            serving_cert=serving_cert,
            serving_key=_key(data, SERVING_KEY, problems),
            previous_ca=previous,
            rolled_at=rolled_at,
            problems=tuple(problems),
        )

    @property
    def ca(self) -> KeyPair | None:
        if self.ca_cert is None or self.ca_key is None:
            return None
        return KeyPair(self.ca_cert, self.ca_key)

    @property
    def serving(self) -> KeyPair | None:
        """The serving pair, when both parts are present and belong together."""
        if self.serving_cert is None or self.serving_key is None:
            return None
        if not _key_matches(self.serving_cert, self.serving_key):
            return None
        return KeyPair(self.serving_cert, self.serving_key)

    def bundle(self) -> list[x509.Certificate]:
        """The CAs the apiserver must trust: the current one, then the previous one."""
        return [c for c in (self.ca_cert, self.previous_ca) if c is not None]

    def secret_data(self) -> dict[str, bytes]:
        """The Secret's data; only for complete material (what :func:`decide` returns)."""
        ca, serving = self.ca, self.serving
        if ca is None or serving is None:
            raise ValueError("incomplete material: a CA and a serving pair are required")
        return {
            CA_CERT: ca.cert_pem(),
            CA_KEY: ca.key_pem(),
            SERVING_CERT: serving.cert_pem(),
            SERVING_KEY: serving.key_pem(),
            CA_BUNDLE: b"".join(_pem(c) for c in self.bundle()),
        }

    def annotations(self) -> dict[str, str]:
        """This module's annotations on the Secret (none outside a CA roll)."""
        if self.rolled_at is None:
            return {}
        return {ROLLED_AT: self.rolled_at.strftime(_TIME_FORMAT)}


@dataclass(frozen=True, slots=True)
class Decision:
    """The Secret's next content. ``changed`` when ``data`` or ``annotations`` differ
    from what was read; ``reasons`` says what was done and why, for the log."""

    material: Material
    data: dict[str, bytes]
    annotations: dict[str, str]
    changed: bool
    reasons: tuple[str, ...]


def parse_bundle(pem: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM bundle; empty when it holds none or is not PEM."""
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def decide(
    data: Mapping[str, bytes],
    annotations: Mapping[str, str],
    *,
    service: str,
    namespace: str,
    now: datetime,
    policy: RotationPolicy | None = None,
) -> Decision:
    """The next content of the Secret holding ``data`` and ``annotations`` at ``now``."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    policy = policy or RotationPolicy()
    names = service_dns_names(service, namespace)
    material = Material.from_secret(data, annotations)
    reasons = [f"ignored {problem}" for problem in material.problems]
    trust = _renew_ca(material, now=now, policy=policy, reasons=reasons)
    serving = _renew_serving(material, trust, names=names, now=now, policy=policy, reasons=reasons)
    previous, rolled_at = _retire_old_ca(
        trust, serving, now=now, grace=policy.old_ca_grace, reasons=reasons
    )
    result = Material(
        ca_cert=trust.ca.cert,
        ca_key=trust.ca.key,
        serving_cert=serving.cert,
        serving_key=serving.key,
        previous_ca=previous,
        rolled_at=rolled_at,
    )
    return _compare_with_secret(result, data=data, annotations=annotations, reasons=reasons)


# -- the steps -------------------------------------------------------------------------
# Each appends to ``reasons`` what it did, in the order the log should tell it.


@dataclass(frozen=True, slots=True, kw_only=True)
class _Trust:
    """The CA after its renewal check, and the previous CA the bundle still holds."""

    ca: KeyPair
    previous: x509.Certificate | None
    rolled_at: datetime | None
    # Set only in the step that rolls: the old CA's serving certificate may then stay.
    rolled: bool = False


def _renew_ca(
    material: Material, *, now: datetime, policy: RotationPolicy, reasons: list[str]
) -> _Trust:
    """Keep the CA, or issue a new one when it is unusable or due (rolling when the old
    one is still valid)."""
    ca = material.ca
    problem = _ca_problem(material, now=now)
    if problem is None and ca is not None and _due(ca.cert, now, policy.ca_renew_before):
        problem = _expiry(ca.cert, now)
    if problem is None:
        assert ca is not None
        return _Trust(ca=ca, previous=material.previous_ca, rolled_at=material.rolled_at)
    new = generate_ca(
        common_name=f"gpushare-webhook CA {now:%Y-%m-%d %H:%M:%S}",
        valid_for=policy.ca_valid_for,
        key_type=policy.key_type,
        now=now,
    )
    old = material.ca_cert
    if old is not None and old.not_valid_after_utc > now:
        # Replicas still present certificates the old CA signed: keep trusting it.
        reasons.append(f"rolled the CA ({problem}); the bundle holds the new and the old")
        return _Trust(ca=new, previous=old, rolled_at=now, rolled=True)
    reasons.append(f"issued a CA ({problem})")
    return _Trust(ca=new, previous=None, rolled_at=None)


def _renew_serving(
    material: Material,
    trust: _Trust,
    *,
    names: Sequence[str],
    now: datetime,
    policy: RotationPolicy,
    reasons: list[str],
) -> KeyPair:
    """Keep the serving pair, or issue one from the current CA when it is unusable or due."""
    problem = _serving_problem(
        material, trust.ca.cert, names, now=now, renew_before=policy.leaf_renew_before
    )
    if problem is None:
        assert material.serving is not None
        return material.serving
    if _keeps_through_roll(material, trust, names=names, now=now):
        reasons.append(
            "kept the serving certificate of the old CA until the new bundle is published"
        )
        assert material.serving is not None
        return material.serving
    serving = generate_serving(
        ca=trust.ca,
        dns_names=names,
        ip_addresses=(),
        valid_for=policy.leaf_valid_for,
        key_type=policy.key_type,
        now=now,
    )
    reasons.append(f"issued a serving certificate ({problem})")
    return serving


def _keeps_through_roll(
    material: Material, trust: _Trust, *, names: Sequence[str], now: datetime
) -> bool:
    # The apiserver trusts the new CA only once the next check has published the bundle.
    return (
        trust.rolled
        and trust.previous is not None
        and _serving_problem(
            material, trust.previous, names, now=now, renew_before=_KEEP_THROUGH_ROLL
        )
        is None
    )


def _retire_old_ca(
    trust: _Trust, serving: KeyPair, *, now: datetime, grace: timedelta, reasons: list[str]
) -> tuple[x509.Certificate | None, datetime | None]:
    """The previous CA and roll time to keep: none once the old CA expired, or ``grace``
    after the roll when the serving certificate no longer needs it."""
    previous, rolled_at = trust.previous, trust.rolled_at
    if previous is None:
        return None, None
    if previous.not_valid_after_utc <= now:
        reasons.append(f"dropped the old CA: it expired {_when(previous.not_valid_after_utc)}")
        return None, None
    if rolled_at is None:
        # Someone removed the roll time: keeping the old CA longer is always safe.
        reasons.append(f"found an old CA with no {ROLLED_AT}: kept from now on")
        return previous, now
    if now - rolled_at >= grace and not _signed_by(serving.cert, previous):
        reasons.append(f"dropped the old CA: the roll at {_when(rolled_at)} is over")
        return None, None
    return previous, rolled_at


def _compare_with_secret(
    result: Material,
    *,
    data: Mapping[str, bytes],
    annotations: Mapping[str, str],
    reasons: list[str],
) -> Decision:
    """``result`` as the Secret's next content, changed when it differs from what was read."""
    out_data = result.secret_data()
    out_annotations = result.annotations()
    changed = any(data.get(key) != value for key, value in out_data.items()) or annotations.get(
        ROLLED_AT
    ) != out_annotations.get(ROLLED_AT)
    return Decision(
        material=result,
        data=out_data,
        annotations=out_annotations,
        changed=changed,
        reasons=tuple(reasons),
    )


# -- checks ----------------------------------------------------------------------------


def _ca_problem(material: Material, *, now: datetime) -> str | None:
    cert, key = material.ca_cert, material.ca_key
    if cert is None:
        return f"no {CA_CERT}"
    if key is None:
        return f"no {CA_KEY}"
    if not _key_matches(cert, key):
        return f"{CA_KEY} does not match {CA_CERT}"
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return f"{CA_CERT} is not a CA"
    if not constraints.ca:
        return f"{CA_CERT} is not a CA"
    if cert.not_valid_before_utc > now:
        return f"{CA_CERT} is not valid before {_when(cert.not_valid_before_utc)}"
    if cert.not_valid_after_utc <= now:
        return f"{CA_CERT} expired {_when(cert.not_valid_after_utc)}"
    return None


def _serving_problem(
    material: Material,
    ca: x509.Certificate,
    names: Sequence[str],
    *,
    now: datetime,
    renew_before: timedelta,
) -> str | None:
    cert = material.serving_cert
    if cert is None or material.serving_key is None:
        return f"no {SERVING_CERT} and {SERVING_KEY}"
    if material.serving is None:
        return f"{SERVING_KEY} does not match {SERVING_CERT}"
    if not _signed_by(cert, ca):
        return "not signed by the current CA"
    if cert.not_valid_before_utc > now:
        return f"not valid before {_when(cert.not_valid_before_utc)}"
    if _due(cert, now, renew_before):
        return _expiry(cert, now)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "no subjectAltName"
    missing = [name for name in names if name not in san.get_values_for_type(x509.DNSName)]
    if missing:
        return f"does not cover {', '.join(missing)}"
    return None


def _due(cert: x509.Certificate, now: datetime, margin: timedelta) -> bool:
    return cert.not_valid_after_utc - now <= margin


def _expiry(cert: x509.Certificate, now: datetime) -> str:
    tense = "expired" if cert.not_valid_after_utc <= now else "expires"
    return f"it {tense} {_when(cert.not_valid_after_utc)}"


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        return cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)
    except (ValueError, UnsupportedAlgorithm):
        return False


# -- parsing ---------------------------------------------------------------------------


def _certificate(
    data: Mapping[str, bytes], name: str, problems: list[str]
) -> x509.Certificate | None:
    raw = data.get(name)
    if raw is None:
        return None
    try:
        return x509.load_pem_x509_certificate(raw)
    except ValueError:
        problems.append(f"{name}: not a PEM certificate")
        return None


def _key(data: Mapping[str, bytes], name: str, problems: list[str]) -> PrivateKey | None:
    raw = data.get(name)
    if raw is None:
        return None
    key = None
    with contextlib.suppress(ValueError, TypeError, UnsupportedAlgorithm):
        key = serialization.load_pem_private_key(raw, password=None)
    if isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        return key
    problems.append(f"{name}: not an unencrypted PEM ECDSA or RSA key")
    return None


def _bundle(data: Mapping[str, bytes], problems: list[str]) -> list[x509.Certificate]:
    raw = data.get(CA_BUNDLE)
    if raw is None:
        return []
    certs = parse_bundle(raw)
    if not certs:
        problems.append(f"{CA_BUNDLE}: not a PEM certificate bundle")
    return certs


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")
