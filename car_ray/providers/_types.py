"""Provider-neutral views of a chat exchange: what the model was asked and what it did."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ProviderName = Literal["openai", "anthropic"]
# The header by which a fork seeds a live draw (the simulated provider honours it).
SEED_HEADER = "x-car-ray-seed"
# What a provider does with that seed (`car_ray.sim.SimApp` serves each): `coupled`, the same
# seed lands on the same point of a changed request's distribution; `seeded`, an identical
# request with the same seed answers the same and a changed one is an unrelated sample (as
# OpenAI's `seed`); `unseeded`, every call is a fresh sample (as Anthropic).
Draws = Literal["coupled", "seeded", "unseeded"]


class ProviderFormatError(ValueError):
    """A request or response body that does not follow the provider's wire format."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Action:
    """What a model did in one turn: some text, some tool calls, or both."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def describe(self) -> str:
        parts: list[str] = []
        if self.text:
            parts.append(self.text)
        for call in self.tool_calls:
            parts.append(f"{call.name}({json.dumps(call.arguments, sort_keys=True)})")
        return " | ".join(parts) if parts else "(empty)"

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in self.tool_calls],
        }


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ChatRequest:
    """A parsed chat request: enough for a scenario policy to decide and a codec to answer."""

    provider: ProviderName
    model: str
    messages: tuple[Message, ...]
    tools: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def transcript(self) -> str:
        """Every message's text joined: what a policy greps for."""
        return "\n".join(m.content for m in self.messages)


class Codec(Protocol):
    """One provider's wire format, both directions."""

    provider: ProviderName
    path_suffix: str
    id_prefix: str  # how the provider's response ids start

    def parse_request(self, body: dict[str, Any]) -> ChatRequest: ...

    def render_response(
        self, request: ChatRequest, action: Action, usage: Usage, response_id: str
    ) -> bytes: ...

    def parse_response(self, body: bytes, stream: bool) -> tuple[Action, Usage]: ...

    def answer_ids(self, body: bytes, stream: bool) -> tuple[str, ...]:
        """The ids an answer issues that an agent may send back in a later request (its
        tool calls', and a Responses answer's own and its items'), in the answer's order:
        two answers of one action have them at the same places."""
        ...


def estimate_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: about four characters a token."""
    return max(1, (len(text) + 3) // 4)


def estimate_usage(request: ChatRequest, action: Action) -> Usage:
    prompt = sum(estimate_tokens(m.content) + 3 for m in request.messages)
    prompt += sum(estimate_tokens(t) + 8 for t in request.tools)
    completion = estimate_tokens(action.text or "") if action.text else 0
    for call in action.tool_calls:
        completion += estimate_tokens(call.name + json.dumps(call.arguments)) + 3
    return Usage(input_tokens=prompt, output_tokens=max(1, completion))


def sse_event(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {payload}\n\n".encode()


def iter_sse_data(body: bytes) -> list[tuple[str | None, str]]:
    """(event, data) pairs of a complete SSE body."""
    out: list[tuple[str | None, str]] = []
    for block in body.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        event: str | None = None
        data_lines: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data_lines.append(line[5:].lstrip(" "))
        if data_lines:
            out.append((event, "\n".join(data_lines)))
    return out


def chunks_of(text: str, size: int = 24) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
