"""One way to run car-ray's event loops: uvloop where it is installed, asyncio's own loop
otherwise.

Ray runs its async actors (the fork workers) on uvloop whenever it is importable
(`RAY_USE_UVLOOP`, on by default); the driver's own loops (record, replay, fork, the
benchmarks' one-process schemes) run on the same kind of loop, so that a comparison between
them measures the scheme, not the loop. benchmarks/throughput.py: uvloop cut the Ray
workers' CPU per fork by about 10% (11.9-14.0 ms against 14.8-16.6 ms, side by side)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None (asyncio's default) without uvloop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on car-ray's kind of event loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
