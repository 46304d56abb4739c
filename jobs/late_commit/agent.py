"""A travel agent that commits to the wrong day long before anyone can tell.

The traveller asks for a Lisbon → Berlin flight on a given day, landing before noon. The agent
searches, puts a hold on one flight, adds a bag, picks an aisle seat, confirms the booking and
reports. The search also lists a much cheaper flight the next morning: holding it is the wrong
decision, and nothing after it looks at the date again. The failure only shows in the
confirmed itinerary (the scorer reads the final result). The async openai SDK, streaming. On
the recorded path the tape has 11 steps:

    0 llm → search_flights   1 tool search_flights   2 llm → hold_seat (the next-day flight)
    3 tool hold_seat   4 llm → add_bag   5 tool add_bag   6 llm → choose_seat
    7 tool choose_seat   8 llm → confirm_booking   9 tool confirm_booking   10 llm → summary
"""

from __future__ import annotations

import json
from typing import Any

import car_ray

MODEL = "gpt-4o-mini"
MAX_TURNS = 8
TRAVEL_DATE = "2025-03-14"
SYSTEM = (
    "You are a travel booking assistant. Search, hold the best flight for the traveller's "
    "request, add the bags and seat they asked for, confirm the booking and summarise it."
)

FLIGHTS: dict[str, dict[str, Any]] = {
    "TP540": {"date": "2025-03-14", "departs": "06:10", "arrives": "10:05", "eur": 189.0},
    "LH1167": {"date": "2025-03-14", "departs": "09:30", "arrives": "13:40", "eur": 142.0},
    "FR8431": {"date": "2025-03-15", "departs": "06:00", "arrives": "09:50", "eur": 61.0},
}
SEATS = {"aisle": "14C", "window": "14A"}


def search_flights(origin: str, destination: str, date: str) -> dict[str, Any]:
    """Flights on the day and, as "flexible dates", the cheapest the day after."""
    options = [
        {"flight": code, **info}
        for code, info in FLIGHTS.items()
        if info["date"] == date or info["eur"] < 100
    ]
    return {"origin": origin, "destination": destination, "options": options}


def hold_seat(flight: str) -> dict[str, Any]:
    return {"hold_id": f"H-{flight}", "flight": flight, **FLIGHTS[flight]}


def add_bag(hold_id: str, bags: int) -> dict[str, Any]:
    return {"hold_id": hold_id, "bags": bags, "bag_fee_eur": 35.0 * bags}


def choose_seat(hold_id: str, preference: str) -> dict[str, Any]:
    return {"hold_id": hold_id, "seat": SEATS[preference]}


def confirm_booking(hold_id: str) -> dict[str, Any]:
    flight = hold_id.removeprefix("H-")
    return {"booking": f"PNR-{flight}", "flight": flight, **FLIGHTS[flight]}


TOOL_FUNCTIONS = {
    "search_flights": search_flights,
    "hold_seat": hold_seat,
    "add_bag": add_bag,
    "choose_seat": choose_seat,
    "confirm_booking": confirm_booking,
}
PARAMETERS: dict[str, dict[str, Any]] = {
    "search_flights": {
        "origin": {"type": "string"},
        "destination": {"type": "string"},
        "date": {"type": "string"},
    },
    "hold_seat": {"flight": {"type": "string"}},
    "add_bag": {"hold_id": {"type": "string"}, "bags": {"type": "integer"}},
    "choose_seat": {"hold_id": {"type": "string"}, "preference": {"type": "string"}},
    "confirm_booking": {"hold_id": {"type": "string"}},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }
    for name, props in PARAMETERS.items()
]


async def _turn(client: Any, messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    """One streamed completion: its text and its tool calls, assembled from the deltas."""
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, calls = "", {}
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    return text, [calls[i] for i in sorted(calls)]


async def booking_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    client = ctx.async_openai()
    trip = ctx.input
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": trip["request"]},
    ]
    itinerary: dict[str, Any] | None = None
    for _turn_index in range(MAX_TURNS):
        text, calls = await _turn(client, messages)
        if not calls:
            return {"summary": text, "itinerary": itinerary}
        messages.append(
            {
                "role": "assistant",
                "content": text or None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ],
            }
        )
        for call in calls:
            arguments = json.loads(call["arguments"])
            output = ctx.tool(call["name"], TOOL_FUNCTIONS[call["name"]], **arguments)
            if call["name"] == "confirm_booking":
                itinerary = output
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(output)}
            )
    return {"summary": None, "itinerary": itinerary}


def wrong_day(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when the confirmed itinerary flies on another day than the traveller asked for
    (or nothing was confirmed at all)."""
    itinerary = result.get("itinerary") if isinstance(result, dict) else None
    if not itinerary:
        return 1.0
    return 1.0 if itinerary["date"] != TRAVEL_DATE else 0.0
