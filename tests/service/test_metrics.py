"""Metrics.observe: each label set counts on its own series, however often it recurs
(the children are cached per label set)."""

from __future__ import annotations

import re
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tests.paths import MANIFESTS
from webhook.core.admission import answer
from webhook.core.wire import parse_review
from webhook.dev.testing import admission_review
from webhook.service.metrics import Metrics
from webhook.service.store import PolicyStore


def answered(manifest: str, *, dry_run: bool = False, endpoint: Any = "mutate") -> Any:
    pod = yaml.safe_load((MANIFESTS / manifest).read_text())
    version, request = parse_review(admission_review(pod, dry_run=dry_run))
    return answer(version, request, PolicyStore(None).policy, endpoint=endpoint)


def test_each_label_set_counts_on_its_own_series() -> None:
    metrics = Metrics()
    gpu = answered("hami-vgpu-pod.yaml")
    denied = answered("privileged-sidecar.yaml", dry_run=True, endpoint="validate")
    for _ in range(3):
        metrics.observe(gpu, endpoint="mutate", latency_s=0.001, error=None)
    metrics.observe(gpu, endpoint="mutate", latency_s=0.002, error="KeyError")
    for _ in range(2):
        metrics.observe(denied, endpoint="validate", latency_s=0.003, error=None)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    requests = "gpushare_admission_requests_total"
    common = {"endpoint": "mutate", "mode": "vgpu", "dry_run": "false"}
    assert value(requests, decision="allowed", **common) == 3
    assert value(requests, decision="error", **common) == 1
    assert value(requests, endpoint="validate", decision="denied", mode="vgpu", dry_run="true") == 2
    violations = "gpushare_admission_violations_total"
    labels = {"endpoint": "validate", "rule": "privileged-gpu", "action": "deny"}
    assert value(violations, dry_run="true", **labels) == 2
    assert value("gpushare_admission_errors_total", endpoint="mutate", kind="evaluation") == 1
    duration = "gpushare_admission_review_duration_seconds"
    assert value(f"{duration}_count", endpoint="mutate") == 4
    assert value(f"{duration}_count", endpoint="validate") == 2
    assert value(f"{duration}_sum", endpoint="validate") == 0.006


def test_review_series_expose_what_prometheus_client_would() -> None:
    """The per-review series are counted by hand; scraped, they must read exactly as
    prometheus_client's own Counter and Histogram fed the same reviews."""
    metrics = Metrics()
    reference = CollectorRegistry()
    requests = Counter(
        "gpushare_admission_requests",
        "Admission reviews answered.",
        ["endpoint", "decision", "mode", "dry_run"],
        registry=reference,
    )
    violations = Counter(
        "gpushare_admission_violations",
        "Rule violations found, by the action the policy gave them.",
        ["endpoint", "rule", "action", "dry_run"],
        registry=reference,
    )
    latency = Histogram(
        "gpushare_admission_review_duration_seconds",
        "Time from request received to answer sent.",
        ["endpoint"],
        buckets=metrics.latency.bounds[:-1],
        registry=reference,
    )
    gpu = answered("hami-vgpu-pod.yaml")
    denied = answered("privileged-sidecar.yaml", dry_run=True, endpoint="validate")
    # On a bound, between bounds, past the last one, and a sum that is not exact in binary.
    cases = [(gpu, "mutate", s) for s in (0.0005, 0.0007, 0.1, 0.3, 7.0)]
    cases += [(denied, "validate", s) for s in (0.0001, 0.001, 5.0)]
    for result, endpoint, seconds in cases:
        metrics.observe(result, endpoint=endpoint, latency_s=seconds, error=None)
        dry_run = "true" if endpoint == "validate" else "false"
        verdict = "allowed" if result.decision.allowed else "denied"
        requests.labels(endpoint, verdict, result.decision.mode, dry_run).inc()
        for violation in result.decision.violations:
            violations.labels(endpoint, violation["rule"], violation["action"], dry_run).inc()
        latency.labels(endpoint).observe(seconds)

    def scraped(registry: CollectorRegistry) -> list[str]:
        names = (
            "gpushare_admission_requests",
            "gpushare_admission_violations",
            "gpushare_admission_review_duration_seconds",
        )
        lines = generate_latest(registry).decode().splitlines()
        # Creation times differ by the microseconds between the two; their presence counts.
        return [
            re.sub(r"(_created\{.*\}) \S+$", r"\1 T", line)
            for line in lines
            if any(name in line for name in names)
        ]

    ours, theirs = scraped(metrics.registry), scraped(reference)
    assert any("_created{" in line for line in theirs)
    assert (
        'gpushare_admission_review_duration_seconds_bucket{endpoint="mutate",le="+Inf"} 5.0' in ours
    )
    assert ours == theirs
