"""The live transport's own behaviour: rate limits and Retry-After."""

from __future__ import annotations

import asyncio
import time

from car_ray.replay import AiohttpUpstream, RateLimiter
from car_ray.replay._upstream import WireRequest
from car_ray.sim import SimServer

from . import matrix_agents
from .conftest import run


def test_the_rate_limiter_spaces_requests_to_its_share() -> None:
    limiter = RateLimiter(requests_per_minute=600)  # 10 a second, a burst of 10

    async def go() -> float:
        started = time.monotonic()
        await asyncio.gather(*(limiter.acquire() for _ in range(30)))
        return time.monotonic() - started

    elapsed = run(go())
    # 10 at once, then 20 more at 10 a second: about 2 s (never less).
    assert 1.9 <= elapsed <= 3.0


def test_a_429_is_retried_after_its_retry_after_and_counted() -> None:
    with SimServer(matrix_agents.POLICY, rate_429=1.0, retry_after_s=0.05) as sim:
        upstream = AiohttpUpstream()
        body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
        request = WireRequest(
            "POST",
            sim.openai_base_url + "/chat/completions",
            (("content-type", "application/json"),),
            body,
        )

        async def go() -> tuple[int, int, float]:
            started = time.monotonic()
            try:
                answer = await upstream.send(request)
            finally:
                await upstream.aclose()
            return answer.status, answer.retries, time.monotonic() - started

        status, retries, elapsed = run(go())
    # Every answer is a 429: the transport gives up after its attempts, each after the
    # server's Retry-After (50 ms), and says how many retries it made.
    assert status == 429
    assert retries == 5
    assert elapsed >= 5 * 0.05
    assert sim.app.rate_limited == 6
