"""OpenTelemetry tracing: one span per answered review, exported over OTLP when configured.

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` unset nothing is installed at all, so tracing
costs nothing when it is off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode, Tracer

from webhook.core.admission import Answer
from webhook.core.workload import as_mapping
from webhook.version import version

SpanObserver = Callable[[Answer, str, float, "str | None"], None]


def review_observer(tracer: Tracer) -> SpanObserver:
    """An observer that records a finished review as a span with its timing."""

    def observe(answer: Answer, endpoint: str, latency_s: float, error: str | None) -> None:
        end = time.time_ns()
        request = answer.request
        decision = answer.decision
        user = as_mapping(request.get("userInfo"))
        attributes: dict[str, Any] = {
            "admission.uid": str(request.get("uid", "")),
            "admission.endpoint": endpoint,
            "admission.operation": answer.facts.operation,
            "admission.kind": answer.facts.kind,
            "admission.namespace": answer.facts.namespace,
            "admission.user": str(user.get("username") or ""),
            "admission.dry_run": request.get("dryRun") is True,
            "admission.allowed": decision.allowed,
            "admission.mode": decision.mode,
            "admission.rules": sorted({v["rule"] for v in decision.violations}),
            "admission.patch_ops": len(decision.patch),
        }
        span = tracer.start_span(
            f"admission {endpoint}", start_time=end - int(latency_s * 1e9), attributes=attributes
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)

    return observe


def make_provider(processor: SpanProcessor) -> TracerProvider:
    provider = TracerProvider(
        resource=Resource.create({"service.name": "gpushare-webhook", "service.version": version()})
    )
    provider.add_span_processor(processor)
    return provider


def configure(
    environ: Mapping[str, str] = os.environ,
) -> tuple[SpanObserver, TracerProvider] | None:
    """The OTLP-exporting observer when OTEL_EXPORTER_OTLP_ENDPOINT is set, else None."""
    if not (
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        return None
    # Imported only when tracing is on: the exporter pulls in protobuf and requests.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = make_provider(BatchSpanProcessor(OTLPSpanExporter()))
    return review_observer(provider.get_tracer("gpushare-webhook")), provider
