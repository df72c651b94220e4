"""The audit log: one JSON line per decision, written off the event loop, none lost.

Records carry each violation's rule, action and message with the user-supplied values
redacted (:attr:`webhook.core.finding.Finding.redacted`): messages quote env values and
annotation contents, which may be secrets, but an operator must still be able to answer
"why was this pod refused" from the log alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final, TypedDict

import orjson

from webhook.core.admission import Answer
from webhook.core.workload import as_mapping

log = logging.getLogger(__name__)

# How long the writer lets records gather before a write: bounds how stale the file is.
_BATCH_WINDOW: Final = 0.01
_VERBS: Final = {"CREATE": "create", "UPDATE": "update", "DELETE": "delete", "CONNECT": "connect"}


class ObjectRef(TypedDict, total=False):
    resource: str
    subresource: str
    namespace: str
    name: str
    generateName: str
    apiGroup: str
    apiVersion: str


class AuditRecord(TypedDict, total=False):
    auditID: str
    stage: str
    timestamp: str
    verb: str
    user: dict[str, Any]
    objectRef: ObjectRef
    dryRun: bool
    endpoint: str
    allowed: bool
    mode: str
    exempt: bool
    violations: list[dict[str, str]]
    patchOps: int
    policyHash: str
    latencyMs: float
    error: str


def build_record(
    answer: Answer, *, endpoint: str, policy_hash: str, latency_s: float, error: str | None = None
) -> AuditRecord:
    """The audit record of one answered review (pure)."""
    request = answer.request
    resource = as_mapping(request.get("resource"))
    metadata = as_mapping(
        as_mapping(request.get("object") or request.get("oldObject")).get("metadata")
    )
    ref: ObjectRef = {"resource": str(resource.get("resource") or "")}
    if resource.get("group"):
        ref["apiGroup"] = str(resource["group"])
    if resource.get("version"):
        ref["apiVersion"] = str(resource["version"])
    if request.get("subResource"):
        ref["subresource"] = str(request["subResource"])
    namespace = request.get("namespace") or metadata.get("namespace")
    if namespace:
        ref["namespace"] = str(namespace)
    name = request.get("name") or metadata.get("name")
    if name:
        ref["name"] = str(name)
    elif metadata.get("generateName"):
        ref["generateName"] = str(metadata["generateName"])
    user = as_mapping(request.get("userInfo"))
    groups = user.get("groups")
    decision = answer.decision
    record: AuditRecord = {
        "auditID": str(request.get("uid", "")),
        "stage": "ResponseComplete",
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "verb": _VERBS.get(answer.facts.operation, answer.facts.operation.lower()),
        "user": {
            "username": str(user.get("username") or ""),
            "groups": [str(g) for g in groups] if isinstance(groups, list) else [],
        },
        "objectRef": ref,
        "dryRun": request.get("dryRun") is True,
        "endpoint": endpoint,
        "allowed": decision.allowed,
        "mode": decision.mode,
        "violations": [
            {"rule": v["rule"], "action": v["action"], "message": message}
            for v, message in zip(decision.violations, decision.redacted, strict=True)
        ],
        "patchOps": len(decision.patch) if endpoint == "mutate" else 0,
        "policyHash": policy_hash,
        "latencyMs": round(latency_s * 1000, 3),
    }
    if decision.exempt:
        record["exempt"] = True
    if error is not None:
        record["error"] = error
    return record


class RotatingFile:
    """An append-only file rotated by size: ``audit.log`` -> ``audit.log.1`` ... ``.N``."""

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = open(path, "ab")  # noqa: SIM115  # held open for the sink's life
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        if self.max_bytes and self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        self._file.write(data)
        self._size += len(data)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
        if self.backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115  # replaced on each rotation
        self._size = 0


class _Stream:
    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def write(self, data: bytes) -> None:
        self._stream.write(data)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        self.flush()


class AuditSink:
    """Queues records on the loop; a writer thread serialises and writes them in batches.

    The request path only appends to a deque (never blocks); ``close`` drains every
    queued record before returning, so a clean shutdown loses no line.
    """

    def __init__(self, target: str, *, max_bytes: int = 100 << 20, backups: int = 5) -> None:
        self._out: RotatingFile | _Stream
        if target == "-":
            self._out = _Stream(sys.stdout.buffer)
        else:
            self._out = RotatingFile(Path(target), max_bytes=max_bytes, backups=backups)
        self._pending: list[AuditRecord] = []
        self._lock = threading.Condition()
        self._closed = False
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    def emit(self, record: AuditRecord) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("audit sink is closed")
            self._pending.append(record)
            # Wake the writer only when the queue was empty (it may be waiting): a
            # wake-up per record costs a thread switch and a GIL hand-off per request.
            if len(self._pending) == 1:
                self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                closed = self._closed
            if not closed:
                # Let a batch gather: at most ~100 writes a second, whatever the load.
                time.sleep(_BATCH_WINDOW)
            with self._lock:
                batch, self._pending = self._pending, []
                done = self._closed and not batch
            if batch:
                data = b"".join(orjson.dumps(r) + b"\n" for r in batch)
                try:
                    self._out.write(data)
                    self._out.flush()
                    self.written += len(batch)
                except OSError:
                    log.exception("audit log write failed; %d records lost", len(batch))
            if done:
                return

    async def aclose(self) -> None:
        """Drain and close without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join()
        with contextlib.suppress(OSError):
            self._out.close()
