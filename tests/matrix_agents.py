"""Small agents covering both SDKs, sync and async, streaming and not (test fixtures)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import car_ray
from car_ray.providers import Action, ChatRequest, ToolCall

# Tests change these to make a replay diverge at a known step.
SYSTEM = "You answer weather questions. Use the tool."
FOLLOWUP = "Answer in one sentence."
EXECUTED: list[str] = []


def get_weather(city: str) -> dict[str, Any]:
    EXECUTED.append(city)
    return {"city": city, "forecast": "rain", "celsius": 11}


async def aget_weather(city: str) -> dict[str, Any]:
    return get_weather(city)


class WeatherPolicy:
    """Step 0: call the tool. After its result: one of two answers, 50/50."""

    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        if not any(m.role == "tool" for m in request.messages):
            return [(1.0, Action(tool_calls=(ToolCall("get_weather", {"city": "Oslo"}),)))]
        return [(0.5, Action(text="Bring an umbrella.")), (0.5, Action(text="Stay inside."))]


POLICY = WeatherPolicy()
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "get_weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def _openai_turn(client: Any, messages: list[dict[str, Any]], stream: bool) -> tuple[str, Any]:
    if not stream:
        reply = client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=OPENAI_TOOLS
        )
        return reply.choices[0].message.content or "", reply.choices[0].message.tool_calls
    text, calls = "", {}
    for chunk in client.chat.completions.create(
        model="gpt-4o-mini",
        messages=messages,
        tools=OPENAI_TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    ):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    return text, [calls[i] for i in sorted(calls)]


def openai_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    stream = bool(ctx.input["stream"])
    client = ctx.openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    _, calls = _openai_turn(client, messages, stream)
    call = calls[0]
    call_id = call["id"] if isinstance(call, dict) else call.id
    name = call["name"] if isinstance(call, dict) else call.function.name
    arguments = json.loads(call["arguments"] if isinstance(call, dict) else call.function.arguments)
    weather = ctx.tool(name, get_weather, **arguments)
    messages.append(
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(weather)})
    messages.append({"role": "user", "content": FOLLOWUP})
    answer, _ = _openai_turn(client, messages, stream)
    return {"answer": answer, "at": ctx.now(), "id": str(ctx.uuid4()), "r": ctx.random()}


async def async_openai_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    stream = bool(ctx.input["stream"])
    client = ctx.async_openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Oslo?"},
    ]

    async def turn() -> tuple[str, list[dict[str, str]]]:
        if not stream:
            reply = await client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=OPENAI_TOOLS
            )
            message = reply.choices[0].message
            return message.content or "", [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in message.tool_calls or []
            ]
        text, calls = "", {}
        async for chunk in await client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=OPENAI_TOOLS, stream=True
        ):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        return text, [calls[i] for i in sorted(calls)]

    _, calls = await turn()
    call = calls[0]
    arguments = json.loads(call["arguments"])
    weather = await ctx.tool(call["name"], aget_weather, **arguments)
    messages.append(
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(weather)})
    messages.append({"role": "user", "content": FOLLOWUP})
    answer, _ = await turn()
    return {"answer": answer, "at": ctx.now(), "id": str(ctx.uuid4()), "r": ctx.random()}


def _anthropic_messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Weather in Oslo?"}]


def anthropic_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    stream = bool(ctx.input["stream"])
    client = ctx.anthropic()
    messages = _anthropic_messages()

    def turn() -> Any:
        kwargs: dict[str, Any] = {
            "model": "claude-haiku-4-5",
            "max_tokens": 256,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
        if stream:
            with client.messages.stream(**kwargs) as s:
                return s.get_final_message()
        return client.messages.create(**kwargs)

    first = turn()
    use = next(b for b in first.content if b.type == "tool_use")
    weather = ctx.tool(use.name, get_weather, **use.input)
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": json.dumps(weather)},
                {"type": "text", "text": FOLLOWUP},
            ],
        }
    )
    final = turn()
    answer = "".join(b.text for b in final.content if b.type == "text")
    return {"answer": answer, "at": ctx.now(), "id": str(ctx.uuid4()), "r": ctx.random()}


async def async_anthropic_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    stream = bool(ctx.input["stream"])
    client = ctx.async_anthropic()
    messages = _anthropic_messages()

    async def turn() -> Any:
        kwargs: dict[str, Any] = {
            "model": "claude-haiku-4-5",
            "max_tokens": 256,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
        if stream:
            async with client.messages.stream(**kwargs) as s:
                return await s.get_final_message()
        return await client.messages.create(**kwargs)

    first = await turn()
    use = next(b for b in first.content if b.type == "tool_use")
    weather = await ctx.tool(use.name, aget_weather, **use.input)
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": json.dumps(weather)},
                {"type": "text", "text": FOLLOWUP},
            ],
        }
    )
    final = await turn()
    answer = "".join(b.text for b in final.content if b.type == "text")
    return {"answer": answer, "at": ctx.now(), "id": str(ctx.uuid4()), "r": ctx.random()}


RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in OPENAI_TOOLS]


def responses_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    """The Responses API, sync: the conversation kept by the provider (previous_response_id);
    streaming through the SDK's `responses.stream` helper, which checks every event."""
    stream = bool(ctx.input["stream"])
    client = ctx.openai()

    def turn(input: Any, previous: str | None) -> Any:
        kwargs: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "instructions": SYSTEM,
            "input": input,
            "tools": RESPONSES_TOOLS,
        }
        if previous is not None:
            kwargs["previous_response_id"] = previous
        if stream:
            with client.responses.stream(**kwargs) as events:
                return events.get_final_response()
        return client.responses.create(**kwargs)

    first = turn("Weather in Oslo?", None)
    call = next(item for item in first.output if item.type == "function_call")
    weather = ctx.tool(call.name, get_weather, **json.loads(call.arguments))
    output = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": json.dumps(weather),
    }
    final = turn([output, {"role": "user", "content": FOLLOWUP}], first.id)
    return {"answer": final.output_text, "at": ctx.now(), "id": str(ctx.uuid4()), "r": ctx.random()}


async def async_responses_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    """The Responses API, async: the whole conversation sent each turn; streaming by
    iterating `responses.create(stream=True)`'s events."""
    stream = bool(ctx.input["stream"])
    client = ctx.async_openai()
    conversation: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]

    async def turn() -> Any:
        kwargs: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "instructions": SYSTEM,
            "input": conversation,
            "tools": RESPONSES_TOOLS,
        }
        if not stream:
            return await client.responses.create(**kwargs)
        final = None
        async for event in await client.responses.create(**kwargs, stream=True):
            if event.type == "response.completed":
                final = event.response
        return final

    first = await turn()
    call = next(item for item in first.output if item.type == "function_call")
    weather = await ctx.tool(call.name, aget_weather, **json.loads(call.arguments))
    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append(
        {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(weather)}
    )
    conversation.append({"role": "user", "content": FOLLOWUP})
    final = await turn()
    return {"answer": final.output_text, "at": ctx.now(), "id": str(ctx.uuid4()), "r": ctx.random()}


AGENTS = {
    ("openai", "sync"): openai_agent,
    ("openai", "async"): async_openai_agent,
    ("anthropic", "sync"): anthropic_agent,
    ("anthropic", "async"): async_anthropic_agent,
    ("responses", "sync"): responses_agent,
    ("responses", "async"): async_responses_agent,
}


def umbrella(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 (the 'bad' outcome here) when the answer says to bring an umbrella."""
    return 1.0 if result and "umbrella" in str(result.get("answer", "")) else 0.0


class CoinPolicy:
    """Any request: "heads" or "tails", 50/50."""

    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        return [(0.5, Action(text="heads")), (0.5, Action(text="tails"))]


def ask_twice(ctx: car_ray.AgentContext) -> list[str]:
    """The same question twice: the second request never depends on the first answer."""
    client = ctx.openai()
    messages = [{"role": "user", "content": "Heads or tails?"}]
    return [
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        .choices[0]
        .message.content
        or ""
        for _ in range(2)
    ]


def second_tails(result: Any, trajectory: list[dict[str, Any]]) -> float:
    return 1.0 if result and result[1] == "tails" else 0.0
