"""A payout review that walks a checklist, one model call and one tool call an item, then
decides: the shape of the noisy suite's sparse and dense scenarios.

For each of `ctx.input["items"]` items the model calls `check_item(item=i, verdict=...)`; the
last model call answers in text. Most items have one verdict the model always gives; the
scenario's policy plants the items where it may flag an item as "waived" (a risky choice).
The payout goes out wrongly when the waived items reach the input's `threshold` (1 unless
given). Every model call varies its
wording (the scenario wraps its policy in `car_ray.sim.Worded`). The sync openai SDK. On
the recorded path the tape has 2 * items + 1 steps: item i's model call is step 2i."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import car_ray

MODEL = "gpt-4o-mini"
SYSTEM = "You review a payout item by item with check_item, then summarise in one line."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "check_item",
            "parameters": {
                "type": "object",
                "properties": {
                    "item": {"type": "integer"},
                    "verdict": {"enum": ["ok", "waived"]},
                },
                "required": ["item", "verdict"],
            },
        },
    }
]


def check_item(item: int, verdict: str) -> dict[str, Any]:
    return {"item": item, "recorded": verdict}


def _asker(ctx: car_ray.AgentContext) -> Callable[[list[dict[str, Any]]], dict[str, Any]]:
    """One chat completion of the messages, its message as the conversation keeps it: through
    the sync openai SDK, or (input `client = "http"`) posted as JSON, as a long tape's agent
    does (the SDK's request transform takes most of a fork's time at a hundred items)."""
    if ctx.input.get("client") == "http":
        http = ctx.http_client
        url = ctx.base_url("openai") + "/chat/completions"

        def post(messages: list[dict[str, Any]]) -> dict[str, Any]:
            response = http.post(url, json={"model": MODEL, "messages": messages, "tools": TOOLS})
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
            return {k: v for k, v in message.items() if v is not None}

        return post
    client = ctx.openai()

    def create(messages: list[dict[str, Any]]) -> dict[str, Any]:
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        return reply.choices[0].message.model_dump(exclude_none=True)

    return create


def review_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    ask = _asker(ctx)
    items = int(ctx.input["items"])
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Review payout {ctx.input['payout']}: {items} items."},
    ]
    waived: list[int] = []
    threshold = int(ctx.input.get("threshold", 1))
    for _ in range(items + 1):
        message = ask(messages)
        calls = message.get("tool_calls")
        if not calls:
            return {"waived": waived, "threshold": threshold, "summary": message.get("content")}
        messages.append(message)
        for call in calls:
            arguments = json.loads(call["function"]["arguments"])
            output = ctx.tool("check_item", check_item, **arguments)
            if arguments.get("verdict") == "waived":
                waived.append(int(arguments["item"]))
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(output)}
            )
    return {"waived": waived, "threshold": threshold, "summary": None}


def payout_released(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when the review waived as many items as its input's threshold: the payout went out
    without its checks."""
    if not isinstance(result, dict):
        return 0.0
    return 1.0 if len(result.get("waived") or []) >= int(result.get("threshold", 1)) else 0.0
