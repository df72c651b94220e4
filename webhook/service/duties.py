"""The duties that one process of a pod holds, and what every worker's ``/readyz`` says
about them.

With ``--self-managed`` a pod keeps its certificates current (one Lease candidate per
pod) and, as leader, keeps the webhooks' scope in step with the policy. Two processes
of one pod must never do that at once, and it must not stop while the pod serves. So
under ``serve --workers N`` the supervising parent holds the duties
(:mod:`webhook.service.supervisor`): the workers only serve, and a worker that dies
takes no duty with it. With one process (``--workers 1``) the same duties run beside
the server in that process.

The holder writes a heartbeat and its state into a few doubles of shared memory
(:class:`DutyStatus`); each worker's ``/readyz`` reads them, so a worker reports a
holder that has stopped or hangs as not ready, instead of staying green.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawArray
from typing import Any, Final, Protocol

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL: Final = 1.0
# Silent this long, the holder counts as stopped: ten missed beats, so that a loaded
# machine's scheduling delays never flip readiness, well within a probe's period.
STALE_AFTER: Final = 10.0

# The slots of the shared block, as time.monotonic() values (CLOCK_MONOTONIC: one clock
# for every process of the machine) or 0/1 flags.
_HEARTBEAT: Final = 0
_LEADER: Final = 1
_CHECKED: Final = 2
_SLOTS: Final = 3


class Manager(Protocol):
    """What :func:`hold` needs of :class:`webhook.certs.selfmanaged.SelfManagedCertificates`."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def last_check(self) -> float: ...

    async def run(self) -> None: ...


@dataclass(frozen=True, slots=True)
class DutyStatus:
    """The state of the configured duties, readable from any process it is passed to."""

    # The duties configured, in the order /readyz lists them ("certificates", "scope").
    names: tuple[str, ...]
    # The pid of the process that holds them.
    pid: int
    # multiprocessing's RawArray of doubles: no lock, each slot written by one process.
    values: Any

    @classmethod
    def create(cls, names: tuple[str, ...]) -> DutyStatus:
        return cls(names=names, pid=os.getpid(), values=RawArray("d", _SLOTS))

    def beat(self, *, leader: bool, last_check: float) -> None:
        self.values[_LEADER] = 1.0 if leader else 0.0
        self.values[_CHECKED] = last_check
        self.values[_HEARTBEAT] = time.monotonic()

    def leader(self) -> bool:
        """The holder runs and leads the Lease (a stopped holder leads nothing)."""
        heartbeat = self.values[_HEARTBEAT]
        alive = heartbeat > 0 and time.monotonic() - heartbeat < STALE_AFTER
        return alive and bool(self.values[_LEADER] > 0)

    def stop(self) -> None:
        """The holder has stopped (or failed): readers report it at once."""
        self.values[_HEARTBEAT] = 0.0

    def report(self) -> tuple[bool, dict[str, Any]]:
        """Whether the duties run, and what /readyz shows of them."""
        now = time.monotonic()
        heartbeat = self.values[_HEARTBEAT]
        alive = heartbeat > 0 and now - heartbeat < STALE_AFTER
        body: dict[str, Any] = {
            "pid": self.pid,
            "running": alive,
            "heartbeat_age": round(now - heartbeat, 1) if heartbeat > 0 else None,
        }
        if "certificates" in self.names:
            checked = self.values[_CHECKED]
            body["certificates"] = {
                "leader": self.values[_LEADER] > 0,
                # Seconds since the last check that reached the API; it may be away for a
                # while without harm: the pair on disk keeps being served.
                "checked_age": round(now - checked, 1) if checked > 0 else None,
            }
        if "scope" in self.names:
            body["scope"] = {"kept_by_leader": True}
        return alive, body


async def hold(
    status: DutyStatus,
    manager: Manager,
    *,
    interval: float = HEARTBEAT_INTERVAL,
) -> None:
    """Run the certificate manager (and the duties it carries) and beat while it runs.

    Returns only when cancelled; if the manager ever ends on its own, that is a bug, and
    it is raised so that the process exits rather than serving on without its duties.
    """
    task = asyncio.create_task(manager.run())
    try:
        while not task.done():
            status.beat(leader=manager.is_leader, last_check=manager.last_check)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await asyncio.shield(task)
        status.stop()
        task.result()
        raise RuntimeError("the certificate manager stopped")
    finally:
        status.stop()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def exit_on_failure(stop: Callable[[int], None]) -> Callable[[asyncio.Task[None]], None]:
    """A done-callback for the duties' task: a failure stops the process with status 1."""

    def done(task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("duties failed, stopping: %s", exc, exc_info=exc)
            stop(1)

    return done
