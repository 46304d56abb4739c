"""`AgentContext`: everything an agent may touch that car-ray records and replays."""

from __future__ import annotations

import inspect
import random
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx2

from ._run import Run
from ._transport import AsyncRunTransport, RunTransport

if TYPE_CHECKING:  # the SDKs load when an agent asks for a client: 2.6 s of every CLI start
    import anthropic as anthropic_sdk
    import openai as openai_sdk

_PLACEHOLDER_KEY = "car-ray-no-key"


class AgentContext:
    """The agent's handle on the world: model clients, tools, clock, ids and randomness.

    Everything that goes through it is recorded on a tape and served back on replay;
    anything the agent does around it is invisible to car-ray."""

    def __init__(
        self,
        run: Run,
        input: Any,
        base_urls: dict[str, str],
        api_keys: dict[str, str] | None = None,
    ) -> None:
        self._run = run
        self.input = input
        self._base_urls = base_urls
        self._api_keys = api_keys or {}
        self._clients: dict[str, Any] = {}

    def _key(self, provider: str) -> str:
        return self._api_keys.get(provider) or _PLACEHOLDER_KEY

    def _base(self, provider: str) -> str:
        try:
            return self._base_urls[provider]
        except KeyError:
            raise RuntimeError(
                f"no base URL for provider {provider!r}: set it in the job's [provider] table"
            ) from None

    def _cached(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._clients:
            self._clients[name] = make()
        return self._clients[name]

    def api_key(self, provider: str) -> str:
        """The key this run's `provider` ("openai" or "anthropic") is called with (a
        placeholder without one), for a framework's client: keys reach the provider in the
        request's headers and never a tape or a log."""
        return self._key(provider)

    def base_url(self, provider: str) -> str:
        """The base URL this run's `provider` ("openai" or "anthropic") answers on: what the
        SDK clients use, for an agent that calls the API with `http_client` instead (POST to
        `base_url("openai") + "/chat/completions"` or `base_url("anthropic") +
        "/v1/messages"`: each exchange is a step as an SDK call is)."""
        return self._base(provider)

    @property
    def http_client(self) -> httpx2.Client:
        """A sync httpx2 client whose every request is a recorded step."""
        client: httpx2.Client = self._cached(
            "http", lambda: httpx2.Client(transport=RunTransport(self._run), timeout=600)
        )
        return client

    @property
    def async_http_client(self) -> httpx2.AsyncClient:
        client: httpx2.AsyncClient = self._cached(
            "ahttp",
            lambda: httpx2.AsyncClient(transport=AsyncRunTransport(self._run), timeout=600),
        )
        return client

    # The SDKs' own retries are off: car-ray's live transport retries 429 / 5xx itself, so
    # that one step is one exchange on the tape.
    def openai(self) -> openai_sdk.OpenAI:
        import openai as openai_sdk

        client: openai_sdk.OpenAI = self._cached(
            "openai",
            lambda: openai_sdk.OpenAI(
                api_key=self._key("openai"),
                base_url=self._base("openai"),
                http_client=self.http_client,
                max_retries=0,
            ),
        )
        return client

    def async_openai(self) -> openai_sdk.AsyncOpenAI:
        import openai as openai_sdk

        client: openai_sdk.AsyncOpenAI = self._cached(
            "aopenai",
            lambda: openai_sdk.AsyncOpenAI(
                api_key=self._key("openai"),
                base_url=self._base("openai"),
                http_client=self.async_http_client,
                max_retries=0,
            ),
        )
        return client

    def anthropic(self) -> anthropic_sdk.Anthropic:
        import anthropic as anthropic_sdk

        client: anthropic_sdk.Anthropic = self._cached(
            "anthropic",
            lambda: anthropic_sdk.Anthropic(
                api_key=self._key("anthropic"),
                base_url=self._base("anthropic"),
                http_client=self.http_client,
                max_retries=0,
            ),
        )
        return client

    def async_anthropic(self) -> anthropic_sdk.AsyncAnthropic:
        import anthropic as anthropic_sdk

        client: anthropic_sdk.AsyncAnthropic = self._cached(
            "aanthropic",
            lambda: anthropic_sdk.AsyncAnthropic(
                api_key=self._key("anthropic"),
                base_url=self._base("anthropic"),
                http_client=self.async_http_client,
                max_retries=0,
            ),
        )
        return client

    def tool(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        effect: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Call `fn(*args, **kwargs)` as a recorded step. For an async `fn` this returns an
        awaitable.

        `effect=True` marks a tool with side effects (a refund, an email): it only ever runs
        while recording; replays and forks serve its recorded result or stop the fork.
        `name` and `fn` are positional-only, so a tool's own `name=` or `fn=` argument
        reaches it; `effect` is car-ray's keyword and never reaches the tool: bind a tool
        argument of that name with a lambda or `functools.partial` (it is then not among
        the recorded arguments a replay compares)."""
        if inspect.iscoroutinefunction(fn):
            return self._run.atool(name, fn, args, kwargs, effect)
        return self._run.tool(name, fn, args, kwargs, effect)

    def now(self) -> float:
        """Seconds since the epoch, recorded."""
        value: float = self._run.nondet("now", time.time)
        return value

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(self._run.nondet("uuid4", lambda: str(uuid.uuid4())))

    def random(self) -> float:
        """A float in [0, 1), recorded."""
        value: float = self._run.nondet("random", random.random)
        return value
