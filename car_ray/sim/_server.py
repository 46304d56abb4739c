"""The simulated provider as a plain ASGI app: OpenAI and Anthropic endpoints over one policy."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import replace
from typing import Any, get_args

from car_ray._canon import digest_of
from car_ray.providers import (
    OPENAI,
    READS,
    RESPONSES,
    SEED_HEADER,
    Action,
    ChatRequest,
    Codec,
    Draws,
    Message,
    ProviderFormatError,
    ProviderName,
    codec_for_path,
    estimate_usage,
    unseeded_body,
)

from ._policy import (
    Distribution,
    PolicyError,
    ScenarioPolicy,
    distribution_of,
    draw,
    policy_name,
    uniform_for_seed,
)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

STATS_PATH = "/_car_ray/stats"

DRAWS: tuple[str, ...] = get_args(Draws)

# Error `type`s as each provider spells them, by status.
_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "requests"}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(provider: ProviderName | None, status: int, message: str) -> bytes:
    """A JSON error body shaped the way `provider`'s SDK expects (OpenAI's shape when unknown)."""
    if provider == "anthropic":
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        data: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        kind = _OPENAI_ERROR_TYPES.get(status, "server_error")
        code = "rate_limit_exceeded" if status == 429 else None
        data = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json.dumps(data, separators=(",", ":")).encode()


class SimApp:
    """An ASGI app answering chat requests from `policy`, with optional latency, 429s and 5xx.

    Faults come from an RNG seeded by `fault_seed`, independent of the action draw. `draws`
    is what a seed (`x-car-ray-seed: N`) does:

    - `coupled` (the default): the action at `uniform_for_seed(N)` on the request's
      distribution, so equal seeds give equal actions and a changed request with the recorded
      seed lands on the same point of its new distribution (common random numbers);
    - `seeded`, as OpenAI's `seed`: an identical request with the same seed answers the same,
      a changed request is an unrelated sample (a chat completion's seed is its body's
      `seed`, as OpenAI reads it; without one, a fresh sample);
    - `unseeded`, as Anthropic (no seed): every call is a fresh sample, an identical request
      with the recorded seed included.

    `seeded` and `unseeded` answer with fresh ids every time (the response's and its tool
    calls'), a reproduced answer too, as real providers do; `coupled`'s are a function of the
    request and the action.

    Counters are public attributes.
    """

    def __init__(
        self,
        policy: ScenarioPolicy,
        *,
        latency_s: float = 0.0,
        rate_429: float = 0.0,
        rate_5xx: float = 0.0,
        retry_after_s: float = 0.05,
        fault_seed: int = 0,
        draws: Draws = "coupled",
    ) -> None:
        if draws not in DRAWS:
            raise ValueError(f"draws={draws!r}: one of {', '.join(DRAWS)}")
        if not isinstance(policy, ScenarioPolicy):
            raise PolicyError(
                f"{policy_name(policy)} is not a scenario policy: it needs a method "
                "distribution(request) -> [(probability, Action), ...]"
            )
        if not (0.0 <= rate_429 <= 1.0 and 0.0 <= rate_5xx <= 1.0 and rate_429 + rate_5xx <= 1.0):
            raise ValueError(
                f"rate_429={rate_429} and rate_5xx={rate_5xx} must lie in [0, 1] "
                "and sum to at most 1"
            )
        if latency_s < 0 or not math.isfinite(latency_s):
            raise ValueError(f"latency_s must be a finite number >= 0, got {latency_s}")
        if retry_after_s <= 0 or not math.isfinite(retry_after_s):
            raise ValueError(f"retry_after_s must be a finite number > 0, got {retry_after_s}")
        self.policy = policy
        self.latency_s = latency_s
        self.rate_429 = rate_429
        self.rate_5xx = rate_5xx
        self.retry_after_s = retry_after_s
        # Two streams so that turning faults on or off never shifts which actions are drawn.
        self._fault_rng = random.Random(f"car-ray/sim/faults/{fault_seed}")
        self._action_rng = random.Random(f"car-ray/sim/actions/{fault_seed}")
        self.draws = draws
        # Unseeded: entropy from the system, so no two servers (nor two calls) share a draw.
        self._unseeded_rng = random.SystemRandom()
        # Responses answers by id, for `previous_response_id`: the conversation each ended.
        self._responses: dict[str, tuple[Message, ...]] = {}
        self.requests = 0
        self.served = 0
        self.rate_limited = 0
        self.faults = 0
        self.errors = 0
        self.by_provider: dict[str, int] = {"openai": 0, "anthropic": 0}

    def stats(self) -> dict[str, Any]:
        """The counters as served at GET /_car_ray/stats."""
        return {
            "requests": self.requests,
            "served": self.served,
            "rate_limited": self.rate_limited,
            "faults": self.faults,
            "errors": self.errors,
            "by_provider": dict(self.by_provider),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if method == "GET" and path == STATS_PATH:
            await _respond(send, 200, json.dumps(self.stats()).encode())
            return
        codec = codec_for_path(path) if method == "POST" else None
        if codec is None:
            message = f"car-ray sim has no route {method} {path}: {READS} or GET {STATS_PATH}"
            await _respond(send, 404, error_body(None, 404, message))
            return
        body = await _read_body(receive)
        status, headers, payload = await self._chat(codec, _headers(scope), body)
        await _respond(send, status, payload, headers)

    async def _chat(
        self, codec: Codec, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """One chat exchange: (status, extra headers, body); content-type included for 200."""
        provider = codec.provider
        self.requests += 1
        self.by_provider[provider] += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)

        fault = self._fault_rng.random()
        if fault < self.rate_429:
            self.rate_limited += 1
            retry = [
                # The standard header is whole seconds; the SDKs prefer the precise one.
                ("retry-after", str(max(1, math.ceil(self.retry_after_s)))),
                ("retry-after-ms", str(max(1, round(self.retry_after_s * 1000)))),
            ]
            return 429, retry, error_body(provider, 429, "simulated rate limit: retry later")
        if fault < self.rate_429 + self.rate_5xx:
            self.faults += 1
            # The 5xx band's lower half is a 500, the upper a 503: one draw per request.
            status = 500 if fault < self.rate_429 + self.rate_5xx / 2 else 503
            return status, [], error_body(provider, status, f"simulated server fault ({status})")

        try:
            request = self._conversation(_parse(codec, body))
            seed = self._draw_seed(self._seed_of(codec, headers, request.raw), request.raw)
        except ProviderFormatError as exc:
            self.errors += 1
            return 400, [], error_body(provider, 400, str(exc))

        try:
            distribution = distribution_of(self.policy, request)
            action = self.choose(distribution, seed)
            usage = estimate_usage(request, action)
            response_id = self._response_id(codec, seed, body, request.raw.get("seed"), action)
            rendered = codec.render_response(request, action, usage, response_id)
        except PolicyError as exc:
            self.errors += 1
            return 500, [], error_body(provider, 500, str(exc))
        except Exception as exc:  # a user's policy may raise anything: report it, keep serving
            self.errors += 1
            message = f"scenario policy {policy_name(self.policy)} failed: "
            message += f"{type(exc).__name__}: {exc}"
            return 500, [], error_body(provider, 500, message)
        self.served += 1
        if codec is RESPONSES:
            self._remember(request, action, response_id)
        content_type = "text/event-stream" if request.stream else "application/json"
        return 200, [("content-type", content_type), ("cache-control", "no-cache")], rendered

    def _seed_of(self, codec: Codec, headers: dict[str, str], body: dict[str, Any]) -> int | None:
        """The seed a request carries: `seeded`, a chat completion's body `seed` (where
        OpenAI reads it; none there, a fresh sample); otherwise SEED_HEADER."""
        if self.draws != "seeded" or codec is not OPENAI:
            return _seed(headers)
        value = body.get("seed")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProviderFormatError(f"seed must be an integer, got {value!r}")
        return value

    def _draw_seed(self, seed: int | None, body: dict[str, Any]) -> int | None:
        """The seed the action is drawn with, as `draws` says (`body`: the request, parsed)."""
        if seed is None or self.draws == "coupled":
            return seed
        if self.draws == "unseeded":
            return self._unseeded_rng.getrandbits(60)
        # Seeded: the request's canonical digest joins the seed (key order and spacing do
        # not make another request).
        digest = digest_of(body)
        return int(hashlib.sha256(f"{seed}:{digest}".encode()).hexdigest()[:15], 16)

    def choose(self, distribution: Distribution, seed: int | None) -> Action:
        """The action answered: the one at the seed's uniform on the CDF (the server RNG's
        without a seed). The exact solver overrides this to enumerate branches instead."""
        u = uniform_for_seed(seed) if seed is not None else self._action_rng.random()
        return draw(distribution, u)

    async def answer(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """One POST to a chat endpoint, in process (no HTTP): (status, headers, body)."""
        codec = codec_for_path(path)
        if codec is None:
            return 404, [], error_body(None, 404, f"car-ray sim has no route POST {path}")
        return await self._chat(codec, headers, body)

    def _conversation(self, request: ChatRequest) -> ChatRequest:
        """A Responses request with `previous_response_id`: its instructions, the conversation
        that response ended (without that request's instructions, which the API does not carry
        over), then the request's own input, as the API keeps a conversation server-side."""
        previous = request.raw.get("previous_response_id")
        if previous is None:
            return request
        head, own = _instructions(request)
        before = self._responses.get(str(previous))
        if before is None:
            raise ProviderFormatError(
                f"Previous response with id {previous!r} not found (this simulated provider "
                f"keeps the last {_KEPT_RESPONSES} responses it served)"
            )
        return replace(request, messages=(*head, *before, *own))

    def _remember(self, request: ChatRequest, action: Action, response_id: str) -> None:
        """Keep a served Responses answer's conversation for a later `previous_response_id`."""
        turn = Message("assistant", action.text or "", action.tool_calls)
        _, history = _instructions(request)
        self._responses[response_id] = (*history, turn)
        while len(self._responses) > _KEPT_RESPONSES:
            self._responses.pop(next(iter(self._responses)))

    def _response_id(
        self, codec: Codec, seed: int | None, body: bytes, sent: Any, action: Action
    ) -> str:
        """`coupled`: a hash of the request and the action drawn, so a fresh draw that lands
        on the recorded action answers byte for byte as the recording did; `seeded` and
        `unseeded`: fresh and unique at every answer (the ids of its tool calls too, which
        the codecs derive from it), as a real provider's are, reproduced answer or not; a
        coupled request without a seed: the server RNG."""
        if self.draws != "coupled":
            suffix = f"{self._unseeded_rng.getrandbits(96):024x}"
        elif seed is None:
            suffix = f"{self._action_rng.getrandbits(96):024x}"
        else:
            # The body as the agent sent it: the seed car-ray adds for OpenAI (`sent`, the
            # body's) is no part of the request's identity (`unseeded_body`).
            if codec is OPENAI and isinstance(sent, int):
                body = unseeded_body(body, sent)
            body_digest = hashlib.sha256(body).hexdigest()
            drawn = json.dumps(action.to_json(), sort_keys=True)
            suffix = hashlib.sha256(f"{body_digest}:{drawn}".encode()).hexdigest()[:24]
        return codec.id_prefix + suffix


# Responses answers the simulated provider keeps for `previous_response_id`.
_KEPT_RESPONSES = 50_000


def _instructions(request: ChatRequest) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """A Responses request's messages split into its instructions (the codec puts them
    first) and the rest."""
    if request.raw.get("instructions") and request.messages:
        return request.messages[:1], request.messages[1:]
    return (), request.messages


def _parse(codec: Codec, body: bytes) -> ChatRequest:
    """The body as the codec's request, every malformation as a ProviderFormatError."""
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise ProviderFormatError(f"{codec.provider} request body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ProviderFormatError(f"{codec.provider} request body must be a JSON object")
    try:
        return codec.parse_request(payload)
    except ProviderFormatError:
        raise
    except (KeyError, TypeError, AttributeError) as exc:
        # The codecs index into the body freely; a missing or mistyped field lands here.
        raise ProviderFormatError(
            f"{codec.provider} request body is malformed: {type(exc).__name__}: {exc}"
        ) from None


def _seed(headers: dict[str, str]) -> int | None:
    value = headers.get(SEED_HEADER)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ProviderFormatError(
            f"header {SEED_HEADER} must be an integer, got {value!r}"
        ) from None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _respond(
    send: Send, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()
) -> None:
    names = {name for name, _ in headers}
    all_headers = list(headers)
    if "content-type" not in names:
        all_headers.append(("content-type", "application/json"))
    all_headers.append(("content-length", str(len(body))))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in all_headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
