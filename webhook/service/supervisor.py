"""``serve --workers N``: a parent that keeps N serving workers alive, as gunicorn's
arbiter does.

Each worker is a process with its own listening sockets (SO_REUSEPORT), so the kernel
spreads connections over the workers alive and stops sending any to a worker once it
is gone. The parent learns of a worker's exit from its sentinel (a pipe end that
becomes readable when the process ends, watched by the event loop: no polling), reaps
it and starts a replacement in the same slot at once.

Workers are forked from a preloaded fork server (multiprocessing's ``forkserver``), not
spawned: a new worker starts with the service's modules imported, in tens of
milliseconds instead of the ~1 s an interpreter takes to import them, and from a
process that holds no threads or sockets of the parent.

A worker that dies within :data:`BOOT_GRACE` of its start failed to boot (a bad
certificate, a port taken, a bug at start). After :data:`BOOT_FAILURES` of those in a
row the parent stops everything and exits 1, so that the kubelet restarts the pod and
reports the crash loop, rather than forking forever.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Final

log = logging.getLogger(__name__)

BOOT_GRACE: Final = 5.0
BOOT_FAILURES: Final = 5


def _how(code: int | None) -> str:
    return f"signal {-code}" if code is not None and code < 0 else f"status {code}"


@dataclass(slots=True)
class _Slot:
    index: int
    process: BaseProcess
    started: float


class Supervisor:
    """Keeps ``count`` processes running ``target(*args(index))`` until :meth:`stop`."""

    def __init__(
        self,
        *,
        context: BaseContext,
        target: Callable[..., object],
        args: Callable[[int], Sequence[Any]],
        count: int,
        name: str = "worker",
    ) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        self._context = context
        self._target = target
        self._args = args
        self._count = count
        self._name = name
        self._slots: dict[int, _Slot] = {}
        self._quick_failures = 0
        # Set when workers keep failing to boot: the caller stops and exits 1.
        self.broken = asyncio.Event()

    @property
    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots.values() if s.process.pid is not None]

    def start(self) -> None:
        for index in range(self._count):
            self._start(index)

    def _start(self, index: int) -> _Slot:
        process = self._context.Process(  # type: ignore[attr-defined]
            target=self._target, args=tuple(self._args(index)), name=f"{self._name}-{index}"
        )
        process.start()
        slot = _Slot(index, process, time.monotonic())
        self._slots[index] = slot
        asyncio.get_running_loop().add_reader(process.sentinel, self._exited, slot)
        return slot

    def _exited(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        process = slot.process
        loop.remove_reader(process.sentinel)
        process.join()  # reaps it: a dead worker never lingers as a zombie
        how = _how(process.exitcode)
        lived = time.monotonic() - slot.started
        self._quick_failures = self._quick_failures + 1 if lived < BOOT_GRACE else 0
        if self._quick_failures >= BOOT_FAILURES:
            log.error(
                "%s (pid %s) exited with %s %.1fs after its start, the %dth in a row to "
                "fail to boot: stopping",
                process.name,
                process.pid,
                how,
                lived,
                self._quick_failures,
            )
            self._slots.pop(slot.index, None)
            process.close()
            self.broken.set()
            return
        replacement = self._start(slot.index)
        log.warning(
            "%s (pid %s) exited with %s after %.1fs: replaced by pid %s",
            process.name,
            process.pid,
            how,
            lived,
            replacement.process.pid,
        )
        process.close()

    def signal_all(self, signum: int) -> None:
        for slot in self._slots.values():
            pid = slot.process.pid
            if pid is not None and slot.process.exitcode is None:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:  # exited a moment ago; its sentinel reports it
                    continue

    async def stop(self, *, grace: float) -> int:
        """SIGTERM every worker (they drain), SIGKILL those alive after ``grace`` seconds;
        the highest exit status (0 when every worker stopped cleanly)."""
        slots = list(self._slots.values())
        loop = asyncio.get_running_loop()
        for slot in slots:
            # join() below reads the exit status from the sentinel: a reader on the loop
            # reading it too would leave join() an empty pipe (and status 255).
            loop.remove_reader(slot.process.sentinel)
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        codes: list[int] = []
        for slot in slots:
            process = slot.process
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(process.join, remaining)
            if process.exitcode is None:
                log.warning("%s (pid %s) still running: killing it", process.name, process.pid)
                process.kill()
                await asyncio.to_thread(process.join)
            code = process.exitcode
            log.info("%s (pid %s) exited with %s", process.name, process.pid, _how(code))
            codes.append(1 if code is None or code < 0 else code)
        self._slots.clear()
        return max(codes, default=0)
