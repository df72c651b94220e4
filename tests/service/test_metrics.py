"""Metrics.observe: each label set counts on its own series, however often it recurs
(the children are cached per label set)."""

from __future__ import annotations

from typing import Any

import yaml

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
