"""Live calls to a model provider: pooled connections, 429 / 5xx retried with backoff."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx2

_HOP_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding"})


@dataclass(frozen=True)
class WireRequest:
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True)
class WireResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    retries: int = 0
    latency_s: float = 0.0

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)


@dataclass(frozen=True)
class RetryPolicy:
    """Which answers are retried and how long to wait: Retry-After wins over backoff."""

    max_attempts: int = 6
    base_delay_s: float = 0.05
    max_delay_s: float = 8.0
    retry_statuses: frozenset[int] = frozenset({408, 409, 429, 500, 502, 503, 504})

    def delay_s(self, attempt: int, response: WireResponse | None) -> float:
        if response is not None:
            for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
                value = response.header(header)
                if value is not None:
                    try:
                        return min(self.max_delay_s, max(0.0, float(value) * scale))
                    except ValueError:
                        pass
        backoff = self.base_delay_s * 2.0**attempt
        return min(self.max_delay_s, backoff * (0.5 + random.random() / 2))


class RateLimiter:
    """Token buckets over requests and (estimated) tokens per minute: a worker's share of
    the provider's limits. A request waits until both buckets can pay for it."""

    def __init__(
        self, requests_per_minute: float | None = None, tokens_per_minute: float | None = None
    ) -> None:
        self._requests = _Bucket(requests_per_minute) if requests_per_minute else None
        self._tokens = _Bucket(tokens_per_minute) if tokens_per_minute else None

    async def acquire(self, tokens: int = 0) -> None:
        for bucket, cost in ((self._requests, 1.0), (self._tokens, float(tokens))):
            if bucket is not None and cost > 0:
                await bucket.take(cost)


class _Bucket:
    def __init__(self, per_minute: float) -> None:
        if per_minute <= 0:
            raise ValueError("a rate limit must be positive")
        self.rate_per_s = per_minute / 60.0
        # Up to one second's worth at once (at least one request's worth).
        self.capacity = max(1.0, self.rate_per_s)
        self.level = self.capacity
        self.stamp = time.monotonic()

    async def take(self, cost: float) -> None:
        cost = min(cost, self.capacity)  # a request larger than the bucket waits for a full one
        while True:
            now = time.monotonic()
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate_per_s)
            self.stamp = now
            if self.level >= cost:
                self.level -= cost
                return
            await asyncio.sleep((cost - self.level) / self.rate_per_s)


class Upstream(Protocol):
    """Sends one request to the live provider and returns the whole answer."""

    async def send(self, request: WireRequest) -> WireResponse: ...

    async def aclose(self) -> None: ...


class _RetryingUpstream:
    def __init__(self, retry: RetryPolicy, limiter: RateLimiter | None = None) -> None:
        self.retry = retry
        self.limiter = limiter

    async def _once(self, request: WireRequest) -> WireResponse:
        raise NotImplementedError

    async def send(self, request: WireRequest) -> WireResponse:
        started = time.perf_counter()
        attempt = 0
        while True:
            response: WireResponse | None = None
            if self.limiter is not None:
                # About four bytes of JSON a token: the limiter needs an estimate up front.
                await self.limiter.acquire(len(request.body) // 4)
            try:
                response = await self._once(request)
            except (TimeoutError, aiohttp.ClientError, httpx2.TransportError):
                if attempt + 1 >= self.retry.max_attempts:
                    raise
            if response is not None and (
                response.status not in self.retry.retry_statuses
                or attempt + 1 >= self.retry.max_attempts
            ):
                return WireResponse(
                    response.status,
                    response.headers,
                    response.body,
                    retries=attempt,
                    latency_s=time.perf_counter() - started,
                )
            await asyncio.sleep(self.retry.delay_s(attempt, response))
            attempt += 1


class AiohttpUpstream(_RetryingUpstream):
    """The default live transport: one aiohttp session (pooled keep-alive connections)."""

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        max_connections: int = 256,
        timeout_s: float = 600,
        limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(retry or RetryPolicy(), limiter)
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    async def _once(self, request: WireRequest) -> WireResponse:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session_loop is not loop:
            # A session belongs to the loop it was made on; a runner reused from another
            # loop (one asyncio.run per call) gets a fresh pool there.
            self._session_loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                timeout=self._timeout,
                auto_decompress=True,
            )
        headers = [(k, v) for k, v in request.headers if k.lower() not in _HOP_HEADERS]
        async with self._session.request(
            request.method, request.url, headers=headers, data=request.body or None
        ) as resp:
            body = await resp.read()
            return WireResponse(
                resp.status,
                tuple((k, v) for k, v in resp.headers.items() if k.lower() != "content-encoding"),
                body,
            )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpxUpstream(_RetryingUpstream):
    """httpx2's own pool: kept to measure against (see benchmarks/fork_overhead.py)."""

    def __init__(self, retry: RetryPolicy | None = None, max_connections: int = 256) -> None:
        super().__init__(retry or RetryPolicy())
        self._client = httpx2.AsyncClient(
            limits=httpx2.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            timeout=600,
        )

    async def _once(self, request: WireRequest) -> WireResponse:
        headers = [(k, v) for k, v in request.headers if k.lower() not in _HOP_HEADERS]
        resp = await self._client.request(
            request.method, request.url, headers=headers, content=request.body
        )
        return WireResponse(
            resp.status_code,
            tuple((k, v) for k, v in resp.headers.items() if k.lower() != "content-encoding"),
            resp.content,
        )

    async def aclose(self) -> None:
        await self._client.aclose()
