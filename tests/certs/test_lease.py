"""Leader election against an in-memory Lease API, on a clock the tests move."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from webhook.certs.lease import LeaseElector


@dataclass
class Response:
    data: bytes


class FakeLeases:
    """One Lease, with the apiserver's optimistic concurrency on resourceVersion."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        # Runs once, just before the next write lands: another candidate's write.
        self.before_write: Callable[[], object] | None = None

    def _store(self, body: dict[str, Any]) -> Response:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.lease = body
        return Response(orjson.dumps(body))

    def _interleave(self) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Response:
        if self.lease is None:
            raise ApiException(status=404, reason="Not Found")
        return Response(orjson.dumps(self.lease))

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        self._interleave()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> Response:
        self._interleave()
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(body)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> FakeLeases:
    return FakeLeases()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def candidate(api: FakeLeases, clock: Clock, identity: str) -> LeaseElector:
    return LeaseElector(
        api, namespace="ns", name="lock", identity=identity, lease_duration=30, monotonic=clock
    )


def test_the_first_candidate_leads_and_the_next_follows(api: FakeLeases, clock: Clock) -> None:
    a, b = candidate(api, clock, "a"), candidate(api, clock, "b")
    assert a.try_acquire_or_renew()
    assert a.is_leader
    assert not b.try_acquire_or_renew()
    assert not b.is_leader
    assert b.holder == "a"
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "a"
    assert api.lease["spec"]["leaseDurationSeconds"] == 30
    assert api.lease["spec"]["leaseTransitions"] == 0


def test_a_renewing_holder_keeps_the_lease(api: FakeLeases, clock: Clock) -> None:
    a, b = candidate(api, clock, "a"), candidate(api, clock, "b")
    a.try_acquire_or_renew()
    assert api.lease is not None
    acquired = api.lease["spec"]["acquireTime"]
    for _ in range(10):
        clock.now += 10
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert api.lease["spec"]["acquireTime"] == acquired
    assert api.lease["spec"]["leaseTransitions"] == 0


def test_a_silent_holder_is_replaced_and_never_overlaps(api: FakeLeases, clock: Clock) -> None:
    a, b = candidate(api, clock, "a"), candidate(api, clock, "b")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()  # b sees the record now
    took_over_at = None
    # a stops renewing; b keeps trying every second.
    for _ in range(40):
        clock.now += 1
        assert not (a.is_leader and b.is_leader)
        if b.try_acquire_or_renew() and took_over_at is None:
            took_over_at = clock.now
    assert took_over_at is not None
    assert took_over_at - 1000 >= 30  # a full lease after b last saw a change
    assert not a.is_leader  # a stopped counting itself leader before that
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "b"
    assert api.lease["spec"]["leaseTransitions"] == 1
    # a comes back: b holds a live lease now.
    assert not a.try_acquire_or_renew()


def test_a_holder_cut_off_stops_leading_at_the_renew_deadline(
    api: FakeLeases, clock: Clock
) -> None:
    a = candidate(api, clock, "a")
    a.try_acquire_or_renew()
    clock.now += 19
    assert a.is_leader
    clock.now += 2  # 21 s without a successful renewal: past two thirds of 30 s
    assert not a.is_leader


def test_of_two_racing_candidates_one_wins(api: FakeLeases, clock: Clock) -> None:
    a, b = candidate(api, clock, "a"), candidate(api, clock, "b")
    # Both find no Lease; b's create lands between a's read and a's create.
    api.before_write = b.try_acquire_or_renew
    assert not a.try_acquire_or_renew()
    assert b.is_leader and not a.is_leader


def test_of_two_candidates_taking_over_one_wins(api: FakeLeases, clock: Clock) -> None:
    gone, a, b = (
        candidate(api, clock, "gone"),
        candidate(api, clock, "a"),
        candidate(api, clock, "b"),
    )
    gone.try_acquire_or_renew()
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.now += 31  # the holder is silent: both may take over
    # a's replace lands between b's read and b's replace, which then carries a stale
    # resourceVersion.
    api.before_write = a.try_acquire_or_renew
    assert not b.try_acquire_or_renew()
    assert a.is_leader and not b.is_leader
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "a"


def test_release_hands_over_at_once(api: FakeLeases, clock: Clock) -> None:
    a, b = candidate(api, clock, "a"), candidate(api, clock, "b")
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew()  # no waiting for the lease to run out


def test_release_leaves_another_holders_lease_alone(api: FakeLeases, clock: Clock) -> None:
    a, b = candidate(api, clock, "a"), candidate(api, clock, "b")
    a.try_acquire_or_renew()
    b.release()
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "a"


def test_other_api_errors_propagate(api: FakeLeases, clock: Clock) -> None:
    a = candidate(api, clock, "a")

    def forbidden(*_: Any, **__: Any) -> Response:
        raise ApiException(status=403, reason="Forbidden")

    api.read_namespaced_lease = forbidden  # type: ignore[method-assign]
    with pytest.raises(ApiException):
        a.try_acquire_or_renew()
    assert not a.is_leader


def test_arguments_are_checked(api: FakeLeases) -> None:
    with pytest.raises(ValueError, match="lease_duration"):
        LeaseElector(api, namespace="ns", name="lock", identity="a", lease_duration=0.5)
    with pytest.raises(ValueError, match="identity"):
        LeaseElector(api, namespace="ns", name="lock", identity="")


def test_the_lease_carries_the_part_of_label(api: FakeLeases, clock: Clock) -> None:
    """Uninstall finds the leader's objects by this label, whatever their names."""
    a = candidate(api, clock, "a")
    a.try_acquire_or_renew()
    clock.now += 10
    a.try_acquire_or_renew()  # a renewal replaces the Lease: the label stays
    assert api.lease is not None
    assert api.lease["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpushare"
    a.release()
    assert api.lease["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpushare"
