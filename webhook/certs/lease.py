"""Leader election on a ``coordination.k8s.io/v1`` Lease, the way client-go does it.

A candidate takes the Lease when it does not exist, when its holder released it, or
when its record has not changed for ``leaseDurationSeconds`` as seen on this
candidate's own monotonic clock (so no two machines' clocks are compared). Every write
carries the ``resourceVersion`` that was read, so of two candidates racing for the
same Lease the apiserver lets exactly one through.

The holder counts itself leader only until ``renew_deadline`` (two thirds of the
lease) after the start of its last successful renewal. A candidate that waits a full
lease after last seeing the record change therefore never overlaps with it, even when
the holder is cut off from the apiserver instead of stopped.

The calls block; run them in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

LEASE_DURATION: Final = 30.0
RENEW_INTERVAL: Final = 10.0
_NOT_FOUND: Final = 404
_CONFLICT: Final = 409
_RELEASE_ATTEMPTS: Final = 3
_RECORD: Final = (
    "holderIdentity",
    "renewTime",
    "acquireTime",
    "leaseTransitions",
    "leaseDurationSeconds",
)


def default_identity() -> str:
    """``POD_NAME`` when set (the Deployment passes it), else host name and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def read_json(response: Any) -> Any:
    """The body of a call made with ``_preload_content=False``, as plain JSON."""
    return orjson.loads(response.data)


def _record(spec: dict[str, Any]) -> tuple[Any, ...]:
    """What changes on every renewal: a candidate watches it to tell a live holder."""
    return tuple(spec.get(key) for key in _RECORD)


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# What the leader's objects carry: uninstall finds them by the part-of label whatever
# their names (a Lease named after a Secret other than the default one included).
LABELS: Final = {
    "app.kubernetes.io/name": "gpushare-webhook",
    "app.kubernetes.io/part-of": "gpushare",
}


class LeaseElector:
    """One candidate for the Lease ``namespace/name``."""

    def __init__(
        self,
        api: Any,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = LEASE_DURATION,
        request_timeout: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``api`` is a ``kubernetes.client.CoordinationV1Api``."""
        if lease_duration < 1:
            raise ValueError(f"lease_duration must be at least 1 s, got {lease_duration}")
        if not identity:
            raise ValueError("a candidate needs an identity")
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._duration_seconds = math.ceil(lease_duration)
        self._renew_deadline = lease_duration * 2 / 3
        self._timeout = request_timeout
        self._monotonic = monotonic
        self._leading_until = -math.inf
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = -math.inf
        self.holder: str | None = None

    @property
    def is_leader(self) -> bool:
        return self._monotonic() < self._leading_until

    def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease; True while this candidate leads.

        An API error other than a lost race propagates; leadership then lapses on its
        own at the renew deadline.
        """
        started = self._monotonic()
        try:
            lease = read_json(
                self._api.read_namespaced_lease(
                    self.name,
                    self.namespace,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
            return self._write(None, started)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()
        self.holder = holder or None
        if holder and holder != self.identity:
            duration = spec.get("leaseDurationSeconds") or self._duration_seconds
            if self._observed_at + duration > self._monotonic():
                self._leading_until = -math.inf
                return False
            log.info("Lease %s/%s of %s expired: taking it", self.namespace, self.name, holder)
        return self._write(lease, started)

    def _write(self, lease: dict[str, Any] | None, started: float) -> bool:
        now = _micro_time(datetime.now(UTC))
        spec = (lease or {}).get("spec") or {}
        renewing = spec.get("holderIdentity") == self.identity
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(LABELS)},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._duration_seconds,
                "acquireTime": spec.get("acquireTime") if renewing else now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0)
                + (0 if renewing or lease is None else 1),
            },
        }
        try:
            if lease is None:
                written = self._api.create_namespaced_lease(
                    self.namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            else:
                # The resourceVersion read: of two candidates, only one write succeeds.
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                written = self._api.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
        except ApiException as exc:
            if exc.status != _CONFLICT:
                raise
            self._leading_until = -math.inf
            return False
        spec = read_json(written).get("spec") or {}
        self._observed = _record(spec)
        self._observed_at = self._monotonic()
        self._leading_until = started + self._renew_deadline
        self.holder = self.identity
        return True

    def release(self) -> None:
        """Give the Lease up now (on shutdown) so another candidate takes it at once."""
        self._leading_until = -math.inf
        # A renewal still in flight when the stop came may land first: read again.
        for attempt in range(_RELEASE_ATTEMPTS):
            try:
                self._release_once()
                return
            except ApiException as exc:
                if exc.status != _CONFLICT or attempt == _RELEASE_ATTEMPTS - 1:
                    raise

    def _release_once(self) -> None:
        lease = read_json(
            self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        )
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        now = _micro_time(datetime.now(UTC))
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": dict(LABELS),
                "resourceVersion": lease["metadata"]["resourceVersion"],
            },
            # What client-go writes on release: no holder, a one-second lease.
            "spec": {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            },
        }
        self._api.replace_namespaced_lease(
            self.name, self.namespace, body, _preload_content=False, _request_timeout=self._timeout
        )
        self.holder = None
        log.info("released Lease %s/%s", self.namespace, self.name)
