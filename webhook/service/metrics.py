"""Prometheus metrics of the service, in a registry of its own (no global state in tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from webhook.core.admission import Answer
from webhook.version import version

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Admission latency lives well under a millisecond; the apiserver's budget is seconds.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _as_float(count: Callable[[str], int], kind: str) -> float:
    return float(count(kind))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gpushare_admission_requests",
            "Admission reviews answered.",
            ["endpoint", "decision", "mode", "dry_run"],
            registry=self.registry,
        )
        self.violations = Counter(
            "gpushare_admission_violations",
            "Rule violations found, by the action the policy gave them.",
            ["endpoint", "rule", "action", "dry_run"],
            registry=self.registry,
        )
        self.errors = Counter(
            "gpushare_admission_errors",
            "Reviews that could not be evaluated (answered per the policy's onError) or were malformed.",
            ["endpoint", "kind"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpushare_admission_review_duration_seconds",
            "Time from request received to answer sent.",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.reloads = Counter(
            "gpushare_policy_reloads",
            "Policy reloads by result.",
            ["result"],
            registry=self.registry,
        )
        self.policy_info = Gauge(
            "gpushare_policy_info",
            "The policy in force (value 1), labelled with its name and hash.",
            ["name", "hash"],
            registry=self.registry,
        )
        # Exposed as gpushare_build_info{version="..."} 1.
        self.build = Info(
            "gpushare_build",
            "The running build, labelled with its version.",
            registry=self.registry,
        )
        self.build.info({"version": version()})
        self.certificate_expiry = Gauge(
            "gpushare_certificate_expiry_seconds",
            "Seconds until the serving certificate in use expires.",
            registry=self.registry,
        )
        self.connection_limits = Counter(
            "gpushare_connection_limits",
            "Connections reset or refused, and requests answered 429, by a serve limit "
            "(listener: webhook or health; limit: see webhook/service/limits.py).",
            ["listener", "limit"],
            registry=self.registry,
        )
        for result in ("ok", "failed"):
            self.reloads.labels(result=result)
        # The children of the per-review series by label values, bound to the method
        # that counts: labels() costs ~1 us a call (a lock, str() of every value, a
        # lookup) and runs 2+ times a review. The label sets are few (endpoints,
        # verdicts, modes, rules) and prometheus_client keeps each child for the
        # registry's life anyway; nothing here removes a child, which would strand it.
        self._count_request: dict[tuple[str, str, str, str], Callable[[], None]] = {}
        self._count_violation: dict[tuple[str, str, str, str], Callable[[], None]] = {}
        self._observe_latency: dict[str, Callable[[float], None]] = {}

    def observe(
        self, answer: Answer, *, endpoint: str, latency_s: float, error: str | None
    ) -> None:
        dry_run = "true" if answer.request.get("dryRun") is True else "false"
        decision = answer.decision
        verdict = "error" if error else ("allowed" if decision.allowed else "denied")
        key = (endpoint, verdict, decision.mode, dry_run)
        count = self._count_request.get(key)
        if count is None:
            count = self._count_request[key] = self.requests.labels(*key).inc
        count()
        for violation in decision.violations:
            labels = (endpoint, violation["rule"], violation["action"], dry_run)
            count = self._count_violation.get(labels)
            if count is None:
                count = self._count_violation[labels] = self.violations.labels(*labels).inc
            count()
        if error:
            self.errors.labels(endpoint, "evaluation").inc()
        observe = self._observe_latency.get(endpoint)
        if observe is None:
            observe = self._observe_latency[endpoint] = self.latency.labels(endpoint).observe
        observe(latency_s)

    def reloaded(self, ok: bool) -> None:
        self.reloads.labels(result="ok" if ok else "failed").inc()

    def set_policy(self, name: str, digest: str) -> None:
        self.policy_info.clear()
        self.policy_info.labels(name=name, hash=digest).set(1)

    def track_certificate(self, not_after: Callable[[], float | None]) -> None:
        """Report expiry from a callable returning the certificate's notAfter (epoch s)."""

        def seconds_left() -> float:
            end = not_after()
            return float("nan") if end is None else end - time.time()

        self.certificate_expiry.set_function(seconds_left)

    def track_cluster(
        self,
        *,
        synced: Callable[[], bool],
        age: Callable[[], float],
        objects: Callable[[str], int],
        kinds: tuple[str, ...],
    ) -> Callable[[str, str], None]:
        """Report the cluster view (``serve --cluster``); returns the callback that counts
        its lists, relists and failures, by kind (callable from any thread)."""
        Gauge(
            "gpushare_cluster_view_synced",
            "1 while decisions use the cluster view; 0 while they fall back to the pod spec "
            "(a kind not listed yet, or nothing heard from the API for too long).",
            registry=self.registry,
        ).set_function(lambda: 1.0 if synced() else 0.0)
        Gauge(
            "gpushare_cluster_view_age_seconds",
            "Seconds since the watched kind heard from longest ago last heard from the API.",
            registry=self.registry,
        ).set_function(age)
        held = Gauge(
            "gpushare_cluster_view_objects",
            "Objects held in the cluster view, by kind (those with facts a decision reads).",
            ["kind"],
            registry=self.registry,
        )
        for kind in kinds:
            held.labels(kind).set_function(partial(_as_float, objects, kind))
        events = Counter(
            "gpushare_cluster_view_events",
            "Cluster view lists (list: the first; resync: periodic; gone: a 410 relist) "
            "and failed API calls (error), by kind.",
            ["kind", "event"],
            registry=self.registry,
        )
        for kind in kinds:
            for event in ("list", "resync", "gone", "error"):
                events.labels(kind, event)

        def count(kind: str, event: str) -> None:
            events.labels(kind, event).inc()

        return count

    def render(self) -> bytes:
        return generate_latest(self.registry)
