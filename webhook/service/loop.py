"""The event loop a serving process runs on: uvloop when it is installed, else asyncio's.

uvloop (libuv, with its TLS transport in Cython) takes ~30 us of CPU off each 5 KB
``/mutate`` request, all of it in the event loop, TLS and HTTP plumbing that every
request pays (py-spy, same load: ~118 -> ~89 us; callgrind: 6% of the instructions).
Nothing depends on it: the service uses only the asyncio API, so a platform without
a uvloop wheel keeps working.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None (asyncio's default loop) without uvloop."""
    try:
        import uvloop
    except ImportError:  # an optional speed-up: the asyncio loop serves the same answers
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest loop installed."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
