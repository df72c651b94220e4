"""Prometheus metrics of the service, in a registry of its own (no global state in tests)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

from webhook.core.admission import Answer
from webhook.version import version

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Admission latency lives well under a millisecond; the apiserver's budget is seconds.
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _as_float(count: Callable[[str], int], kind: str) -> float:
    return float(count(kind))


# Bucket bounds as prometheus_client writes them in `le` (it ships no type for this one).
_go_float: Callable[[float], str] = floatToGoString


def _created_series() -> bool:
    """prometheus_client's own switch for ``_created`` samples
    (``PROMETHEUS_DISABLE_CREATED_SERIES``, ``disable_created_metrics()``)."""
    return bool(getattr(prometheus_metrics, "_use_created", True))


class CounterSeries(Collector):
    """A labelled counter that every review counts on: a dict update on the event loop,
    exposed exactly as prometheus_client's ``Counter`` (``_total``, ``_created``).

    ``Counter.labels(...).inc()`` takes a lock and ~4k instructions; this ~0.3k. Only the
    serving loop counts here; a scrape from another thread reads a copy of the dict.
    """

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], *, registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = tuple(labels)
        self.values: dict[tuple[str, ...], list[float]] = {}  # labels -> [count, created]
        registry.register(self)

    def inc(self, key: tuple[str, ...]) -> None:
        cell = self.values.get(key)
        if cell is None:
            self.values[key] = [1.0, time.time()]
        else:
            cell[0] += 1.0

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labels)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        created = _created_series()
        for key, (value, since) in list(self.values.items()):
            family.add_metric(key, value, created=since if created else None)
        yield family


class HistogramSeries(Collector):
    """A labelled histogram, as :class:`CounterSeries` is a counter: exposed exactly as
    prometheus_client's ``Histogram`` (``Histogram.observe`` costs ~8k instructions)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = tuple(labels)
        self.bounds = (*buckets, INF)
        self._le = tuple(_go_float(bound) for bound in self.bounds)
        # labels -> [per-bucket counts (not cumulative), sum, created]
        self.values: dict[tuple[str, ...], tuple[list[float], list[float]]] = {}
        registry.register(self)

    def observe(self, key: tuple[str, ...], value: float) -> None:
        cell = self.values.get(key)
        if cell is None:
            cell = self.values[key] = ([0.0] * len(self.bounds), [0.0, time.time()])
        # The first bucket whose bound is >= value, as Histogram.observe's `value <= bound`.
        cell[0][bisect_left(self.bounds, value)] += 1.0
        cell[1][0] += value

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labels)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        created = _created_series()
        for key, (counts, (total, since)) in list(self.values.items()):
            cumulative = 0.0
            buckets = []
            for le, count in zip(self._le, list(counts), strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(key, buckets, total)
            if created:
                family.add_sample(
                    f"{self.name}_created", dict(zip(self.labels, key, strict=True)), since
                )
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = CounterSeries(
            "gpushare_admission_requests",
            "Admission reviews answered.",
            ["endpoint", "decision", "mode", "dry_run"],
            registry=self.registry,
        )
        self.violations = CounterSeries(
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
        self.latency = HistogramSeries(
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

    def observe(
        self, answer: Answer, *, endpoint: str, latency_s: float, error: str | None
    ) -> None:
        dry_run = "true" if answer.request.get("dryRun") is True else "false"
        decision = answer.decision
        verdict = "error" if error else ("allowed" if decision.allowed else "denied")
        self.requests.inc((endpoint, verdict, decision.mode, dry_run))
        for violation in decision.violations:
            self.violations.inc((endpoint, violation["rule"], violation["action"], dry_run))
        if error:
            self.errors.labels(endpoint, "evaluation").inc()
        self.latency.observe((endpoint,), latency_s)

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

    def track_reports(self) -> ReportMetrics:
        """The policy reports' metrics (``serve --cluster --reports``)."""
        return ReportMetrics(self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ReportMetrics:
    """What the background scan finds and what writing its reports costs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.violations = Gauge(
            "gpushare_running_violations",
            "Findings on running and pending pods (and ConfigMaps, Secrets) under the policy "
            "in force, by namespace and rule, as of the last scan.",
            ["namespace", "rule"],
            registry=registry,
        )
        self.writes = Counter(
            "gpushare_report_writes",
            "Report writes to the API, by report kind and verb (create, update, delete).",
            ["kind", "verb"],
            registry=registry,
        )
        self.scan_seconds = Gauge(
            "gpushare_report_scan_seconds",
            "CPU seconds the last full scan of every pod took.",
            registry=registry,
        )
        self.scanned = Gauge(
            "gpushare_report_scanned_pods",
            "Pods judged by the last full scan.",
            registry=registry,
        )

    def set_violations(self, counts: dict[tuple[str, str], int]) -> None:
        # Replaced whole: a namespace and rule with no finding left has no series.
        self.violations.clear()
        for (namespace, rule), count in counts.items():
            self.violations.labels(namespace, rule).set(count)

    def written(self, kind: str, verb: str) -> None:
        self.writes.labels(kind, verb).inc()
