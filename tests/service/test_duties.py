"""What every worker's /readyz says about the duties one process holds."""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import pytest

from webhook.service.duties import STALE_AFTER, DutyStatus, hold


def test_nothing_runs_before_the_first_beat_or_after_a_stop() -> None:
    status = DutyStatus.create(("certificates", "scope"))
    running, body = status.report()
    assert not running
    assert body["heartbeat_age"] is None
    status.beat(leader=True, last_check=time.monotonic())
    running, body = status.report()
    assert running
    assert body["certificates"]["leader"] is True
    assert body["scope"] == {"kept_by_leader": True}
    status.stop()
    assert status.report()[0] is False


def test_a_silent_holder_counts_as_stopped() -> None:
    status = DutyStatus.create(("certificates",))
    status.beat(leader=False, last_check=0.0)
    status.values[0] -= STALE_AFTER + 1  # its last beat, that long ago
    running, body = status.report()
    assert not running
    assert body["heartbeat_age"] > STALE_AFTER
    assert "scope" not in body  # only the duties configured are reported
    assert body["certificates"] == {"leader": False, "checked_age": None}


def _beat(status: DutyStatus) -> None:
    status.beat(leader=True, last_check=time.monotonic())


def test_another_process_sees_the_beats() -> None:
    """The block is shared: a process started the way workers are writes, we read."""
    status = DutyStatus.create(("certificates",))
    process = multiprocessing.get_context("forkserver").Process(target=_beat, args=(status,))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    running, body = status.report()
    assert running
    assert body["certificates"]["leader"] is True


class _Manager:
    """A manager whose loop ends by itself: what hold() must never let pass silently."""

    is_leader = True
    last_check = 0.0

    def __init__(self) -> None:
        self.ran = asyncio.Event()

    async def run(self) -> None:
        self.ran.set()
        await asyncio.sleep(0.05)


async def test_a_manager_that_ends_stops_the_holder_with_an_error() -> None:
    status = DutyStatus.create(("certificates",))
    manager = _Manager()
    with pytest.raises(RuntimeError, match="certificate manager stopped"):
        await hold(status, manager, interval=0.01)
    assert manager.ran.is_set()
    assert status.report()[0] is False


async def test_a_cancelled_holder_stops_its_manager() -> None:
    status = DutyStatus.create(("certificates",))

    class Forever(_Manager):
        cancelled = False

        async def run(self) -> None:
            self.ran.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise

    manager = Forever()
    task = asyncio.create_task(hold(status, manager, interval=0.01))
    await manager.ran.wait()
    await asyncio.sleep(0.05)
    assert status.report()[0]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert manager.cancelled
    assert not status.report()[0]


def test_leadership_is_read_through_the_block_and_lapses_with_the_holder() -> None:
    # What a worker writing policy reports asks: does its pod lead the Lease?
    status = DutyStatus.create(("certificates",))
    assert not status.leader()
    status.beat(leader=True, last_check=time.monotonic())
    assert status.leader()
    status.beat(leader=False, last_check=time.monotonic())
    assert not status.leader()
    status.beat(leader=True, last_check=time.monotonic())
    status.values[0] = time.monotonic() - STALE_AFTER - 1  # the heartbeat slot, gone stale
    assert not status.leader()
    status.beat(leader=True, last_check=time.monotonic())
    status.stop()
    assert not status.leader()
