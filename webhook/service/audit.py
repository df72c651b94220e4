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
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final

import orjson

from webhook.core.admission import Answer

# The record's types are re-exported: the sink is where callers have found them.
from webhook.core.record import AuditRecord as AuditRecord
from webhook.core.record import ObjectRef as ObjectRef
from webhook.core.record import record_of

log = logging.getLogger(__name__)

# How long the writer lets records gather before a write: bounds how stale the file is.
_BATCH_WINDOW: Final = 0.01
# A record's timestamp is "<UTC second>" + one of these, as
# datetime.now(UTC).isoformat(timespec="milliseconds") writes it: formatting the second
# only when it changes costs ~0.4 us a record instead of ~2.7 us.
_MILLIS: Final = tuple(f".{ms:03d}+00:00" for ms in range(1000))
_second: tuple[int, str] = (-1, "")


def timestamp() -> str:
    """Now in UTC with milliseconds: ``2026-01-02T03:04:05.678+00:00``."""
    global _second  # one per process: a record built on another thread at worst reformats
    second, millis = divmod(time.time_ns() // 1_000_000, 1000)
    cached, prefix = _second
    if cached != second:
        prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (second, prefix)
    return prefix + _MILLIS[millis]


def build_record(
    answer: Answer, *, endpoint: str, policy_hash: str, latency_s: float, error: str | None = None
) -> AuditRecord:
    """The audit record of one answered review, stamped now."""
    return record_of(
        answer,
        endpoint=endpoint,
        policy_hash=policy_hash,
        latency_s=latency_s,
        error=error,
        stamped=timestamp(),
    )


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

    The request path only appends to a deque: no lock, and no wake-up of the writer
    unless it is idle (under load it is busy with the previous batch, so none at all).
    Every record :meth:`emit` accepted is written before :meth:`close` returns, so a
    clean shutdown loses no line; ``emit`` after ``close`` raises.
    """

    def __init__(self, target: str, *, max_bytes: int = 100 << 20, backups: int = 5) -> None:
        self._out: RotatingFile | _Stream
        if target == "-":
            self._out = _Stream(sys.stdout.buffer)
        else:
            self._out = RotatingFile(Path(target), max_bytes=max_bytes, backups=backups)
        # deque.append and popleft are atomic (one C call under the GIL): the loop
        # appends and the writer pops without a lock between them.
        self._pending: deque[AuditRecord] = deque()
        self._wake = threading.Event()
        self._idle = False  # the writer waits on _wake (only then does emit set it)
        self._closed = False
        self.written = 0
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    def emit(self, record: AuditRecord) -> None:
        self._pending.append(record)
        # Checked after the append: a record appended before close() set _closed is in
        # the writer's last drain (it reads _closed, then drains); one that sees _closed
        # is refused, as it may come after that drain.
        if self._closed:
            raise RuntimeError("audit sink is closed")
        if self._idle:
            self._wake.set()

    def _run(self) -> None:
        pending = self._pending
        while True:
            closed = self._closed
            if not pending and not closed:
                # Idle: clear, announce, look again, then sleep. An emit that appends
                # after the second look sees _idle and sets the event, which wait()
                # then returns at once on; an earlier one is seen by that look.
                self._wake.clear()
                self._idle = True
                if not pending and not self._closed:
                    self._wake.wait()
                self._idle = False
                continue
            if not closed:
                # Let a batch gather: at most ~100 writes a second, whatever the load.
                time.sleep(_BATCH_WINDOW)
            # Only what is there now: popleft() is safe against appends meanwhile.
            batch = [pending.popleft() for _ in range(len(pending))]
            if batch:
                # OPT_APPEND_NEWLINE: each line in one call, no b"\n" concatenation.
                data = b"".join([orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in batch])
                try:
                    self._out.write(data)
                    self._out.flush()
                    self.written += len(batch)
                except OSError:
                    log.exception("audit log write failed; %d records lost", len(batch))
            if closed:  # _closed was read before this drain: nothing accepted is left
                return

    async def aclose(self) -> None:
        """Drain and close without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join()
        with contextlib.suppress(OSError):
            self._out.close()
