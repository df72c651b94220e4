"""The audit sink without a server: no record lost across bursts, idle spells and close;
the record's timestamp and latency as the log has always written them."""

from __future__ import annotations

import re
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.paths import MANIFESTS
from webhook.core.admission import answer
from webhook.core.wire import parse_review
from webhook.dev.testing import admission_review
from webhook.service import audit
from webhook.service.audit import AuditRecord, AuditSink, build_record
from webhook.service.store import PolicyStore


def record(n: int) -> AuditRecord:
    return {"auditID": str(n), "stage": "ResponseComplete"}


def ids(path: Path) -> list[str]:
    return [orjson.loads(line)["auditID"] for line in path.read_bytes().splitlines()]


def test_every_emitted_record_is_written_in_order(tmp_path: Path) -> None:
    sink = AuditSink(str(tmp_path / "audit.log"))
    sent = 0
    # Bursts, single records and idle spells longer than the batch window, so the
    # writer goes back to waiting between them and each emit must wake it.
    for burst in (1, 500, 1, 1, 64, 1):
        for _ in range(burst):
            sink.emit(record(sent))
            sent += 1
        time.sleep(0.03)
    # And records still queued when close() starts.
    for _ in range(200):
        sink.emit(record(sent))
        sent += 1
    sink.close()
    assert ids(tmp_path / "audit.log") == [str(n) for n in range(sent)]
    assert sink.written == sent


def test_an_idle_writer_is_woken_by_one_record(tmp_path: Path) -> None:
    sink = AuditSink(str(tmp_path / "audit.log"))
    try:
        time.sleep(0.05)  # the writer is waiting now
        sink.emit(record(1))
        deadline = time.monotonic() + 10
        while sink.written == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert sink.written == 1  # written without close() or more traffic
    finally:
        sink.close()


def test_concurrent_emitters_lose_nothing(tmp_path: Path) -> None:
    sink = AuditSink(str(tmp_path / "audit.log"))

    def emitter(offset: int) -> None:
        for n in range(2000):
            sink.emit(record(offset + n))
            if n % 300 == 0:
                time.sleep(0.02)

    threads = [threading.Thread(target=emitter, args=(k * 10_000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink.close()
    written = ids(tmp_path / "audit.log")
    assert sorted(written, key=int) == [str(k * 10_000 + n) for k in range(4) for n in range(2000)]


def test_emit_after_close_is_refused(tmp_path: Path) -> None:
    sink = AuditSink(str(tmp_path / "audit.log"))
    sink.emit(record(1))
    sink.close()
    with pytest.raises(RuntimeError, match="closed"):
        sink.emit(record(2))
    assert ids(tmp_path / "audit.log") == ["1"]


def test_timestamp_is_utc_iso_with_milliseconds() -> None:
    before = datetime.now(UTC)
    stamp = audit.timestamp()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", stamp)
    parsed = datetime.fromisoformat(stamp)
    # Milliseconds are cut, not rounded, as isoformat(timespec="milliseconds") does.
    assert before - timedelta(milliseconds=1) < parsed <= after


def test_timestamp_follows_the_clock_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    for ns in (1_700_000_000_999_999_999, 1_700_000_001_000_000_000, 1_699_999_999_000_500_000):
        monkeypatch.setattr(time, "time_ns", lambda ns=ns: ns)
        expected = datetime.fromtimestamp(ns // 1000 / 1e6, UTC)
        assert audit.timestamp() == expected.isoformat(timespec="milliseconds")


def _answered() -> Any:
    pod = yaml.safe_load((MANIFESTS / "hami-vgpu-pod.yaml").read_text())
    version, request = parse_review(admission_review(pod, uid="u1", namespace="ml"))
    return answer(version, request, PolicyStore(None).policy, endpoint="mutate")


@pytest.mark.parametrize(
    ("latency_s", "ms"),
    [(0.000123456, 0.123), (0.0012345, 1.234), (0.0000004, 0.0), (1.5, 1500.0), (0.0019996, 2.0)],
)
def test_latency_in_whole_microseconds(latency_s: float, ms: float) -> None:
    built = build_record(_answered(), endpoint="mutate", policy_hash="h", latency_s=latency_s)
    assert built["latencyMs"] == ms
    assert built["latencyMs"] == round(latency_s * 1000, 3)


def test_record_user_and_verb() -> None:
    built = build_record(_answered(), endpoint="mutate", policy_hash="h", latency_s=0.001)
    assert built["user"] == {"username": "alice", "groups": ["system:authenticated"]}
    assert built["verb"] == "create"
    assert built["auditID"] == "u1"


def test_record_names_the_workload_and_keeps_generate_name_beside_the_name() -> None:
    pod = yaml.safe_load((MANIFESTS / "hami-vgpu-pod.yaml").read_text())
    pod["metadata"].update(
        name="web-5d8f7c9b4-x2x9z",
        generateName="web-5d8f7c9b4-",
        labels={"pod-template-hash": "5d8f7c9b4"},
        ownerReferences=[
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-5d8f7c9b4",
                "uid": "u",
                "controller": True,
            }
        ],
    )
    version, request = parse_review(admission_review(pod, namespace="ml"))
    answered = answer(version, request, PolicyStore(None).policy, endpoint="validate")
    built = build_record(answered, endpoint="validate", policy_hash="h", latency_s=0.001)
    assert built["owner"] == {"kind": "Deployment", "name": "web"}
    assert built["objectRef"]["name"] == "web-5d8f7c9b4-x2x9z"
    assert built["objectRef"]["generateName"] == "web-5d8f7c9b4-"
    bare = build_record(_answered(), endpoint="mutate", policy_hash="h", latency_s=0.001)
    assert "owner" not in bare
    assert "generateName" not in bare["objectRef"]
