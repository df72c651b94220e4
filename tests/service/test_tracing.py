"""Tracing: a span per review through the real app, nothing installed when off."""

from __future__ import annotations

import ssl
import uuid
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.paths import MANIFESTS
from webhook.certs.contexts import build_server_context
from webhook.dev.testing import admission_review
from webhook.service import tracing
from webhook.service.audit import AuditSink
from webhook.service.metrics import Metrics
from webhook.service.server import create_app
from webhook.service.store import PolicyStore


def test_off_without_endpoint() -> None:
    assert tracing.configure({}) is None
    assert tracing.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) is None


def test_on_with_endpoint() -> None:
    configured = tracing.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert configured is not None
    configured[1].shutdown()


async def test_one_span_per_review(tls_files: dict[str, Path], tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = tracing.make_provider(SimpleSpanProcessor(exporter))
    observer = tracing.review_observer(provider.get_tracer("test"))
    sink = AuditSink(str(tmp_path / "audit.log"))
    app = create_app(store=PolicyStore(None), sink=sink, metrics=Metrics(), observers=[observer])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(
        runner,
        "127.0.0.1",
        0,
        ssl_context=build_server_context(tls_files["cert"], tls_files["key"]),
    )
    await site.start()
    port = runner.addresses[0][1]
    pods = ["privileged-sidecar.yaml", "hami-vgpu-pod.yaml"]
    uids = []
    try:
        context = ssl.create_default_context(cafile=str(tls_files["ca"]))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as client:
            for name in pods:
                uid = str(uuid.uuid4())
                uids.append(uid)
                review = admission_review(
                    yaml.safe_load((MANIFESTS / name).read_text()),
                    uid=uid,
                    namespace="ml",
                    dry_run=True,
                )
                async with client.post(f"https://127.0.0.1:{port}/validate", json=review) as r:
                    assert r.status == 200
    finally:
        await runner.cleanup()
        sink.close()
    spans = exporter.get_finished_spans()
    assert [s.attributes["admission.uid"] for s in spans if s.attributes] == uids
    denied, allowed = (dict(s.attributes or {}) for s in spans)
    assert denied["admission.allowed"] is False
    assert denied["admission.rules"] == ("privileged-gpu", "unmutated-gpu-pod")
    assert denied["admission.operation"] == "CREATE"
    assert denied["admission.kind"] == "Pod"
    assert denied["admission.namespace"] == "ml"
    assert denied["admission.dry_run"] is True
    assert allowed["admission.allowed"] is False  # unmutated at /validate
    assert allowed["admission.rules"] == ("unmutated-gpu-pod",)
    assert all(s.name == "admission validate" for s in spans)
    assert all(s.end_time is not None and s.start_time is not None for s in spans)
    assert all(s.end_time >= s.start_time for s in spans if s.end_time and s.start_time)
