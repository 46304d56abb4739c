"""httpx2 transports that hand every request of the agent to its `Run`.

The openai and anthropic SDKs are built on httpx2; binding their `http_client` to one of
these is the whole recording seam."""

from __future__ import annotations

import asyncio

import httpx2

from ._run import Run
from ._upstream import WireRequest, WireResponse


def _wire(request: httpx2.Request, body: bytes) -> WireRequest:
    return WireRequest(request.method, str(request.url), tuple(request.headers.multi_items()), body)


def _response(request: httpx2.Request, answer: WireResponse) -> httpx2.Response:
    return httpx2.Response(
        status_code=answer.status,
        headers=list(answer.headers),
        content=answer.body,
        request=request,
    )


class RunTransport(httpx2.BaseTransport):
    """For sync clients: the agent's thread waits while the run's event loop serves."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        answer = self.run.exchange_from_thread(_wire(request, request.read()))
        return _response(request, answer)


class AsyncRunTransport(httpx2.AsyncBaseTransport):
    """For async clients: on the run's own event loop, or on a loop of the agent's own (a
    sync agent that calls `asyncio.run` inside, as frameworks' `run_sync` do). The exchange
    always runs on the run's loop, whose live connections belong to it; a foreign loop
    awaits its answer."""

    def __init__(self, run: Run) -> None:
        self.run = run

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        wire = _wire(request, await request.aread())
        if asyncio.get_running_loop() is self.run.loop:
            answer = await self.run.exchange(wire)
        else:
            future = asyncio.run_coroutine_threadsafe(self.run.exchange(wire), self.run.loop)
            answer = await asyncio.wrap_future(future)
        return _response(request, answer)
