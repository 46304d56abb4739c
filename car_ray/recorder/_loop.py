"""The recording loop: one event loop on a daemon thread per process, with one pooled
upstream, where recorded runs make their model calls.

A sync agent runs in its caller's thread (its thread-locals and context variables intact)
and waits on this loop for each model call, as `car-ray record`'s agent thread waits on its
own. An async agent runs on its caller's loop; only the sends cross over (`OnLoop`)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from dataclasses import dataclass

from .._aio import loop_factory
from ..replay import AiohttpUpstream, Upstream, WireRequest, WireResponse


@dataclass(frozen=True)
class _Started:
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    upstream: AiohttpUpstream
    pid: int


class RecordingLoop:
    """Started on first use; started again in a child process after `fork` (a pre-forking
    server imports the decorated agent before it forks), whose copy of the thread is dead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: _Started | None = None

    def get(self) -> tuple[asyncio.AbstractEventLoop, AiohttpUpstream]:
        started = self._started
        if started is None or started.pid != os.getpid():
            with self._lock:
                started = self._started
                if started is None or started.pid != os.getpid():
                    started = self._start()
                    self._started = started
        return started.loop, started.upstream

    def _start(self) -> _Started:
        factory = loop_factory() or asyncio.new_event_loop
        loop = factory()
        thread = threading.Thread(target=loop.run_forever, name="car-ray-recording", daemon=True)
        thread.start()
        started = _Started(loop, thread, AiohttpUpstream(), os.getpid())
        atexit.register(self._stop, started)
        return started

    def _stop(self, started: _Started) -> None:
        """At exit: close the pooled connections and stop the loop (in the process that
        started them only)."""
        if started.pid != os.getpid() or not started.thread.is_alive():
            return
        closing = asyncio.run_coroutine_threadsafe(started.upstream.aclose(), started.loop)
        with contextlib.suppress(Exception):
            closing.result(timeout=2)
        started.loop.call_soon_threadsafe(started.loop.stop)
        started.thread.join(timeout=2)


class OnLoop:
    """An upstream whose sends run on another event loop (the recording loop's pool): an
    async agent's run lives on the agent's loop, its connections on the recording loop."""

    def __init__(self, inner: Upstream, loop: asyncio.AbstractEventLoop) -> None:
        self.inner = inner
        self.loop = loop

    async def send(self, request: WireRequest) -> WireResponse:
        future = asyncio.run_coroutine_threadsafe(self.inner.send(request), self.loop)
        return await asyncio.wrap_future(future)

    async def aclose(self) -> None:
        """The pool is the process's: it closes at exit."""


RECORDING_LOOP = RecordingLoop()
