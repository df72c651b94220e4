"""The self-managed certificate decisions, on a clock the tests move."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.x509 import DNSName
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from webhook.certs.issue import generate_ca, generate_serving, service_dns_names
from webhook.certs.material import KeyPair
from webhook.certs.rotation import (
    CA_BUNDLE,
    CA_CERT,
    CA_KEY,
    ROLLED_AT,
    SERVING_CERT,
    SERVING_KEY,
    Decision,
    Material,
    RotationPolicy,
    decide,
    parse_bundle,
)

SERVICE = "gpushare-webhook"
NAMESPACE = "gpushare-system"
# What the apiserver dials: https://<service>.<namespace>.svc
HOST = f"{SERVICE}.{NAMESPACE}.svc"
T0 = datetime(2030, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
# Spelled out here, not taken from the code under test, so a key it drops is noticed.
SECRET_KEYS = (CA_CERT, CA_KEY, SERVING_CERT, SERVING_KEY, CA_BUNDLE)


@dataclass
class Secret:
    data: dict[str, bytes] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def apply(self, at: datetime, policy: RotationPolicy | None = None) -> Decision:
        decision = decide(
            self.data, self.annotations, service=SERVICE, namespace=NAMESPACE, now=at, policy=policy
        )
        self.data, self.annotations = dict(decision.data), dict(decision.annotations)
        return decision


def fresh() -> Secret:
    secret = Secret()
    secret.apply(T0)
    return secret


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def verifies(leaf_pem: bytes, bundle_pem: bytes, at: datetime) -> bool:
    """Whether a client trusting ``bundle_pem`` accepts ``leaf_pem`` for the Service at ``at``."""
    verifier = (
        PolicyBuilder()
        .store(Store(parse_bundle(bundle_pem)))
        .time(at)
        .build_server_verifier(DNSName(HOST))
    )
    try:
        verifier.verify(cert(leaf_pem), [])
    except VerificationError:
        return False
    return True


def until_roll(secret: Secret, *, policy: RotationPolicy | None = None) -> datetime:
    """Apply daily steps until the CA rolls; returns the day it did."""
    at = T0
    while True:
        at += DAY
        ca_before = secret.data[CA_CERT]
        secret.apply(at, policy)
        if secret.data[CA_CERT] != ca_before:
            return at


def test_fresh_secret_gets_everything() -> None:
    secret = Secret()
    decision = secret.apply(T0)
    assert decision.changed
    assert set(decision.data) == set(SECRET_KEYS)
    assert decision.data[CA_BUNDLE] == decision.data[CA_CERT]
    assert decision.annotations == {}
    assert any("issued a CA" in reason for reason in decision.reasons)
    leaf, ca = cert(decision.data[SERVING_CERT]), cert(decision.data[CA_CERT])
    assert verifies(decision.data[SERVING_CERT], decision.data[CA_BUNDLE], T0)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == service_dns_names(SERVICE, NAMESPACE)
    assert leaf.not_valid_after_utc == T0 + timedelta(days=90)
    assert ca.not_valid_after_utc == T0 + timedelta(days=365)
    material = decision.material
    assert material.ca is not None and material.serving is not None
    assert material.serving.key_pem() == decision.data[SERVING_KEY]
    assert material.ca.key_pem() == decision.data[CA_KEY]


def test_nothing_to_do_while_valid() -> None:
    secret = fresh()
    before = dict(secret.data)
    for days in (1, 30, 59):
        decision = secret.apply(T0 + days * DAY)
        assert not decision.changed, decision.reasons
        assert decision.reasons == ()
        assert secret.data == before


def test_leaf_renewed_before_expiry_keeps_the_ca() -> None:
    secret = fresh()
    before = dict(secret.data)
    at = T0 + 61 * DAY  # 29 days left, renewed 30 days before
    decision = secret.apply(at)
    assert decision.changed
    assert decision.data[SERVING_CERT] != before[SERVING_CERT]
    assert decision.data[SERVING_KEY] != before[SERVING_KEY]
    for key in (CA_CERT, CA_KEY, CA_BUNDLE):
        assert decision.data[key] == before[key]
    assert cert(decision.data[SERVING_CERT]).not_valid_after_utc == at + timedelta(days=90)
    assert verifies(decision.data[SERVING_CERT], decision.data[CA_BUNDLE], at)
    assert any("it expires" in reason for reason in decision.reasons)


def test_ca_roll_publishes_new_and_old_before_switching_the_leaf() -> None:
    secret = fresh()
    at = T0 + 300 * DAY
    secret.apply(at)  # the leaf is renewed on the way
    old = dict(secret.data)
    at = T0 + 306 * DAY  # the CA has 59 days left: within 60
    rolled = secret.apply(at)
    assert rolled.changed
    bundle = parse_bundle(rolled.data[CA_BUNDLE])
    assert bundle == [cert(rolled.data[CA_CERT]), cert(old[CA_CERT])]  # new first
    assert rolled.data[CA_KEY] != old[CA_KEY]
    assert rolled.annotations == {ROLLED_AT: at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    # Step one: the replicas keep presenting the old CA's certificate, which both the
    # old bundle (still in the apiserver) and the new one accept.
    assert rolled.data[SERVING_CERT] == old[SERVING_CERT]
    assert verifies(old[SERVING_CERT], old[CA_BUNDLE], at)
    assert verifies(old[SERVING_CERT], rolled.data[CA_BUNDLE], at)
    assert any("kept the serving certificate" in reason for reason in rolled.reasons)

    # Step two, once the new bundle is published: a certificate from the new CA.
    switched = secret.apply(at + timedelta(minutes=1))
    assert switched.changed
    assert switched.data[CA_BUNDLE] == rolled.data[CA_BUNDLE]
    assert switched.data[CA_CERT] == rolled.data[CA_CERT]
    new_leaf = switched.data[SERVING_CERT]
    assert new_leaf != old[SERVING_CERT]
    assert cert(new_leaf).issuer == cert(rolled.data[CA_CERT]).subject
    assert verifies(new_leaf, switched.data[CA_BUNDLE], at)
    # Why it had to wait: an apiserver holding only the old bundle refuses it...
    assert not verifies(new_leaf, old[CA_BUNDLE], at)
    # ...while a replica that has not picked it up yet is still accepted.
    assert verifies(old[SERVING_CERT], switched.data[CA_BUNDLE], at)

    settled = secret.apply(at + timedelta(minutes=2))
    assert not settled.changed


def test_a_leaf_too_close_to_expiry_is_not_kept_through_a_roll() -> None:
    secret = fresh()
    old = dict(secret.data)
    # Nothing ran for 320 days: the leaf expired long ago, the CA has 45 days left.
    at = T0 + 320 * DAY
    decision = secret.apply(at)
    assert decision.data[SERVING_CERT] != old[SERVING_CERT]
    assert len(parse_bundle(decision.data[CA_BUNDLE])) == 2
    assert verifies(decision.data[SERVING_CERT], decision.data[CA_BUNDLE], at)
    assert not secret.apply(at).changed


def test_old_ca_leaves_the_bundle_after_the_grace_period() -> None:
    secret = fresh()
    rolled_at = until_roll(secret)
    secret.apply(rolled_at)  # the leaf switches to the new CA
    assert len(parse_bundle(secret.data[CA_BUNDLE])) == 2
    decision = secret.apply(rolled_at + 6 * DAY)
    assert not decision.changed
    decision = secret.apply(rolled_at + 7 * DAY)
    assert decision.changed
    assert decision.data[CA_BUNDLE] == decision.data[CA_CERT]
    assert decision.annotations == {}
    assert any("roll at" in reason for reason in decision.reasons)
    assert verifies(decision.data[SERVING_CERT], decision.data[CA_BUNDLE], rolled_at + 7 * DAY)


def test_old_ca_leaves_the_bundle_when_it_expires() -> None:
    policy = RotationPolicy(old_ca_grace=timedelta(days=400))
    secret = fresh()
    rolled_at = until_roll(secret, policy=policy)
    old_ca = parse_bundle(secret.data[CA_BUNDLE])[1]
    secret.apply(rolled_at, policy)
    assert not secret.apply(old_ca.not_valid_after_utc - DAY, policy).changed
    decision = secret.apply(old_ca.not_valid_after_utc, policy)
    assert decision.changed
    assert decision.data[CA_BUNDLE] == decision.data[CA_CERT]
    assert any("expired" in reason for reason in decision.reasons)


def test_a_leaf_missing_a_service_name_is_reissued() -> None:
    secret = fresh()
    ca = Material.from_secret(secret.data, {}).ca
    assert ca is not None
    narrow = generate_serving(
        ca=ca, dns_names=[SERVICE], ip_addresses=(), valid_for=90 * DAY, now=T0
    )
    secret.data[SERVING_CERT], secret.data[SERVING_KEY] = narrow.cert_pem(), narrow.key_pem()
    decision = secret.apply(T0 + DAY)
    assert decision.changed
    assert decision.data[CA_CERT] == ca.cert_pem()
    assert decision.data[SERVING_CERT] != narrow.cert_pem()
    assert any(f"does not cover {SERVICE}.{NAMESPACE}" in r for r in decision.reasons)
    assert verifies(decision.data[SERVING_CERT], decision.data[CA_BUNDLE], T0 + DAY)


def test_a_leaf_from_another_ca_is_reissued() -> None:
    secret = fresh()
    stranger = generate_ca(common_name="someone else", valid_for=365 * DAY, now=T0)
    foreign = generate_serving(
        ca=stranger,
        dns_names=service_dns_names(SERVICE, NAMESPACE),
        ip_addresses=(),
        valid_for=90 * DAY,
        now=T0,
    )
    secret.data[SERVING_CERT], secret.data[SERVING_KEY] = foreign.cert_pem(), foreign.key_pem()
    decision = secret.apply(T0 + DAY)
    assert any("not signed by the current CA" in r for r in decision.reasons)
    assert verifies(decision.data[SERVING_CERT], decision.data[CA_BUNDLE], T0 + DAY)


def test_a_mismatched_serving_key_is_reissued() -> None:
    secret = fresh()
    other = fresh()
    secret.data[SERVING_KEY] = other.data[SERVING_KEY]
    decision = secret.apply(T0 + DAY)
    assert any(f"{SERVING_KEY} does not match" in r for r in decision.reasons)
    assert decision.material.serving is not None


def test_a_lost_ca_key_rolls_and_keeps_trusting_the_old_ca() -> None:
    secret = fresh()
    old = dict(secret.data)
    del secret.data[CA_KEY]
    at = T0 + DAY
    decision = secret.apply(at)
    assert any(f"rolled the CA (no {CA_KEY})" in r for r in decision.reasons)
    assert parse_bundle(decision.data[CA_BUNDLE])[1] == cert(old[CA_CERT])
    assert decision.data[SERVING_CERT] == old[SERVING_CERT]  # still trusted, switched next
    assert verifies(old[SERVING_CERT], decision.data[CA_BUNDLE], at)
    switched = secret.apply(at)
    assert verifies(switched.data[SERVING_CERT], switched.data[CA_BUNDLE], at)


def test_unreadable_content_starts_over() -> None:
    secret = Secret(
        data=dict.fromkeys(SECRET_KEYS, b"garbage"), annotations={ROLLED_AT: "yesterday"}
    )
    decision = secret.apply(T0)
    assert decision.changed
    for key in SECRET_KEYS:
        assert f"ignored {key}" in " ".join(decision.reasons)
    assert f"ignored annotation {ROLLED_AT}" in " ".join(decision.reasons)
    assert decision.annotations == {}
    assert verifies(decision.data[SERVING_CERT], decision.data[CA_BUNDLE], T0)


def test_an_old_ca_without_a_roll_time_is_kept_for_the_grace_period() -> None:
    secret = fresh()
    rolled_at = until_roll(secret)
    secret.apply(rolled_at)
    del secret.annotations[ROLLED_AT]
    later = rolled_at + 5 * DAY
    decision = secret.apply(later)
    assert decision.changed
    assert len(parse_bundle(decision.data[CA_BUNDLE])) == 2
    assert decision.annotations[ROLLED_AT] == later.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert len(parse_bundle(secret.apply(later + 7 * DAY).data[CA_BUNDLE])) == 1


def test_three_years_of_daily_checks_never_break_a_handshake() -> None:
    """Whatever a replica serves and whatever bundle the apiserver holds, one step
    apart in either direction, the handshake verifies."""
    secret = Secret()
    secret.apply(T0)
    rolls = renewals = 0
    at = T0
    while at < T0 + 3 * 365 * DAY:
        at += DAY
        before = dict(secret.data)
        decision = secret.apply(at)
        after = decision.data
        assert verifies(after[SERVING_CERT], after[CA_BUNDLE], at)
        # The apiserver may still hold the previous bundle while replicas switch...
        assert verifies(after[SERVING_CERT], before[CA_BUNDLE], at)
        # ...and a replica may still serve the previous certificate under the new bundle.
        assert verifies(before[SERVING_CERT], after[CA_BUNDLE], at)
        rolls += after[CA_CERT] != before[CA_CERT]
        renewals += after[SERVING_CERT] != before[SERVING_CERT]
    assert rolls == 3
    assert renewals > rolls * 2


def test_a_decision_is_stable_after_two_steps() -> None:
    secret = fresh()
    at = T0 + 340 * DAY  # CA and leaf both due
    assert secret.apply(at).changed
    secret.apply(at)
    assert not secret.apply(at).changed


def test_now_must_carry_a_time_zone() -> None:
    with pytest.raises(ValueError, match="timezone"):
        decide({}, {}, service=SERVICE, namespace=NAMESPACE, now=datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"leaf_renew_before": timedelta(days=90)}, "leaf_renew_before"),
        ({"leaf_renew_before": timedelta(0)}, "leaf_renew_before"),
        ({"ca_renew_before": timedelta(days=400)}, "ca_renew_before"),
        ({"leaf_renew_before": timedelta(days=70)}, "shorter than ca_renew_before"),
        ({"old_ca_grace": -DAY}, "old_ca_grace"),
    ],
)
def test_policy_refuses_margins_that_cannot_work(
    changes: dict[str, timedelta], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RotationPolicy(**changes)  # type: ignore[arg-type]


def test_material_reads_the_previous_ca_from_the_bundle() -> None:
    secret = fresh()
    assert Material.from_secret(secret.data, {}).previous_ca is None
    other = generate_ca(common_name="old", valid_for=365 * DAY, now=T0)
    data = {**secret.data, CA_BUNDLE: secret.data[CA_CERT] + other.cert_pem()}
    material = Material.from_secret(data, {})
    assert material.previous_ca == other.cert
    assert material.bundle() == [cert(secret.data[CA_CERT]), other.cert]
    with pytest.raises(ValueError, match="incomplete"):
        Material(ca_cert=other.cert).secret_data()
    assert isinstance(material.ca, KeyPair)
