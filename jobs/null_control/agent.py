"""A negative control: a shipment that was late before the agent started.

A holiday order was placed after the carrier's last guaranteed pickup, yet promised for the
next day. The agent looks up the shipping options, books the fastest and returns the booking
(no closing model call). Every model step is a point mass and every option lands after the
promised date: the bad outcome is baked into the input, and no step may be blamed. The async
anthropic SDK, streaming. On the recorded path the tape has 4 steps:

    0 llm → get_shipping_options   1 tool get_shipping_options
    2 llm → book_shipment (overnight, the fastest)   3 tool book_shipment
"""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import car_ray

if TYPE_CHECKING:  # annotations only: the SDK's types cost ~1.5 s to import
    from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam, ToolUseBlockParam

MODEL = "claude-haiku-4-5"
MAX_TOKENS = 1024
MAX_TURNS = 4
SYSTEM = (
    "You are a fulfilment agent. Look up the shipping options for the order and book the "
    "fastest one with book_shipment."
)
LAST_PICKUP = datetime(2025, 12, 23, 12, 0)
NO_PICKUP_DAYS = {date(2025, 12, 24), date(2025, 12, 25)}
TRANSIT_DAYS = {"overnight": 1, "two_day": 2, "ground": 4}


def _first_pickup(placed_at: str) -> date:
    placed = datetime.fromisoformat(placed_at)
    day = placed.date() if placed <= LAST_PICKUP else placed.date() + timedelta(days=1)
    while day in NO_PICKUP_DAYS:
        day += timedelta(days=1)
    return day


def get_shipping_options(order_id: str, placed_at: str) -> dict[str, Any]:
    pickup = _first_pickup(placed_at)
    options = [
        {"service": service, "eta": (pickup + timedelta(days=days)).isoformat()}
        for service, days in TRANSIT_DAYS.items()
    ]
    return {"order_id": order_id, "pickup": pickup.isoformat(), "options": options}


def book_shipment(order_id: str, placed_at: str, service: str) -> dict[str, Any]:
    eta = _first_pickup(placed_at) + timedelta(days=TRANSIT_DAYS[service])
    return {
        "order_id": order_id,
        "service": service,
        "tracking": "1Z999AA1",
        "eta": eta.isoformat(),
    }


def _schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


TOOLS: list[ToolParam] = [
    {
        "name": "get_shipping_options",
        "description": "Carrier services for an order, with their delivery estimates.",
        "input_schema": _schema(order_id={"type": "string"}, placed_at={"type": "string"}),
    },
    {
        "name": "book_shipment",
        "description": "Book a carrier service for the order.",
        "input_schema": _schema(
            order_id={"type": "string"}, placed_at={"type": "string"}, service={"type": "string"}
        ),
    },
]
TOOL_FUNCTIONS = {"get_shipping_options": get_shipping_options, "book_shipment": book_shipment}


async def fulfilment_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    client = ctx.async_anthropic()
    order = ctx.input
    messages: list[MessageParam] = [
        {
            "role": "user",
            "content": (
                f"Ship order {order['order_id']} (placed {order['placed_at']}); the customer "
                f"was promised delivery by {order['promised_by']}."
            ),
        }
    ]
    for _turn in range(MAX_TURNS):
        async with client.messages.stream(
            model=MODEL, max_tokens=MAX_TOKENS, system=SYSTEM, messages=messages, tools=TOOLS
        ) as stream:
            message = await stream.get_final_message()
        calls: list[ToolUseBlockParam] = [
            {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input}
            for b in message.content
            if b.type == "tool_use"
        ]
        if not calls:
            return {"order_id": order["order_id"], "promised_by": order["promised_by"]}
        messages.append({"role": "assistant", "content": calls})
        results: list[ToolResultBlockParam] = []
        for call in calls:
            output = ctx.tool(call["name"], TOOL_FUNCTIONS[call["name"]], **dict(call["input"]))
            if call["name"] == "book_shipment":
                return {**output, "promised_by": order["promised_by"]}
            results.append(
                {"type": "tool_result", "tool_use_id": call["id"], "content": json.dumps(output)}
            )
        messages.append({"role": "user", "content": results})
    return {"order_id": order["order_id"], "promised_by": order["promised_by"]}


def late_delivery(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when the booked shipment arrives after the promised date (or nothing was booked)."""
    if not isinstance(result, dict) or "eta" not in result:
        return 1.0
    return 1.0 if result["eta"] > result["promised_by"] else 0.0
